"""Errors of the mrl platform, one tree, each mapped to one gRPC status and HTTP code.

    MrlError
    ├── InvalidArgument      INVALID_ARGUMENT     400  the request is malformed; nothing was written
    ├── Unauthenticated      UNAUTHENTICATED      401  no token, or an unknown one
    ├── PermissionDenied     PERMISSION_DENIED    403  the principal may not do this
    ├── NotFound             NOT_FOUND            404
    ├── FailedPrecondition   FAILED_PRECONDITION  409  the state forbids it (a stale fencing token, a request
    │   │                                              no inventory can ever satisfy)
    │   └── LeaseLost                                  (client side) a scheduler lease expired or was revoked
    ├── ResourceExhausted    RESOURCE_EXHAUSTED   429  a rate or size limit
    ├── DeadlineExceeded     DEADLINE_EXCEEDED    504  a wait bound passed (nothing was granted)
    └── Unavailable          UNAVAILABLE          503  a backend (Redis) is down; retry

Backends' errors are mapped at the boundary (`raise Unavailable(...) from exc`); a client turns a
gRPC status back into its class with `from_rpc_error`.
"""
import grpc

__all__ = ["MrlError", "InvalidArgument", "Unauthenticated", "PermissionDenied", "NotFound",
           "FailedPrecondition", "LeaseLost", "ResourceExhausted", "DeadlineExceeded", "Unavailable",
           "from_rpc_error"]


class MrlError(Exception):
    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500
    exit_code = 2          # what the `mrl` command exits with when it stops on this error


class InvalidArgument(MrlError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class Unauthenticated(MrlError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class PermissionDenied(MrlError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class NotFound(MrlError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class FailedPrecondition(MrlError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409


class LeaseLost(FailedPrecondition):
    """A scheduler lease is gone (expired, revoked, or its fencing token is stale): stop using its devices."""


class ResourceExhausted(MrlError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429


class DeadlineExceeded(MrlError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


class Unavailable(MrlError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


_ERROR_OF = {cls.grpc_code: cls for cls in (InvalidArgument, Unauthenticated, PermissionDenied, NotFound,
                                             FailedPrecondition, ResourceExhausted, DeadlineExceeded, Unavailable)}


def from_rpc_error(exc: grpc.RpcError) -> MrlError:
    """The MrlError of a failed call's status (MrlError itself for a status with no class), with its details."""
    return _ERROR_OF.get(exc.code(), MrlError)(f"{exc.code().name}: {exc.details()}")

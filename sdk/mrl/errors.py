"""Errors of the mrl platform, one tree, each mapped to one gRPC status and HTTP code.

    MrlError
    ├── InvalidArgument      INVALID_ARGUMENT     400  the request is malformed; nothing was written
    ├── Unauthenticated      UNAUTHENTICATED      401  no token, or an unknown one
    ├── PermissionDenied     PERMISSION_DENIED    403  the principal may not do this
    ├── NotFound             NOT_FOUND            404
    ├── ResourceExhausted    RESOURCE_EXHAUSTED   429  a rate or size limit
    └── Unavailable          UNAVAILABLE          503  a backend (Redis) is down; retry

Backends' errors are mapped at the boundary (`raise Unavailable(...) from exc`).
"""
import grpc

__all__ = ["MrlError", "InvalidArgument", "Unauthenticated", "PermissionDenied", "NotFound",
           "ResourceExhausted", "Unavailable"]


class MrlError(Exception):
    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500


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


class ResourceExhausted(MrlError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429


class Unavailable(MrlError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503

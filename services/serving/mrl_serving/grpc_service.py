"""The gRPC plumbing every mrl service shares: registration, errors, auth, TLS, health, reflection.

`add_service` registers a servicer from the service's descriptor with *lenient* request
deserializers: a request that fails to parse (e.g. a text field that is not valid UTF-8)
reaches the handler as a `BadRequest` and is answered INVALID_ARGUMENT with the parser's
reason — gRPC would otherwise answer INTERNAL. Handlers raise `mrl.errors.MrlError`; the
wrapper turns it into the error's status code and message.

`follow_health` keeps the standard health service truthful: NOT_SERVING while a backend the
service cannot work without (Redis) does not answer, SERVING again once it does.
"""
import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from mrl.auth import is_loopback
from mrl.errors import MrlError

__all__ = ["BadRequest", "add_service", "authorization", "bind", "add_health_and_reflection", "follow_health",
           "LIVENESS"]

log = logging.getLogger(__name__)


class BadRequest:
    """What a request that could not be decoded becomes."""

    def __init__(self, reason: str):
        self.reason = reason


def _lenient(cls):
    def deserialize(data: bytes):
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return BadRequest(f"could not decode {cls.DESCRIPTOR.full_name}: {exc} "
                              f"(text fields must be valid UTF-8)")
    return deserialize


async def _abort_on(error, context):
    if isinstance(error, BadRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.reason)
    await context.abort(error.grpc_code, str(error))


def _guard_unary(impl):
    @functools.wraps(impl)
    async def handler(request, context):
        if isinstance(request, BadRequest):
            await _abort_on(request, context)
        try:
            return await impl(request, context)
        except MrlError as exc:
            await _abort_on(exc, context)
    return handler


def _guard_stream(impl):
    @functools.wraps(impl)
    async def handler(request, context):
        if isinstance(request, BadRequest):
            await _abort_on(request, context)
        try:
            async for item in impl(request, context):
                yield item
        except MrlError as exc:
            await _abort_on(exc, context)
    return handler


def _serialize(message) -> bytes:
    """Any message: a handler may answer with a wire twin of its response type (mrl_exchange.wire)."""
    return message.SerializeToString()


def add_service(server: grpc.aio.Server, service, servicer) -> None:
    """Register every method of `service` (a ServiceDescriptor) on `servicer`'s coroutines."""
    handlers = {}
    for method in service.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        impl = getattr(servicer, method.name)
        if method.server_streaming:
            make, guarded = grpc.unary_stream_rpc_method_handler, _guard_stream(impl)
        else:
            make, guarded = grpc.unary_unary_rpc_method_handler, _guard_unary(impl)
        handlers[method.name] = make(guarded, request_deserializer=_lenient(request_cls),
                                     response_serializer=_serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value
    return None


def bind(server: grpc.aio.Server, host: str, port: int, auth_enabled: bool,
         tls_cert=None, tls_key=None) -> tuple[str, int]:
    """Bind `host:port` (port 0: a free one); with auth off, force loopback. Returns (host, port)."""
    if not auth_enabled and not is_loopback(host):
        log.warning("no tokens configured (auth_file unset): serving on 127.0.0.1 only, not %s; "
                    "configure principals to serve other hosts", host)
        host = "127.0.0.1"
    elif not auth_enabled:
        log.warning("no tokens configured: authentication is off, serving on loopback %s only", host)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls_cert and tls_key:
        creds = grpc.ssl_server_credentials([(open(tls_key, "rb").read(), open(tls_cert, "rb").read())])
        bound = server.add_secure_port(address, creds)
    elif tls_cert or tls_key:
        raise ValueError("TLS needs both tls_cert and tls_key")
    else:
        bound = server.add_insecure_port(address)
    return host, bound


LIVENESS = "liveness"    # the gRPC health service name of liveness: SERVING while the server answers at all


async def add_health_and_reflection(server: grpc.aio.Server, service_names: list[str]) -> HealthServicer:
    """gRPC health for each service and the server ("": readiness, which follow_health may change) and for
    LIVENESS (always SERVING: a server that answers is alive, whatever its backend does), and reflection."""
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    for name in (*service_names, "", LIVENESS):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, reflection.SERVICE_NAME, "grpc.health.v1.Health"], server)
    return health


HEALTH_INTERVAL_S = 0.5  # how often the backend is checked
HEALTH_TIMEOUT_S = 2.0   # a check that takes longer counts as down (a hung Redis answers nothing)


async def follow_health(health: HealthServicer, service_names: list[str],
                        check: Callable[[], Awaitable[str | None]]) -> None:
    """Set every service's health (and the server's, "") from `check()` — None: SERVING, else the reason it is
    NOT_SERVING — every HEALTH_INTERVAL_S, logging each change (LIVENESS stays SERVING). Runs until cancelled."""
    serving = True
    while True:
        try:
            reason = await asyncio.wait_for(check(), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            reason = f"the backend did not answer within {HEALTH_TIMEOUT_S} s"
        if (reason is None) != serving:
            serving = reason is None
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", *service_names):
                await health.set(name, status)
            if serving:
                log.warning("health: SERVING again")
            else:
                log.error("health: NOT_SERVING: %s", reason)
        await asyncio.sleep(HEALTH_INTERVAL_S)

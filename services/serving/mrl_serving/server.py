"""Hosting a service: gRPC (grpc.aio) and a REST app (FastAPI on uvicorn) on one event loop.

Every mrl service is a core plus two thin transports; this module is what they share:

    server = ServiceServer("exchange", settings)                 # settings: ServerSettings
    app, principal, admin = rest_app("mrl exchange admin", ..., server.auth, server.limiter, registry, ready)
    @app.get("/v1/runs", dependencies=[Depends(admin)])          # checked before the body is read
    await server.start([(SERVICE_DESCRIPTOR, servicer)], app)   # binds, health, reflection
    ...                                                          # server.port, server.admin_port
    await server.stop()

`run_until_signal(server)` prints the one JSON "ready" line a parent process reads (ports) and
waits for SIGINT/SIGTERM; `serve_service` is a service's whole `mrl ... serve` (logging, the embedded
Redis when none is configured, run until a signal). With auth off, both transports bind loopback only
(see grpc_service.bind).

REST errors have one body, ErrorBody ({"error": "InvalidArgument", "detail": "..."}), FastAPI's own
422 for a body or parameter that does not match its declared type aside; /openapi.json declares bearer
auth and these answers on every authenticated route (`proto_json` types a protobuf-JSON route).
"""
import asyncio
import contextlib
import inspect
import json
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
import uvicorn
from fastapi import Depends, FastAPI, Request, Security, params
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from mrl.auth import Authenticator, Principal
from mrl.experience import validate_name
from mrl.v1 import identity_pb2 as ipb
from mrl_serving.embedded_redis import EmbeddedRedis
from mrl.errors import MrlError, Unauthenticated, Unavailable
from mrl_serving.grpc_service import add_health_and_reflection, add_service, authorization, bind, follow_health
from mrl_serving.ratelimit import LocalRateLimiter, RateLimiter, RedisRateLimiter
from mrl_serving.settings import ServerSettings

__all__ = ["ErrorBody", "ServiceServer", "grpc_principal", "who_am_i", "message_schema", "proto_json", "rest_app",
           "run_until_signal", "serve_service"]

log = logging.getLogger("mrl_serving.server")


class ServiceServer:
    def __init__(self, name: str, settings: ServerSettings, redis=None, limits_prefix: str = ""):
        """With `redis` (the service's Redis client) the rate limits live there under `limits_prefix`, shared by
        the service's replicas (mrl_serving.ratelimit); without, in this process."""
        self.name, self.settings = name, settings
        self.auth = Authenticator.from_file(settings.auth_file)
        rate, burst = settings.rate_limit_per_s, settings.rate_limit_burst
        self.limiter = LocalRateLimiter(rate, burst) if redis is None else \
            RedisRateLimiter(redis, limits_prefix, rate, burst)
        self.grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", settings.max_message_bytes),
                                             ("grpc.max_send_message_length", settings.max_message_bytes),
                                             # a vanished client's streams end within ~40 s
                                             ("grpc.keepalive_time_ms", 30_000),
                                             ("grpc.keepalive_timeout_ms", 10_000),
                                             ("grpc.http2.min_ping_interval_without_data_ms", 10_000)])
        self.port = 0
        self.admin_port = 0
        self._uvicorn: uvicorn.Server | None = None
        self._uvicorn_task: asyncio.Task | None = None
        self._health_task: asyncio.Task | None = None

    async def start(self, services: list[tuple], app: FastAPI,
                    ready: Callable[[], Awaitable[str | None]] | None = None) -> None:
        """Serve each (ServiceDescriptor, servicer) over gRPC and `app` over HTTP; with `ready` (None while the
        service's backend answers, else why not: what rest_app's /readyz asks too), gRPC health of the services and
        of "" follows it (SERVING / NOT_SERVING); that of LIVENESS stays SERVING."""
        s = self.settings
        for descriptor, servicer in services:
            add_service(self.grpc, descriptor, servicer)
        names = [d.full_name for d, _ in services]
        health = await add_health_and_reflection(self.grpc, names)
        if ready is not None:
            self._health_task = asyncio.create_task(follow_health(health, names, ready))
        host, self.port = bind(self.grpc, s.host, s.port, self.auth.enabled, s.tls_cert, s.tls_key)
        await self.grpc.start()
        tls = {"ssl_certfile": str(s.tls_cert), "ssl_keyfile": str(s.tls_key)} if s.tls_cert else {}
        self._uvicorn = uvicorn.Server(uvicorn.Config(app, host=host, port=s.admin_port, log_level="warning",
                                                      lifespan="off", **tls))
        self._uvicorn_task = asyncio.create_task(self._uvicorn.serve())
        while not self._uvicorn.started:
            if self._uvicorn_task.done():
                self._uvicorn_task.result()
                raise RuntimeError(f"the REST server could not bind {host}:{s.admin_port}")
            await asyncio.sleep(0.01)
        self.admin_port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        log.info("%s serving gRPC on %s:%d (%s), REST on %s://%s:%d, auth %s", self.name, host, self.port,
                 "TLS" if s.tls_cert else "plaintext", "https" if s.tls_cert else "http", host, self.admin_port,
                 "on" if self.auth.enabled else "OFF")

    async def stop(self, grace_s: float = 2.0) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await self.grpc.stop(grace_s)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn_task


async def grpc_principal(auth: Authenticator, limiter: RateLimiter, context,
                         cost: float = 1.0) -> Principal:
    """The caller of a gRPC call, charged `cost` against its rate limit. Failed attempts spend a budget of
    their own per peer host, so guessing tokens is throttled too."""
    try:
        principal = auth.authenticate(authorization(context))
    except Unauthenticated:
        await limiter.take(f"unauthenticated@{_host(context.peer())}")
        raise
    await limiter.take(principal.name, cost)
    return principal


def who_am_i(principal: Principal, auth: Authenticator, request: ipb.WhoAmIRequest, service: str
             ) -> ipb.WhoAmIResponse:
    """The connection check (identity.proto): the principal, and PermissionDenied when it is outside the request's
    run or may not act as its policy, as the service's real calls would refuse it."""
    run_id = validate_name("run_id", request.run_id) if request.run_id else None
    if run_id is not None:
        principal.require_run(run_id)
    if request.policy:
        principal.require_policy(validate_name("policy", request.policy), run_id, "act")
    return ipb.WhoAmIResponse(principal=principal.name, role=principal.role, policy=principal.policy or "",
                              auth=auth.enabled, service=service)


def _host(peer: str) -> str:
    """'ipv4:127.0.0.1:5555' -> 'ipv4:127.0.0.1'; 'ipv6:[::1]:5555' -> 'ipv6:[::1]'."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class ErrorBody(BaseModel):
    """The body of an error answer; its status is the HTTP twin of the gRPC code (mrl.errors)."""
    error: str = Field(description="The error's class in mrl.errors: InvalidArgument, Unauthenticated, "
                                   "PermissionDenied, NotFound, FailedPrecondition, ResourceExhausted, Unavailable")
    detail: str = Field(description="What went wrong, and what to do about it.")


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


AUTH_ERRORS = {401: _error("No token, a malformed one or an unknown one (`authorization: Bearer <token>`)."),
               403: _error("The principal may not do this: an admin's route, or another policy's or run's."),
               429: _error("The principal's rate limit (MRL_RATE_LIMIT_PER_S, MRL_RATE_LIMIT_BURST): retry later.")}
INPUT_ERRORS = {400: _error("Bad input, named in `detail`; nothing was changed.")}


def rest_app(title: str, description: str, auth: Authenticator, limiter: RateLimiter,
             registry: CollectorRegistry, ready: Callable[[], Awaitable[str | None]]):
    """A FastAPI app with /healthz (liveness: 200 while the process answers), /readyz (503 with `ready()`'s
    reason when not None: a service whose backend is down is alive but not ready), /metrics and MrlError → HTTP
    status mapping. Returns (app, principal dependency, admin dependency).

    A route that depends on `principal` or `admin` (in `dependencies=` or as a parameter's default) checks
    the caller before FastAPI reads the body, and its OpenAPI operation lists bearer auth and ErrorBody
    answers: 401, 403, 429, and 400 when it takes parameters or a body."""
    app = FastAPI(title=title, version="1", description=description)
    bearer = HTTPBearer(auto_error=False, description="A principal's token (`mrl token new`); with no principals "
                                                      "configured, auth is off and none is needed.")

    @app.exception_handler(MrlError)
    async def _mrl_error(request, exc: MrlError):
        return JSONResponse(status_code=exc.http_status, content={"error": type(exc).__name__, "detail": str(exc)},
                            headers={"www-authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None)

    async def authenticate(request: Request) -> Principal:
        """The caller, charged against its rate limit once per request however often it is asked for."""
        who = getattr(request.state, "principal", None)
        if who is None:
            try:
                who = auth.authenticate(request.headers.get("authorization"))
            except Unauthenticated:
                # failed attempts spend a budget of their own per client host, as over gRPC
                await limiter.take(f"unauthenticated@{request.client.host if request.client else '?'}")
                raise
            await limiter.take(who.name)
            request.state.principal = who
        return who

    async def principal(request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
                        ) -> Principal:
        return await authenticate(request)

    async def admin(request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
                    ) -> Principal:
        who = await authenticate(request)
        who.require_admin()
        return who

    class AuthenticatedFirst(APIRoute):
        """FastAPI reads and parses a body before it solves the dependencies: a route that depends on
        `principal` or `admin` runs that check first, so a bad body never answers an unauthorized caller."""

        def __init__(self, path: str, endpoint, *, responses: dict | None = None, **kwargs):
            signature = inspect.signature(endpoint).parameters.values()
            declared = [*(kwargs.get("dependencies") or ()), *(p.default for p in signature)]
            calls = {d.dependency for d in declared if isinstance(d, params.Depends)}
            self.check = admin if admin in calls else principal if principal in calls else None
            if self.check is not None:
                takes_input = "requestBody" in (kwargs.get("openapi_extra") or {}) or any(
                    p.annotation is not Request and not isinstance(p.default, params.Depends) for p in signature)
                responses = {**AUTH_ERRORS, **(INPUT_ERRORS if takes_input else {}), **(responses or {})}
            super().__init__(path, endpoint, responses=responses, **kwargs)

        def get_route_handler(self):
            handler = super().get_route_handler()
            if self.check is None:
                return handler

            async def checked_first(request: Request):
                await self.check(request, None)
                return await handler(request)
            return checked_first

    app.router.route_class = AuthenticatedFirst

    async def require_ready() -> None:
        reason = await ready()
        if reason is not None:
            raise Unavailable(reason)      # 503 with the ErrorBody every other error has

    @app.get("/healthz")
    async def healthz():        # liveness: the process answers (a Redis outage is /readyz's, not a reason to restart)
        return {"status": "ok"}

    @app.get("/readyz", dependencies=[Depends(require_ready)])
    async def readyz():
        return {"status": "ready"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app, principal, admin


_SCALARS = {FieldDescriptor.TYPE_DOUBLE: {"type": "number", "format": "double"},
            FieldDescriptor.TYPE_FLOAT: {"type": "number", "format": "float"},
            FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
            FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
            FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
            FieldDescriptor.TYPE_UINT32: {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
            FieldDescriptor.TYPE_FIXED32: {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
            FieldDescriptor.TYPE_INT64: {"type": "integer", "format": "int64"},
            FieldDescriptor.TYPE_SINT64: {"type": "integer", "format": "int64"},
            FieldDescriptor.TYPE_SFIXED64: {"type": "integer", "format": "int64"},
            FieldDescriptor.TYPE_UINT64: {"type": "integer", "minimum": 0},
            FieldDescriptor.TYPE_FIXED64: {"type": "integer", "minimum": 0},
            FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
            FieldDescriptor.TYPE_STRING: {"type": "string"},
            FieldDescriptor.TYPE_BYTES: {"type": "string", "format": "byte"}}


def message_schema(message: Descriptor) -> dict:
    """The JSON Schema of a protobuf message's JSON form, with the .proto's field names (what the REST twins
    answer with; they read lowerCamelCase names and enum numbers too)."""
    def field(f: FieldDescriptor) -> dict:
        if f.message_type is not None:
            schema = message_schema(f.message_type)
        elif f.enum_type is not None:
            schema = {"type": "string", "enum": [v.name for v in f.enum_type.values]}
        else:
            schema = _SCALARS[f.type]
        return {"type": "array", "items": schema} if f.is_repeated else schema
    return {"title": message.name, "type": "object", "properties": {f.name: field(f) for f in message.fields}}


def proto_json(request_cls=None, response_cls=None) -> dict:
    """Route keyword arguments that document a route reading its body itself as `request_cls` and answering
    `response_cls`, both protobuf messages in their JSON form."""
    def content(cls) -> dict:
        return {"application/json": {"schema": message_schema(cls.DESCRIPTOR)}}
    kwargs = {}
    if request_cls is not None:
        kwargs["openapi_extra"] = {"requestBody": {"required": True, "content": content(request_cls)}}
    if response_cls is not None:
        kwargs["responses"] = {200: {"description": f"A {response_cls.DESCRIPTOR.name}.",
                                     "content": content(response_cls)}}
    return kwargs


async def run_until_signal(server, ready_name: str) -> None:
    """Print the ready line, wait for SIGINT/SIGTERM, stop `server` (anything with stop())."""
    # One JSON line on stdout tells a parent process (mrl up, the demo, a benchmark) where we listen.
    print(json.dumps({"ready": ready_name, "grpc_port": server.port, "admin_port": server.admin_port}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s shutting down", ready_name)
    await server.stop()


def serve_service(name: str, settings: ServerSettings, make_server: Callable[[str | None], ServiceServer]) -> None:
    """`mrl <service> serve`: log at settings.log_level; when the service needs Redis and MRL_REDIS_URL is
    unset, start an embedded redis-server under data_dir (started again from its AOF if it dies, see
    embedded_redis); run make_server(redis_url) until SIGINT/SIGTERM."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run(url: str | None) -> None:
        server = make_server(url)  # on the running loop: grpc.aio binds to it
        await server.start()
        await run_until_signal(server, name)

    with contextlib.ExitStack() as stack:
        url = settings.redis_url
        if settings.needs_redis and not url:
            url = stack.enter_context(EmbeddedRedis(settings.data_dir / "redis"))
            log.info("MRL_REDIS_URL unset: started an embedded redis-server at %s", url)
        asyncio.run(run(url))

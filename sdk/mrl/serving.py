"""Hosting a service: gRPC (grpc.aio) and a REST app (FastAPI on uvicorn) on one event loop.

Every mrl service is a core plus two thin transports; this module is what they share:

    server = ServiceServer("exchange", settings, auth)            # settings: ServerSettings
    app, require = rest_app("mrl exchange admin", ..., server.auth, server.limiter, registry, ready)
    await server.start([(SERVICE_DESCRIPTOR, servicer)], app)   # binds, health, reflection
    ...                                                          # server.port, server.admin_port
    await server.stop()

`run_until_signal(server)` prints the one JSON "ready" line a parent process reads (ports) and
waits for SIGINT/SIGTERM; `serve_service` is a service's whole `mrl ... serve` (logging, the embedded
Redis when none is configured, run until a signal). With auth off, both transports bind loopback only
(see grpc_service.bind).
"""
import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
import uvicorn
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from mrl.auth import Authenticator, Principal
from mrl.embedded_redis import EmbeddedRedis
from mrl.errors import MrlError, Unauthenticated
from mrl.grpc_service import add_health_and_reflection, add_service, authorization, bind
from mrl.ratelimit import RateLimiter
from mrl.settings import ServerSettings

__all__ = ["ServiceServer", "grpc_principal", "rest_app", "run_until_signal", "serve_service"]

log = logging.getLogger("mrl.serving")


class ServiceServer:
    def __init__(self, name: str, settings: ServerSettings):
        self.name, self.settings = name, settings
        self.auth = Authenticator.from_file(settings.auth_file)
        self.limiter = RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)
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

    async def start(self, services: list[tuple], app: FastAPI) -> None:
        """Serve each (ServiceDescriptor, servicer) over gRPC and `app` over HTTP."""
        s = self.settings
        for descriptor, servicer in services:
            add_service(self.grpc, descriptor, servicer)
        await add_health_and_reflection(self.grpc, [d.full_name for d, _ in services])
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
        log.info("%s serving gRPC on %s:%d (%s), REST on http://%s:%d, auth %s", self.name, host, self.port,
                 "TLS" if s.tls_cert else "plaintext", host, self.admin_port, "on" if self.auth.enabled else "OFF")

    async def stop(self, grace_s: float = 2.0) -> None:
        await self.grpc.stop(grace_s)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn_task


def grpc_principal(auth: Authenticator, limiter: RateLimiter, context, cost: float = 1.0) -> Principal:
    """The caller of a gRPC call, charged `cost` against its rate limit. Failed attempts spend a budget of
    their own per peer host, so guessing tokens is throttled too."""
    try:
        principal = auth.authenticate(authorization(context))
    except Unauthenticated:
        limiter.take(f"unauthenticated@{_host(context.peer())}")
        raise
    limiter.take(principal.name, cost)
    return principal


def _host(peer: str) -> str:
    """'ipv4:127.0.0.1:5555' -> 'ipv4:127.0.0.1'; 'ipv6:[::1]:5555' -> 'ipv6:[::1]'."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def rest_app(title: str, description: str, auth: Authenticator, limiter: RateLimiter,
             registry: CollectorRegistry, ready: Callable[[], Awaitable[str | None]]):
    """A FastAPI app with /healthz, /readyz (503 with `ready()`'s reason when not None), /metrics and
    MrlError → HTTP status mapping. Returns (app, principal dependency, admin dependency)."""
    app = FastAPI(title=title, version="1", description=description)

    @app.exception_handler(MrlError)
    async def _mrl_error(request, exc: MrlError):
        return JSONResponse(status_code=exc.http_status, content={"error": type(exc).__name__, "detail": str(exc)})

    def principal(request: Request, authorization: str | None = Header(None, description="Bearer <token>")
                  ) -> Principal:
        try:
            who = auth.authenticate(authorization)
        except Unauthenticated:
            # failed attempts spend a budget of their own per client host, as over gRPC
            limiter.take(f"unauthenticated@{request.client.host if request.client else '?'}")
            raise
        limiter.take(who.name)
        return who

    def admin(request: Request, authorization: str | None = Header(None, description="Bearer <admin token>")
              ) -> Principal:
        who = principal(request, authorization)
        who.require_admin()
        return who

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        reason = await ready()
        if reason is not None:
            raise HTTPException(503, reason)
        return {"status": "ready"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app, principal, admin


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


def serve_service(name: str, settings: ServerSettings, make_server: Callable[[str | None], ServiceServer],
                  needs_redis: bool = True) -> None:
    """`mrl <service> serve`: log at settings.log_level; when the service needs Redis and MRL_REDIS_URL is
    unset, start an embedded redis-server under data_dir; run make_server(redis_url) until SIGINT/SIGTERM."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run(url: str | None) -> None:
        server = make_server(url)  # on the running loop: grpc.aio binds to it
        await server.start()
        await run_until_signal(server, name)

    with contextlib.ExitStack() as stack:
        url = settings.redis_url
        if needs_redis and not url:
            url = stack.enter_context(EmbeddedRedis(settings.data_dir / "redis"))
            log.info("MRL_REDIS_URL unset: started an embedded redis-server at %s", url)
        asyncio.run(run(url))

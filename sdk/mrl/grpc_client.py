"""The client-side gRPC plumbing every mrl client shares: channels, bearer tokens, retries, errors.

    connection = Connection("exchange", "host:50051", token, tls_root_cert, max_message_bytes)
    reply = call(stub.Method, request, connection, Backoff(), retry=True)   # blocking clients

A call that fails raises the `mrl.errors` class of its status (`Connection.error`: an auth or connection error
names the service, its address, plaintext or TLS and where the token came from); with
`retry=True` an UNAVAILABLE call is tried again after each delay of the Backoff, for idempotent
calls only.
"""
import random
import time

import grpc

from mrl import errors
from mrl.precedence import resolve
from mrl.connection import check as check_connection

__all__ = ["Backoff", "BlockingClient", "Connection", "TOKEN_ENV", "TLS_ENV", "call", "retry_delay"]


class Backoff:
    """Delays base·2^n (capped at `cap`, with ±50% jitter) for at most `attempts` tries (None: no limit) and,
    with `budget_s`, until that many seconds have passed since the first delay was asked for (the last delay is
    cut to end there, so a call is tried once more at the budget's end)."""

    def __init__(self, base_s: float = 0.1, cap_s: float = 5.0, attempts: int | None = 6,
                 budget_s: float | None = None):
        self.base_s, self.cap_s, self.attempts, self.budget_s = base_s, cap_s, attempts, budget_s

    def delays(self):
        end = None if self.budget_s is None else time.monotonic() + self.budget_s
        n = 0
        while self.attempts is None or n < self.attempts - 1:
            delay = min(self.cap_s, self.base_s * 2 ** n) * random.uniform(0.5, 1.5)
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return
                delay = min(delay, left)
            yield delay
            n += 1


TOKEN_ENV = "MRL_TOKEN"
TLS_ENV = "MRL_TLS_ROOT_CERT"


class Connection:
    """A channel to `target`, the metadata carrying the bearer token, and where each came from, for the errors.

    The token is the `token` argument, or else the environment's MRL_TOKEN (mrl.precedence); `token_source` names
    where the caller took the argument from (default: "the token argument"), and `target_source` the target's (not
    named by default). TLS when `tls_root_cert` (PEM) is given, or else when the environment names a PEM file in
    MRL_TLS_ROOT_CERT."""

    def __init__(self, service: str, target: str, token: str | None, tls_root_cert: bytes | None,
                 max_message_bytes: int, aio: bool = False, token_source: str | None = None,
                 target_source: str | None = None):
        token_setting = resolve(token, token_source or "the token argument", TOKEN_ENV)
        token = token_setting.value
        self.token_source = token_setting.source if token else None     # None: no token is sent
        cert = resolve(tls_root_cert, env=TLS_ENV)
        tls_root_cert = _read_root_cert(cert.value) if cert.source == TLS_ENV else cert.value
        self.service, self.target, self.target_source = service, target, target_source
        self.tls = tls_root_cert is not None
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes),
                   # a server back from a restart is reconnected to within 2 s (gRPC's default wait grows to 120 s)
                   ("grpc.max_reconnect_backoff_ms", 2000)]
        module = grpc.aio if aio else grpc
        self.channel = (module.secure_channel(target, grpc.ssl_channel_credentials(tls_root_cert), options)
                        if self.tls else module.insecure_channel(target, options))

    def where(self) -> str:
        token = f"token from {self.token_source}" if self.token_source else "no token sent"
        target = f"{self.target} from {self.target_source}" if self.target_source else self.target
        return f"the {self.service} at {target} ({'TLS' if self.tls else 'plaintext'}, {token})"

    def error(self, exc: grpc.RpcError, hint: str = "") -> errors.MrlError:
        """The call's `mrl.errors` class; an auth or connection error names where it went and its token's source."""
        error = errors.from_rpc_error(exc)
        if exc.code() in _ABOUT_THE_CONNECTION:
            error = type(error)(f"{self.where()}: {error}{f'; {hint}' if hint else ''}")
        return error


_ABOUT_THE_CONNECTION = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                         grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _read_root_cert(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise errors.InvalidArgument(f"{TLS_ENV} names {path!r}, which cannot be read: {exc}") from exc


def retry_delay(exc: grpc.RpcError, delays, connection: Connection) -> float:
    """The wait before trying a failed call again (UNAVAILABLE, while `delays` lasts); otherwise raises
    the call's `mrl.errors` class (Connection.error). The one retry rule of the blocking and the asyncio clients."""
    delay = next(delays, None) if exc.code() == grpc.StatusCode.UNAVAILABLE else None
    if delay is None:
        raise connection.error(exc) from exc
    return delay


def call(method, request, connection: Connection, backoff: Backoff, retry: bool = False,
         timeout: float | None = None):
    """A blocking unary call; with `retry`, UNAVAILABLE is retried along `backoff` (idempotent calls only)."""
    delays = backoff.delays() if retry else iter(())
    while True:
        try:
            return method(request, metadata=connection.metadata, timeout=timeout)
        except grpc.RpcError as exc:
            time.sleep(retry_delay(exc, delays, connection))


class BlockingClient:
    """What every blocking mrl client shares: `self._connection` (its channel closed by `close()` or the with-block)
    and the connection check through `self._stub`."""

    _connection: Connection

    def check(self, run_id: str = "", policy: str = ""):
        """The connection check (mrl.connection): one WhoAmI round trip; the principal, or the error saying what
        to fix."""
        return check_connection(self._connection, self._stub.WhoAmI, run_id, policy)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._connection.channel.close()

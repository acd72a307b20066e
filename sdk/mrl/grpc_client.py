"""The client-side gRPC plumbing every mrl client shares: channels, bearer tokens, retries, errors.

    channel, metadata = open_channel("host:50051", token, tls_root_cert, max_message_bytes)
    reply = call(stub.Method, request, metadata, Backoff(), retry=True)   # blocking clients

A call that fails raises the `mrl.errors` class of its status (`errors.from_rpc_error`); with
`retry=True` an UNAVAILABLE call is tried again after each delay of the Backoff, for idempotent
calls only.
"""
import os
import random
import time

import grpc

from mrl import errors

__all__ = ["Backoff", "BlockingClient", "open_channel", "call", "retry_delay"]


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


def open_channel(target: str, token: str | None, tls_root_cert: bytes | None, max_message_bytes: int,
                 aio: bool = False):
    """A channel to `target` and the metadata carrying the bearer token. TLS when `tls_root_cert` (PEM) is given,
    or else when the environment names a PEM file in MRL_TLS_ROOT_CERT (how a trainer in a container gets it)."""
    if tls_root_cert is None and os.environ.get("MRL_TLS_ROOT_CERT"):
        tls_root_cert = _read_root_cert(os.environ["MRL_TLS_ROOT_CERT"])
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               # a server back from a restart is reconnected to within 2 s (gRPC's default wait grows to 120 s)
               ("grpc.max_reconnect_backoff_ms", 2000)]
    module = grpc.aio if aio else grpc
    if tls_root_cert is not None:
        return module.secure_channel(target, grpc.ssl_channel_credentials(tls_root_cert), options), metadata
    return module.insecure_channel(target, options), metadata


def _read_root_cert(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise errors.InvalidArgument(f"MRL_TLS_ROOT_CERT names {path!r}, which cannot be read: {exc}") from exc


def retry_delay(exc: grpc.RpcError, delays) -> float:
    """The wait before trying a failed call again (UNAVAILABLE, while `delays` lasts); otherwise raises
    the call's `mrl.errors` class. The one retry rule of the blocking and the asyncio clients."""
    delay = next(delays, None) if exc.code() == grpc.StatusCode.UNAVAILABLE else None
    if delay is None:
        raise errors.from_rpc_error(exc) from exc
    return delay


def call(method, request, metadata, backoff: Backoff, retry: bool = False, timeout: float | None = None):
    """A blocking unary call; with `retry`, UNAVAILABLE is retried along `backoff` (idempotent calls only)."""
    delays = backoff.delays() if retry else iter(())
    while True:
        try:
            return method(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as exc:
            time.sleep(retry_delay(exc, delays))


class BlockingClient:
    """What every blocking mrl client shares: `self._channel`, closed by `close()` or the with-block."""

    _channel: grpc.Channel

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._channel.close()

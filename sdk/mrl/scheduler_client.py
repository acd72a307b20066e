"""Client of the GPU lease scheduler (MWRA), and the trainer-side lease helper.

    scheduler = SchedulerClient("localhost:50053", token=TOKEN, run_id="run-7", policy="qwen-0.5b")
    with scheduler.lease(devices=1, phase="rollout") as lease:
        generate(...)                    # CUDA_VISIBLE_DEVICES names the leased GPUs meanwhile
        lease.check()                    # raises LeaseLost once the lease is gone (cheap; optional)

    with scheduler.lease(devices=2, device_ids=["node-0/gpu-2", "node-0/gpu-3"]) as lease:   # pinned
        ...

`lease()` acquires all the devices at once (waiting in fair-share order), renews the lease in a
background thread every TTL/3, sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES to the
leased indexes for the block (and restores them after), and releases the lease at the end.

When the lease is lost (it expired because renewals failed until its expiry, an admin revoked
it, or its fencing token is stale) the work is stopped:
  - `lease.lost` (a threading.Event) is set and `lease.lost_reason` says why;
  - with on_lost="interrupt" (the default) LeaseLost is raised inside the with-block, in the
    thread that entered it, at its next Python bytecode (a running C call — a CUDA kernel, a
    blocking read — finishes first); with on_lost="flag" nothing is raised there;
  - in every mode, leaving the block raises LeaseLost if it had not been raised already.
The environment variables only affect CUDA initialised after they are set: enter the block
before the first CUDA call of this process, or pass `lease.cuda_visible_devices` to a child.
"""
import ctypes
import os
import socket
import threading
import time
from collections.abc import Sequence

import grpc

from mrl import errors
from mrl.grpc_client import Backoff, BlockingClient, Connection, call
from mrl.v1 import scheduler_pb2 as spb
from mrl.v1 import scheduler_pb2_grpc

__all__ = ["SchedulerClient", "HeldLease", "LeaseWatch"]

_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
DEFAULT_TTL_S = 30.0


class SchedulerClient(BlockingClient):
    def __init__(self, target: str, token: str | None = None, *, run_id: str = "default", policy: str = "default",
                 worker: str | None = None, tls_root_cert: bytes | None = None, max_message_bytes: int = 4 << 20,
                 backoff: Backoff | None = None, token_source: str | None = None,
                 target_source: str | None = None):
        """`run_id`, `policy` and `worker` (default: host-pid) are what every lease is acquired as; `token` and
        `token_source`, `target_source` as ExchangeClient's."""
        self._connection = Connection("scheduler", target, token, tls_root_cert, max_message_bytes,
                                      token_source=token_source, target_source=target_source)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._connection.channel)
        self.run_id, self.policy = run_id, policy
        self.worker = worker or f"{socket.gethostname()[:40]}-{os.getpid()}"
        self.backoff = backoff or Backoff()

    def check(self, run_id: str | None = None, policy: str | None = None):
        """The connection check (mrl.connection) as this client's run and policy, unless others are named."""
        return super().check(self.run_id if run_id is None else run_id, self.policy if policy is None else policy)

    def acquire(self, devices: int = 1, phase: str = "rollout", *, min_memory_bytes: int = 0, same_node: bool = True,
                ttl_s: float = DEFAULT_TTL_S, wait_timeout_s: float | None = None, step_cost: float = 0.0,
                device_ids: Sequence[str] = ()) -> spb.Lease:
        """All `devices` at once, or DeadlineExceeded after wait_timeout_s (None: wait for as long as it takes,
        one Acquire of the server's default wait after another). Not retried on UNAVAILABLE: a lost reply's
        lease expires after its TTL. `device_ids` pins the lease to exactly those devices, in that order (as
        many as `devices`; ids as `inventory()` lists them)."""
        deadline = None if wait_timeout_s is None else time.monotonic() + wait_timeout_s
        while True:
            wait_ms = 0 if deadline is None else max(1, round((deadline - time.monotonic()) * 1000))
            req = spb.AcquireRequest(run_id=self.run_id, policy=self.policy, worker=self.worker, phase=phase,
                                     devices=devices, min_memory_bytes=min_memory_bytes, same_node=same_node,
                                     ttl_ms=int(ttl_s * 1000), wait_timeout_ms=wait_ms, step_cost=step_cost,
                                     device_ids=device_ids)
            try:
                return call(self._stub.Acquire, req, self._connection, self.backoff)
            except errors.DeadlineExceeded:
                if deadline is not None:
                    raise

    def renew(self, lease: spb.Lease, ttl_s: float = 0.0, timeout_s: float | None = None) -> spb.Lease:
        req = spb.RenewRequest(lease_id=lease.lease_id, fencing_token=lease.fencing_token, ttl_ms=int(ttl_s * 1000))
        return call(self._stub.Renew, req, self._connection, self.backoff, timeout=timeout_s)

    def release(self, lease: spb.Lease) -> bool:
        """False when it had ended already; retried while UNAVAILABLE (release is idempotent)."""
        req = spb.ReleaseRequest(lease_id=lease.lease_id, fencing_token=lease.fencing_token)
        return call(self._stub.Release, req, self._connection, self.backoff, retry=True).released

    def inventory(self) -> spb.InventoryResponse:
        return call(self._stub.Inventory, spb.InventoryRequest(), self._connection, self.backoff, retry=True)

    def watch(self, policy: str = "") -> "LeaseWatch":
        """LeaseEvents of `policy` from now on (a policy principal: its own; '' for an admin: all)."""
        return LeaseWatch(self._stub.Watch(spb.WatchRequest(policy=policy), metadata=self._connection.metadata),
                          self._connection)

    def lease(self, devices: int = 1, phase: str = "rollout", *, on_lost: str = "interrupt", **acquire) -> "HeldLease":
        """Acquire now (keyword arguments as `acquire`); use the result as a context manager."""
        if on_lost not in ("interrupt", "flag"):
            raise errors.InvalidArgument(f"on_lost {on_lost!r} must be 'interrupt' or 'flag'")
        if acquire.get("ttl_s", DEFAULT_TTL_S) <= 0:  # the renewer paces itself by the TTL it asked for
            raise errors.InvalidArgument(f"ttl_s ({acquire['ttl_s']}) must be > 0 for a held lease")
        return HeldLease(self, self.acquire(devices, phase, **acquire), acquire.get("ttl_s", DEFAULT_TTL_S), on_lost)


class LeaseWatch:
    """An iterator of LeaseEvent; `close()` ends it (from any thread)."""

    def __init__(self, stream, connection: Connection):
        self._stream, self._connection, self._closed = stream, connection, False

    def __iter__(self):
        try:
            yield from self._stream
        except grpc.RpcError as exc:
            if not self._closed:
                raise self._connection.error(exc) from exc

    def close(self) -> None:
        self._closed = True
        self._stream.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HeldLease:
    """A granted lease, renewed in the background while its with-block runs (see the module docstring)."""

    def __init__(self, client: SchedulerClient, lease: spb.Lease, ttl_s: float, on_lost: str):
        self.client, self.lease, self.ttl_s, self.on_lost = client, lease, ttl_s, on_lost
        self.lost = threading.Event()
        self.lost_reason = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the renewer interrupts the owner only while the block runs
        self._closing = False
        self._owner = 0
        self._saved: dict[str, str | None] = {}
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{lease.lease_id[:8]}", daemon=True)

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    @property
    def devices(self) -> list[spb.Device]:
        return list(self.lease.devices)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d.index) for d in self.lease.devices)

    def check(self) -> None:
        if self.lost.is_set():
            raise errors.LeaseLost(self.lost_reason)

    def __enter__(self) -> "HeldLease":
        self._owner = threading.get_ident()
        self._saved = {name: os.environ.get(name) for name in _ENV}
        os.environ.update(CUDA_VISIBLE_DEVICES=self.cuda_visible_devices, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self._renewer.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            with self._lock:
                self._closing = True
            self._stop.set()
            self._renewer.join()
            _raise_in(self._owner, None)  # withdraw a LeaseLost sent just as the block ended
        except errors.LeaseLost:
            pass  # it arrived here instead of in the block
        finally:
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if not self.lost.is_set():
                try:
                    self.client.release(self.lease)
                except errors.MrlError:
                    pass  # the lease expires after its TTL
        if self.lost.is_set() and (exc_type is None or issubclass(exc_type, errors.LeaseLost)):
            raise errors.LeaseLost(f"lease {self.lease_id} was lost: {self.lost_reason}") from exc
        return False

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        expires = time.monotonic() + self.ttl_s  # as seen from here: the grant was sent before this
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                self.lease = self.client.renew(self.lease, timeout_s=max(0.05, expires - sent))
                expires, interval = sent + self.ttl_s, self.ttl_s / 3
            except (errors.FailedPrecondition, errors.NotFound) as exc:
                return self._lose(str(exc))
            except errors.MrlError as exc:
                if time.monotonic() >= expires:
                    return self._lose(f"no renewal succeeded before the lease expired (last error: {exc})")
                interval = min(self.ttl_s / 10, max(0.0, expires - time.monotonic()))  # retry sooner

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()
        with self._lock:
            if self.on_lost == "interrupt" and not self._closing:
                _raise_in(self._owner, errors.LeaseLost)


def _raise_in(thread_id: int, exc_type) -> None:
    """Raise exc_type in thread `thread_id` at its next bytecode (None: withdraw a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               None if exc_type is None else ctypes.py_object(exc_type))

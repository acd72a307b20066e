"""One replica's live side: Acquire calls that wait, Watch streams, the event pump and the sweeper.

A waiting Acquire is a request queued in Redis plus an asyncio.Event here. It is woken when a
pass grants (or refuses) its request: a pass run by this replica returns its grants directly;
one run by another replica reaches it through the event stream, which one pump task per
replica reads (XREAD) and also fans out to the Watch streams. A sweeper task runs a pass every
`sweep_interval_s`, so leases whose holders died expire (EXPIRED event) and their devices go to
the queue even when nobody calls; the same call keeps this replica's waiting requests alive, so
the requests of a replica that died (kill -9) are dropped within request_liveness_s instead of
becoming leases nobody holds. A waiter also looks at its request every few seconds, so a lost
wake-up costs latency, never a grant. An Acquire whose caller goes away withdraws its request,
and releases the lease if it was granted in between.
"""
import asyncio
import logging
import time
import uuid

from mrl.errors import DeadlineExceeded, FailedPrecondition, MrlError, ResourceExhausted, Unavailable
from mrl.v1 import scheduler_pb2 as spb
from mrl_scheduler.leases import Grant, Pass, Request, Scheduler
from mrl_scheduler.metrics import SchedulerMetrics

__all__ = ["Dispatcher", "EVENT_TYPES"]

log = logging.getLogger("mrl.scheduler")

EVENT_TYPES = {"granted": spb.LEASE_EVENT_TYPE_GRANTED, "released": spb.LEASE_EVENT_TYPE_RELEASED,
               "expired": spb.LEASE_EVENT_TYPE_EXPIRED, "revoked": spb.LEASE_EVENT_TYPE_REVOKED}
RECHECK_S = 5.0  # a waiter looks at its request at least this often
WATCH_BUFFER = 4096  # events a Watch stream may fall behind before it is closed
PUMP_BLOCK_MS = 250  # the pump's blocking read; it notices a stop within this


class _Watcher:
    def __init__(self, policy: str):
        self.policy, self.queue = policy, asyncio.Queue(WATCH_BUFFER)

    def offer(self, event: spb.LeaseEvent | None) -> None:
        """Queue an event; a watcher that fell too far behind gets None (its stream then ends)."""
        if self.queue.full():
            while not self.queue.empty():
                self.queue.get_nowait()
            event = None
        self.queue.put_nowait(event)


class Dispatcher:
    def __init__(self, core: Scheduler, metrics: SchedulerMetrics | None = None):
        self.core, self.settings = core, core.settings
        self.metrics = metrics or SchedulerMetrics()
        self._waiters: dict[str, asyncio.Event] = {}
        self._watchers: set[_Watcher] = set()
        self._pump_task: asyncio.Task | None = None
        self._sweep_task: asyncio.Task | None = None
        self._nudges: set[asyncio.Task] = set()
        self._stopping = False

    async def start(self) -> None:
        after = await self.core.last_event_id()
        self._pump_task = asyncio.create_task(self._pump(after))
        self._sweep_task = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        # The pump ends by itself within one blocking read (cancelling a read in progress can hang redis-py).
        self._stopping = True
        self._sweep_task.cancel()
        for task in self._nudges:
            task.cancel()
        await asyncio.gather(self._sweep_task, *self._nudges, return_exceptions=True)
        done, _ = await asyncio.wait({self._pump_task}, timeout=PUMP_BLOCK_MS / 1000 + 2)
        if not done:
            self._pump_task.cancel()

    def wake(self, passed: Pass) -> None:
        for grant in passed.grants:
            event = self._waiters.get(grant.lease_id)
            if event is not None:
                event.set()

    async def renew(self, lease_id: str, fencing_token: int, ttl_ms: int) -> spb.Lease:
        grant = await self.core.renew(lease_id, fencing_token, ttl_ms)
        self.metrics.renewed.inc()
        return await self.core.lease_proto(grant)

    async def release(self, lease_id: str, fencing_token: int, force: bool = False,
                      detail: str = "released by its holder") -> bool:
        released, passed = await self.core.release(lease_id, fencing_token, force=force, detail=detail)
        self.wake(passed)
        if released and not force and self.settings.anticipation_s > 0 and not self._stopping:
            # the devices may be kept for the releasing policy (anticipation): when that ends, a pass
            # gives them to the queue, without waiting for the next sweep
            self._nudges.add(task := asyncio.create_task(self._nudge(self.settings.anticipation_s)))
            task.add_done_callback(self._nudges.discard)
        return released

    async def _nudge(self, after_s: float) -> None:
        await asyncio.sleep(after_s + 0.002)
        try:
            passed, _ = await self.core.tick(list(self._waiters))
        except Unavailable:  # the sweeper runs the pass later
            return
        except Exception:    # noqa: BLE001 - a nudge is an optimisation: the sweeper runs the pass later
            log.exception("the scheduling pass after an anticipation window failed; the sweeper will run it")
            return
        self.wake(passed)

    # -- Acquire ---------------------------------------------------------------------------------
    async def acquire(self, r: Request) -> spb.Lease:
        """Grant `r` in fair-share order, waiting up to r.wait_ms; DeadlineExceeded after that."""
        if len(self._waiters) >= self.settings.max_waiting:
            self.metrics.refused.labels("busy").inc()
            raise ResourceExhausted(f"{len(self._waiters)} Acquire calls wait on this replica already "
                                    f"(MRL_MAX_WAITING); retry later or use another replica")
        rid, wake, start = uuid.uuid4().hex, asyncio.Event(), time.monotonic()
        self._waiters[rid] = wake
        self.metrics.waiting.set(len(self._waiters))
        try:
            grant = await self._wait(r, rid, wake, start + r.wait_ms / 1000)
        except asyncio.CancelledError:
            await asyncio.shield(self._abandon(rid))
            raise
        except MrlError as exc:
            self.metrics.refused.labels(type(exc).__name__).inc()
            if isinstance(exc, Unavailable):  # a Redis blip mid-wait: withdraw the request, never orphan it
                await asyncio.shield(self._abandon(rid))
            raise
        finally:
            self._waiters.pop(rid, None)
            self.metrics.waiting.set(len(self._waiters))
        self.metrics.wait.observe(time.monotonic() - start)
        try:
            return await self.core.lease_proto(grant)
        except MrlError:                      # granted but not handed over: give the devices back
            await asyncio.shield(self._abandon(rid))
            raise

    async def _wait(self, r: Request, rid: str, wake: asyncio.Event, deadline: float) -> Grant:
        submitted = await self.core.submit(r, rid)
        self.wake(submitted.passed)
        if submitted.grant is not None:
            return submitted.grant
        while True:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                try:
                    await asyncio.wait_for(wake.wait(), min(remaining, RECHECK_S))
                except TimeoutError:
                    pass
                wake.clear()
                state, grant, why = await self.core.status(rid)
            else:
                state, grant, why, passed = await self.core.cancel(rid)
                self.wake(passed)
            if grant is not None:
                return grant
            if state == "refused":
                raise FailedPrecondition(f"request of {r.policy!r} can never be granted any more: it {why}")
            if state == "gone" and why:  # granted, then ended (expired, revoked) before it was handed over
                raise FailedPrecondition(f"the lease granted to this request was {why} before it could be handed "
                                         f"over; Acquire again")
            if state == "gone" and remaining > 0:
                raise Unavailable(f"this replica could not keep the request of {r.policy!r} alive (Redis or the "
                                  f"replica stalled for request_liveness_s={self.settings.request_liveness_s:g}), "
                                  f"so it was dropped; Acquire again")
            if state in ("cancelled", "gone"):
                wanted = ", ".join(r.device_ids) or f"{r.devices} device(s)"
                raise DeadlineExceeded(f"no {wanted} for {r.policy!r} ({r.phase}) within "
                                       f"wait_timeout_ms={r.wait_ms}: the devices are busy; Acquire again to "
                                       f"keep waiting")

    async def _abandon(self, rid: str) -> None:
        try:
            _, grant, _, passed = await self.core.cancel(rid)
            self.wake(passed)
            if grant is not None:
                _, passed = await self.core.release(grant.lease_id, grant.fencing_token,
                                                    detail="its Acquire call was cancelled before it got the lease")
                self.wake(passed)
        except MrlError as exc:  # the request lingers until its deadline, the lease until its TTL
            log.warning("could not withdraw request %s of a cancelled Acquire: %s", rid, exc)

    # -- Watch -----------------------------------------------------------------------------------
    async def watch(self, policy: str):
        """Lease events of `policy` ('' = every policy) from now on, as LeaseEvent messages."""
        if len(self._watchers) >= self.settings.max_watchers:
            raise ResourceExhausted(f"{len(self._watchers)} Watch streams are open on this replica "
                                    f"(MRL_MAX_WATCHERS); close one or use another replica")
        watcher = _Watcher(policy)
        self._watchers.add(watcher)
        self.metrics.watchers.set(len(self._watchers))
        try:
            while True:
                event = await watcher.queue.get()
                if event is None:
                    raise ResourceExhausted(f"this Watch stream fell {WATCH_BUFFER} events behind and was closed; "
                                            f"watch again (read faster, or filter by policy)")
                yield event
        finally:
            self._watchers.discard(watcher)
            self.metrics.watchers.set(len(self._watchers))

    async def _pump(self, after: str) -> None:
        while not self._stopping:
            try:
                events = await self.core.read_events(after, block_ms=PUMP_BLOCK_MS)
            except Unavailable as exc:
                log.warning("event pump: %s; retrying in 1 s", exc)
                await asyncio.sleep(1)
                for event in self._waiters.values():  # they look at their requests themselves
                    event.set()
                continue
            for entry_id, fields in events:
                after = entry_id
                try:
                    await self._dispatch(fields)
                except Exception:  # one bad event must not end the pump (Watch and wake-ups hang on it)
                    log.exception("event pump: could not dispatch event %s", entry_id)

    async def _dispatch(self, f: dict) -> None:
        kind = f["t"]
        if kind in ("granted", "refused") and f["id"] in self._waiters:
            self._waiters[f["id"]].set()
        if kind == "granted":
            self.metrics.granted.labels(f["p"]).inc()
        elif kind in ("released", "expired", "revoked"):
            getattr(self.metrics, kind).inc()
        if kind not in EVENT_TYPES or not self._watchers:
            return
        grant = Grant(f["id"], int(f["tok"]), tuple(f["d"].split()), int(f["x"]), f["p"], f["w"], f["ph"])
        event = spb.LeaseEvent(type=EVENT_TYPES[kind], lease=await self.core.lease_proto(grant))
        event.at.FromMilliseconds(int(f["at"]))
        for watcher in list(self._watchers):
            if not watcher.policy or watcher.policy == f["p"]:
                watcher.offer(event)

    async def _sweep(self) -> None:
        # The flag, not only the cancel, ends the loop: a cancel that lands inside a Redis call can come
        # out of redis-py as a connection error (Unavailable), which the loop would otherwise outlive.
        while not self._stopping:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                passed, gauges = await self.core.tick(list(self._waiters))
            except Unavailable as exc:
                if not self._stopping:
                    log.warning("sweep: %s", exc)
                continue
            self.wake(passed)
            self.metrics.observe_gauges(gauges)

"""One subscriber's delivery session: credit-based flow control, redelivery, staleness.

A subscription reads, for policy `subscriber` in run `run_id`, every stream whose kind and
producer pass its filters, through the consumer group named after the policy; its consumer
name is the subscription id. Invariants:

    in_flight = delivered − acked − expired  ≤  max_in_flight          (the credit)
    an entry stays in the group's pending list until XACK;
    an entry idle longer than the visibility timeout is claimed again (XAUTOCLAIM) and
        delivered with redelivered=true — by this or any other subscription of the policy.

Staleness: an entry of producer p with version v is dropped (acked, never delivered) when
    v < min_policy_version   or   v < latest_version(p) − max_version_lag   (not for lag_exempt_kinds).

A delivery counts against the credit until acked or until its visibility timeout passes
(after which it may be delivered again, so holding its credit longer would only leak it).
An Ack may reach any replica of the exchange: the replica that serves the subscription returns
the credit at once when the Ack reaches it, and otherwise finds it in Redis: while it waits for
credit it looks, every _RECONCILE_S, which of its in-flight deliveries are no longer pending for
its consumer (XPENDING), and returns theirs.

Response size: each SubscribeResponse stays within the subscriber's max_response_bytes (0: gRPC's
default receive limit, 4 MiB, so a client with default settings never gets a message it must
refuse); an entry too large to travel alone ends the stream with FAILED_PRECONDITION rather than
being sent again and again to a client that refuses it.
"""
import asyncio
import time
import uuid
from collections import Counter, deque

from redis.exceptions import RedisError, ResponseError

from mrl import experience
from mrl.errors import FailedPrecondition, InvalidArgument, Unavailable
from mrl.v1 import exchange_pb2 as xpb
from mrl_exchange.core import Exchange, _text, redis_call, response_limit, start_key, stream_key
from mrl_exchange.wire import RawSubscribeResponse

__all__ = ["Subscription"]

_REFRESH_S = 1.0  # how often new topics and producers' latest versions are looked up
_BLOCK_MS = 250   # longest XREADGROUP wait, so new topics and claims are noticed
_MIN_VISIBILITY_MS, _MAX_VISIBILITY_MS = 100, 24 * 3600 * 1000
_SWEEP_S = 60.0   # at least this long between sweeps of abandoned consumers
_RECONCILE_S = 0.1  # while out of credit, how often deliveries acked through another replica are looked up
_PENDING_PAGE = 1000     # XPENDING entries read per call while looking
_RESPONSE_HEADROOM = 1 << 10      # bytes of a SubscribeResponse beside its deliveries (the subscription id)
_DELIVERY_OVERHEAD = 32           # bytes of a Delivery beside its id and experience: tags, lengths, flags
_STARTS = frozenset(xpb.StartPosition.values())


class Subscription:
    def __init__(self, exchange: Exchange, request: xpb.SubscribeRequest, owner: str = "anonymous"):
        s = exchange.settings
        self.exchange, self.redis = exchange, exchange.redis
        self.run_id = experience.validate_name("run_id", request.run_id)
        self.subscriber = experience.validate_name("subscriber", request.subscriber)
        self.kinds = {experience.kind_name(k) for k in request.kinds} or set(experience.KINDS)
        self.producers = {experience.validate_name("producer", p) for p in request.producers}
        self.include_own = request.include_own
        if request.max_in_flight > s.max_in_flight_limit:
            raise InvalidArgument(f"max_in_flight {request.max_in_flight} exceeds this exchange's limit "
                                  f"{s.max_in_flight_limit}")
        self.max_in_flight = request.max_in_flight or s.default_max_in_flight
        self.min_version = request.min_policy_version
        self.max_lag = request.max_version_lag if request.HasField("max_version_lag") else None
        self.lag_exempt = {experience.kind_name(k) for k in request.lag_exempt_kinds}
        self.visibility_ms = request.visibility_timeout_ms or int(s.visibility_timeout_s * 1000)
        if not _MIN_VISIBILITY_MS <= self.visibility_ms <= _MAX_VISIBILITY_MS:
            raise InvalidArgument(f"visibility_timeout_ms {self.visibility_ms} must be between {_MIN_VISIBILITY_MS} "
                                  f"and {_MAX_VISIBILITY_MS} (0: the server default)")
        if request.start not in _STARTS:
            raise InvalidArgument(f"start {request.start} is not a StartPosition; use LATEST or EARLIEST")
        self.earliest = request.start == xpb.START_POSITION_EARLIEST
        self.id = uuid.uuid4().hex
        self.owner = owner                       # the principal: subscriptions are capped per owner
        self.max_response_bytes = response_limit(request.max_response_bytes, s.max_message_bytes)
        self._budget = self.max_response_bytes - _RESPONSE_HEADROOM  # bytes of deliveries in one response
        self._in_flight: dict[str, float] = {}   # delivery_id -> monotonic deadline
        self._backlog: deque = deque()           # (read time, entry): read beyond the credit, pending for us
        self._streams: dict[str, tuple[str, str]] = {}  # key -> (kind, producer)
        self._claim_cursor: dict[str, str] = {}
        self._versions: dict[str, int] = {}
        self._credit = asyncio.Event()
        self._start_id = "0"
        self._next_refresh = 0.0
        self._next_claim = 0.0
        self._next_sweep = time.monotonic() + _SWEEP_S

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def release(self, delivery_ids) -> None:
        for d in delivery_ids:
            self._in_flight.pop(d, None)
        self._credit.set()

    async def pin_start(self) -> None:
        """Fix where the streams are read from (earliest: "0"; latest: the policy's LATEST start). Called before
        the first message goes out, so that whatever is published after a client has its subscription id is
        delivered, whenever the subscription gets round to creating a stream's consumer group."""
        self._start_id = "0" if self.earliest else await self._latest_start()

    async def deliveries(self):
        """Yield RawSubscribeResponse messages (wire-identical to SubscribeResponse), never more un-acked
        deliveries than the credit (after pin_start)."""
        self.exchange.open_session(self)
        try:
            while True:
                credit = self._free_credit()
                if credit == 0:
                    self._credit.clear()
                    try:
                        await asyncio.wait_for(self._credit.wait(),
                                               timeout=min(_RECONCILE_S, self.visibility_ms / 4000))
                    except asyncio.TimeoutError:
                        await self._release_acked_elsewhere()
                    continue
                batch = await self._next_entries(credit)
                response, used, stale = self._deliver(batch[:credit])
                now = time.monotonic()
                self._backlog.extendleft((now, e) for e in reversed(batch[used:]))
                if stale:
                    await self._ack_stale(stale)
                if response.deliveries:
                    yield response
        finally:
            self.exchange.close_session(self)
            # shielded: gRPC may cancel the ending call again while this runs, which would leave the
            # consumer behind until another subscription's sweep
            await asyncio.shield(self._forget_consumer())

    async def _latest_start(self) -> str:
        """The policy's LATEST start, fixed at its first subscription in the run (SET NX), so a stream
        that appears while it is disconnected is still read from that point on reconnection."""
        sec, usec = await redis_call(self.redis.time())
        key = start_key(self.run_id, self.subscriber)
        await redis_call(self.redis.set(key, f"{sec * 1000 + usec // 1000}-0", nx=True))
        return (await redis_call(self.redis.get(key))).decode()

    async def _release_acked_elsewhere(self) -> None:
        """Return the credit of in-flight deliveries no longer pending for this consumer: acked through another
        replica (or claimed by a sibling subscription after their visibility timeout)."""
        by_key: dict[str, dict[str, str]] = {}  # stream key -> {entry id: delivery id}
        for delivery_id in self._in_flight:
            kind, producer, entry_id = delivery_id.split(":")
            by_key.setdefault(stream_key(self.run_id, kind, producer), {})[entry_id] = delivery_id
        acked = []
        for key, entries in by_key.items():
            pending = await self._pending_between(key, min(entries, key=_entry_order),
                                                  max(entries, key=_entry_order))
            acked += [d for entry_id, d in entries.items() if entry_id not in pending]
        if acked:
            self.release(acked)

    async def _pending_between(self, key: str, first: str, last: str) -> set[str]:
        """The entry ids from first to last (inclusive) pending for this consumer, a page at a time."""
        pending: set[str] = set()
        start = first
        while True:
            page = await redis_call(self.redis.xpending_range(key, self.subscriber, min=start, max=last,
                                                              count=_PENDING_PAGE, consumername=self.id))
            ids = [_text(p["message_id"]) for p in page]
            pending.update(ids)
            if len(ids) < _PENDING_PAGE:
                return pending
            start = f"({ids[-1]}"

    # -- reading ---------------------------------------------------------------------------
    def _free_credit(self) -> int:
        now = time.monotonic()
        expired = []
        for d, deadline in self._in_flight.items():  # in deadline order: see _deliver
            if deadline > now:
                break
            expired.append(d)
        for d in expired:
            del self._in_flight[d]
        return max(0, self.max_in_flight - len(self._in_flight))

    async def _next_entries(self, credit: int) -> list:
        """(key, entry_id, flat fields, redelivered) tuples: backlog, then claims, then new entries."""
        if self._backlog:
            # Entries idle near the visibility timeout may be claimed by a sibling subscription: drop
            # them here (they stay pending in Redis and are claimed again), deliver the fresh ones.
            fresh_after = time.monotonic() - self.visibility_ms / 2000
            taken = [self._backlog.popleft() for _ in range(min(credit, len(self._backlog)))]
            return [entry for read_at, entry in taken if read_at >= fresh_after]
        now = time.monotonic()
        if now >= self._next_refresh:
            await self._refresh()
            self._next_refresh = now + _REFRESH_S
        if not self._streams:
            await asyncio.sleep(_BLOCK_MS / 1000)
            return []
        if now >= self._next_sweep:
            self._next_sweep = now + max(self.visibility_ms / 1000, _SWEEP_S)
            await redis_call(self._sweep_consumers())
        if now >= self._next_claim:
            self._next_claim = now + self.visibility_ms / 4000
            claimed = await self._claim(credit)
            if claimed:
                return claimed
        try:
            per_stream = -(-credit // len(self._streams))  # COUNT is per stream: read about `credit` in all
            reply = await self.redis.xreadgroup(self.subscriber, self.id, {k: ">" for k in self._streams},
                                                count=per_stream, block=_BLOCK_MS)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise Unavailable(f"Redis failed: {exc}") from exc
            self._streams.clear()  # a stream or group was deleted (admin): find them again
            self._next_refresh = 0.0
            return []
        except (RedisError, OSError) as exc:
            raise Unavailable(f"Redis is unreachable: {exc}; subscribe again") from exc
        # raw reply (see Exchange.__init__): a map under RESP3, a list of [key, entries] under RESP2
        streams = reply.items() if isinstance(reply, dict) else reply or ()
        return [(key.decode(), eid.decode(), fields, False) for key, entries in streams for eid, fields in entries]

    async def _claim(self, credit: int) -> list:
        out = []
        for key in list(self._streams):
            if len(out) >= credit:
                break
            try:
                reply = await self.redis.xautoclaim(key, self.subscriber, self.id, self.visibility_ms,
                                                    start_id=self._claim_cursor.get(key, "0-0"),
                                                    count=credit - len(out))
            except ResponseError:
                continue  # NOGROUP: trimmed or deleted; the next refresh sorts it out
            except (RedisError, OSError) as exc:
                raise Unavailable(f"Redis is unreachable: {exc}; subscribe again") from exc
            cursor, entries = reply[0], reply[1]  # raw reply: see Exchange.__init__
            self._claim_cursor[key] = cursor.decode()
            gone = [eid for eid, fields in entries if not fields]  # deleted by retention while pending
            if gone:
                await redis_call(self.redis.xack(key, self.subscriber, *gone))
            out += [(key, eid.decode(), fields, True) for eid, fields in entries if fields]
        return out

    async def _refresh(self) -> None:
        """Find new matching streams (creating the group at the start position) and latest versions."""
        for kind, producer in await self.exchange.topics(self.run_id):
            key = stream_key(self.run_id, kind, producer)
            if key in self._streams or kind not in self.kinds or not self._wants(producer):
                continue
            try:
                await self.redis.xgroup_create(key, self.subscriber, id=self._start_id, mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):  # the policy's group exists: keep its position
                    raise Unavailable(f"Redis failed: {exc}") from exc
            except (RedisError, OSError) as exc:
                raise Unavailable(f"Redis is unreachable: {exc}; subscribe again") from exc
            self._streams[key] = (kind, producer)
        if self.max_lag is not None:
            self._versions = await self.exchange.latest_versions(self.run_id)

    def _wants(self, producer: str) -> bool:
        if self.producers:
            return producer in self.producers
        return self.include_own or producer != self.subscriber

    # -- delivering ------------------------------------------------------------------------
    def _deliver(self, entries) -> tuple[RawSubscribeResponse, int, list]:
        """The deliveries of the first `used` entries, forwarding the stored bytes, within one response of
        max_response_bytes; and the stale entries among them (to ack, never deliver). FailedPrecondition
        when the first entry to deliver cannot fit in a response by itself."""
        response = RawSubscribeResponse(subscription_id=self.id)
        stale, kinds = [], Counter()
        size, used = 0, 0
        now_ms = time.time() * 1000
        deadline = time.monotonic() + self.visibility_ms / 1000
        m = self.exchange.metrics
        for key, entry_id, fields, redelivered in entries:
            kind, producer = self._streams.get(key, (None, None))
            if kind is None:
                used += 1
                continue
            payload, version = _payload_and_version(fields)
            if self._is_stale(producer, version, kind):
                used += 1
                stale.append((key, entry_id))
                continue
            delivery_id = f"{kind}:{producer}:{entry_id}"
            size += len(payload) + len(delivery_id) + _DELIVERY_OVERHEAD
            if size > self._budget:
                if not response.deliveries:
                    raise self._too_large(delivery_id, len(payload))
                break
            used += 1
            appended_ms = int(entry_id.split("-", 1)[0])
            response.deliveries.add(delivery_id=delivery_id, experience=payload, redelivered=redelivered,
                                    appended_at_ms=appended_ms)
            self._in_flight.pop(delivery_id, None)  # re-inserted at the end: the dict stays in deadline order
            self._in_flight[delivery_id] = deadline
            kinds[kind] += 1
            if redelivered:
                m.redelivered.inc()
            else:
                m.latency.observe(max(0.0, now_ms - appended_ms) / 1000)
        for kind, n in kinds.items():
            m.delivered.labels(kind).inc(n)
        m.stale.inc(len(stale))
        return response, used, stale

    def _too_large(self, delivery_id: str, size: int) -> FailedPrecondition:
        s = self.exchange.settings
        return FailedPrecondition(
            f"delivery {delivery_id} holds a {size}-byte experience, more than a response of this subscription's "
            f"max_response_bytes ({self.max_response_bytes}) can carry; subscribe with a larger max_response_bytes "
            f"(and a receive limit to match; at most the exchange's MRL_MAX_MESSAGE_BYTES, {s.max_message_bytes}), "
            f"or keep experiences under MRL_MAX_EXPERIENCE_BYTES (now {s.max_experience_bytes}). It stays pending "
            f"for a subscription that accepts it.")

    def _is_stale(self, producer: str, version: int, kind: str) -> bool:
        if version < self.min_version:
            return True
        if self.max_lag is not None and kind not in self.lag_exempt:
            return version + self.max_lag < self._versions.get(producer, 0)
        return False

    async def _ack_stale(self, stale) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, entry_id in stale:
                    pipe.xack(key, self.subscriber, entry_id)
                await pipe.execute()
        except (RedisError, OSError):
            pass  # not acked: they will be claimed, found stale and dropped again

    async def _forget_consumer(self) -> None:
        """Remove this subscription's consumer from each group when it holds nothing pending."""
        try:
            for key in self._streams:
                await self.exchange.delete_consumer_if_idle(key, self.subscriber, self.id)
        except (RedisError, OSError):
            pass  # best effort: the periodic sweep (_sweep_consumers) removes it later

    async def _sweep_consumers(self) -> None:
        """Delete consumers of the policy's groups left by ended subscriptions: nothing pending and idle
        longer than the visibility timeout (a live subscription reads every _BLOCK_MS)."""
        for key in self._streams:
            try:
                consumers = await self.redis.xinfo_consumers(key, self.subscriber)
                for c in consumers:
                    name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                    if c["pending"] == 0 and c["idle"] > self.visibility_ms and name != self.id:
                        await self.exchange.delete_consumer_if_idle(key, self.subscriber, name)
            except ResponseError:
                continue  # the stream or group went away (admin delete): the next refresh sorts it out


def _payload_and_version(fields: list) -> tuple[bytes, int]:
    """A raw entry's flat field list, written by the publish script as [e, payload, v, version]."""
    if fields[0] == b"e" and fields[2] == b"v":
        return fields[1], int(fields[3])
    named = dict(zip(fields[::2], fields[1::2]))
    return named[b"e"], int(named[b"v"])


def _entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)

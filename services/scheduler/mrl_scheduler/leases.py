"""The scheduler core: gang leases with a TTL and a fencing token, state in Redis, callable in-process.

Every state change is one call of the scheduler script (scheduler.lua, then fairshare.lua, then
ops.lua, loaded as one Lua script): atomic — a grant, its fencing token, the devices' owners and the
event are written together or not at all — so any number of replicas and in-process cores share a
namespace without double-granting a device, and a restart loses nothing.

Keys (prefix `mrl:sched:{ns}:`; the braces are a Redis Cluster hash tag, one slot per namespace):

    dev                 hash device id -> "node index memory kind"
    nodes               set of node names;  node:<n>  hash device id -> memory
    nodemin  nfree      hash node -> smallest device memory; node -> its free device ids (space-separated,
                        only nodes with free devices)
    cap                 hash memory M -> "devices>=M most-on-one-node that-node" (for impossible requests)
    owner  ends:<n>     hash device id -> lease id; zset of node n's leased devices by expected end
                        (grant + est)
    lease:<id>          hash of a live lease: policy, worker, phase, run, devices, token, ttl, granted,
                        expires, est, weight;  expiry  zset lease id -> expires (ms)
    ended:<id>          tombstone of an ended lease: "token why policy run at detail" (tabs), kept
                        tombstone_s
    fence               the fencing-token counter (INCR: strictly increasing across all grants)
    q:<p>  heads        policy p's FIFO of entries "rid k m same ttl enqueued phase worker run [pins]" (pins:
                        the pinned device ids, comma-separated); hash policy -> its first entry (the policies
                        with waiting requests)
    req:<rid>  reqdl    a waiting request's policy and entry; zset rid -> its liveness deadline, which the
                        replica serving its Acquire keeps pushing forward (`tick`); a request past it is
                        dropped before any grant (its replica died)
    resv                hash rid -> "node shadow" of a waiting request's reservation (node '*': several)
                        (fairshare.py)
    pstate              hash per policy p: p|vt, p|adv, p|wt, p|held, p|usage, p|est|<phase>, and
                        p|back, p|backk (until when p is expected back after a release, with how many
                        devices: anticipation) (fairshare.py)
    rl:<principal>      the principal's rate-limit bucket, shared by the replicas (mrl_serving.ratelimit)
    events              stream of granted / released / expired / revoked / refused, one field e =
                        "type id policy worker phase run token devices expires at why" (tabs)

Times are integers in ms from one clock: Redis's TIME by default, so every replica agrees, or
an injected `clock` (the simulation runs in virtual time while every Redis operation is real).
Expiry is a number compared in Lua (never a Redis key TTL): renew and release check it, and `tick`
(every replica's sweeper) ends expired leases. A lease's id is the id of the request it grants.
"""
import dataclasses
import hashlib
import math
import pathlib
import re
import uuid
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis import Redis as BlockingRedis
from redis.exceptions import NoScriptError, RedisError

from mrl import experience
from mrl.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from mrl_serving.redis_io import connect, ping, redis_call
from mrl.v1 import scheduler_pb2 as spb
from mrl_scheduler.fairshare import ESTIMATE_ALPHA, weight_of
from mrl_scheduler.inventory import DeviceSpec
from mrl_scheduler.settings import SchedulerSettings

__all__ = ["Scheduler", "Request", "Grant", "Pass", "Submitted", "namespace_prefix"]

# The one script: helpers and state, the fair-share pass, the ops (each file says what it holds).
LUA = "\n".join(pathlib.Path(__file__).with_name(name).read_text()
                for name in ("scheduler.lua", "fairshare.lua", "ops.lua"))
EVENT_FIELDS = ("t", "id", "p", "w", "ph", "r", "tok", "d", "x", "at", "why")
MIN_TTL_MS = 10
DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}/[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # node/name


def namespace_prefix(namespace: str) -> str:
    return f"mrl:sched:{{{namespace}}}:"


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated AcquireRequest, defaults applied."""
    run_id: str
    policy: str
    worker: str
    phase: str
    devices: int
    min_memory_bytes: int
    same_node: bool
    ttl_ms: int
    wait_ms: int
    weight: float
    device_ids: tuple[str, ...] = ()  # pinned: the lease is exactly these (empty: any that fit)


@dataclasses.dataclass(frozen=True)
class Grant:
    """A live lease as of the call that returned it."""
    lease_id: str
    fencing_token: int
    device_ids: tuple[str, ...]
    expires_ms: int
    policy: str
    worker: str
    phase: str


@dataclasses.dataclass(frozen=True)
class Pass:
    """What a scheduling pass did: the grants it made (to any waiting request)."""
    grants: tuple[Grant, ...] = ()


@dataclasses.dataclass(frozen=True)
class Submitted:
    request_id: str
    grant: Grant | None  # granted at once, else queued
    passed: Pass


def _grant(rid, token, devices, expires, policy, worker, phase) -> Grant:
    return Grant(rid, int(token), tuple(devices.split()), int(expires), policy, worker, phase)


def _pass(reply) -> Pass:
    return Pass(tuple(_grant(*reply[i:i + 7]) for i in range(0, len(reply), 7)))


class Scheduler:
    """The MWRA core: register, submit / status / cancel, renew, release, tick, and the read views."""

    def __init__(self, redis: aioredis.Redis | RedisCluster | BlockingRedis,
                 settings: SchedulerSettings | None = None, clock: Callable[[], int] | None = None):
        """`redis` decodes responses: a redis.asyncio client (of one server or a cluster), or a blocking
        redis.Redis, which serves the state changes (register, submit, status, cancel, renew, release, tick) over
        one connection of its own, without an event-loop round trip per call — for one thread (the simulation, a
        test process); the reads need the asyncio client.
        `clock` returns ms (default: Redis's TIME)."""
        self.redis, self.settings, self.clock = redis, settings or SchedulerSettings(), clock
        self.prefix = namespace_prefix(self.settings.namespace)
        self._sha = hashlib.sha1(LUA.encode()).hexdigest()
        s = self.settings
        self._common = [s.events_maxlen, s.tombstone_s, s.aging, s.max_grants_per_pass, ESTIMATE_ALPHA,
                        s.backfill_slack, round(s.anticipation_s * 1000)]
        self._liveness_ms = int(s.request_liveness_s * 1000)
        self._devices: dict[str, spb.Device] = {}
        self._conn = redis.connection_pool.get_connection() if isinstance(redis, BlockingRedis) else None

    @classmethod
    def from_url(cls, url: str, settings: SchedulerSettings | None = None, clock=None) -> "Scheduler":
        settings = settings or SchedulerSettings()
        return cls(connect(url, cluster=settings.redis_cluster, max_connections=128, decode_responses=True),
                   settings, clock)

    async def close(self) -> None:
        if self._conn is None:
            await self.redis.aclose()
        else:
            self.redis.connection_pool.release(self._conn)
            self.redis.close()

    async def ping(self) -> bool:
        return await ping(self.redis)

    def key(self, name: str) -> str:
        return self.prefix + name

    async def _call(self, op: str, *args) -> tuple[list, Pass]:
        """One atomic call of the scheduler script (EVALSHA; the script is loaded on first use)."""
        now = "" if self.clock is None else int(self.clock())
        argv = (op, now, *self._common, *args)
        try:
            try:
                status, passed = await self._eval("EVALSHA", self._sha, *argv)
            except NoScriptError:
                status, passed = await self._eval("EVAL", LUA, *argv)
        except (RedisError, OSError) as exc:
            raise Unavailable(f"Redis is unreachable or failed: {exc}") from exc
        return status, _pass(passed)

    async def _eval(self, command: str, script: str, *argv):
        if self._conn is None:
            return await self.redis.execute_command(command, script, 1, self.prefix, *argv)
        try:  # a blocking client: straight over its connection, the cheapest round trip redis-py offers
            self._conn.send_command(command, script, 1, self.prefix, *argv)
            return self._conn.read_response()
        except NoScriptError:
            raise
        except (RedisError, OSError):
            self._conn.disconnect()  # reconnects on the next call
            raise

    # -- requests --------------------------------------------------------------------------------
    def check(self, req: spb.AcquireRequest) -> Request:
        """Validate an AcquireRequest (InvalidArgument naming the field) and apply the defaults."""
        s = self.settings
        for what in ("run_id", "policy", "worker", "phase"):
            experience.validate_name(what, getattr(req, what))
        if req.device_ids:
            self._check_pins(req)
        if not 1 <= req.devices <= s.max_devices:
            raise InvalidArgument(f"devices ({req.devices}) must be 1-{s.max_devices}")
        if not (math.isfinite(req.step_cost) and 0 <= req.step_cost <= s.max_step_cost):
            raise InvalidArgument(f"step_cost ({req.step_cost}) must be a finite number in [0, {s.max_step_cost:g}] "
                                  f"(0: the configured weight or 1)")
        ttl_ms = req.ttl_ms or int(s.default_ttl_s * 1000)
        if not MIN_TTL_MS <= ttl_ms <= s.max_ttl_s * 1000:
            raise InvalidArgument(f"ttl_ms ({ttl_ms}) must be {MIN_TTL_MS}-{int(s.max_ttl_s * 1000)} (0: "
                                  f"{int(s.default_ttl_s * 1000)}, MRL_DEFAULT_TTL_S)")
        wait_ms = req.wait_timeout_ms or int(s.default_wait_s * 1000)
        if wait_ms > s.max_wait_s * 1000:
            raise InvalidArgument(f"wait_timeout_ms ({wait_ms}) must be <= {int(s.max_wait_s * 1000)} "
                                  f"(MRL_MAX_WAIT_S); wait again after DEADLINE_EXCEEDED to wait longer")
        return Request(req.run_id, req.policy, req.worker, req.phase, req.devices, req.min_memory_bytes,
                       req.same_node, ttl_ms, wait_ms, weight_of(req.policy, req.step_cost, s.weights),
                       tuple(req.device_ids))

    @staticmethod
    def _check_pins(req: spb.AcquireRequest) -> None:
        """device_ids: as many as `devices`, each a device id once, on one node with same_node."""
        ids = list(req.device_ids)
        if len(ids) != req.devices:
            raise InvalidArgument(f"devices ({req.devices}) must equal the number of device_ids ({len(ids)}): a "
                                  f"pinned lease is exactly those devices")
        seen = set()
        for d in ids:
            if not DEVICE_ID.fullmatch(d):
                raise InvalidArgument(f"device_ids: {d!r} is not a device id: node/name as Inventory lists them, "
                                      f"e.g. node-0/gpu-2")
            if d in seen:
                raise InvalidArgument(f"device_ids names {d!r} twice: name each device once")
            seen.add(d)
        nodes = {d.partition("/")[0] for d in ids}
        if req.same_node and len(nodes) > 1:
            raise InvalidArgument(f"device_ids are on {len(nodes)} nodes but same_node is set: pin devices of one "
                                  f"node, or unset same_node")

    async def submit(self, r: Request, request_id: str | None = None) -> Submitted:
        """Queue `r` and run a pass: granted at once, or waiting (see `status`, `cancel`) for as long as `tick`
        keeps it alive.

        FailedPrecondition when no registered inventory can ever satisfy it (naming what there is),
        ResourceExhausted when max_queue requests (max_queue_per_policy of its policy) wait already."""
        rid = request_id or uuid.uuid4().hex
        status, passed = await self._call(
            "submit", rid, r.policy, r.worker, r.phase, r.run_id, r.devices, r.min_memory_bytes, int(r.same_node),
            r.ttl_ms, self._liveness_ms, repr(r.weight), self.settings.max_queue,
            self.settings.max_queue_per_policy, ",".join(r.device_ids))
        if status[0] == "impossible":
            raise FailedPrecondition(f"request of {r.policy!r} can never be granted: it {status[1]}")
        if status[0] == "full":
            raise ResourceExhausted(f"{self.settings.max_queue} requests wait already (MRL_MAX_QUEUE); retry later")
        if status[0] == "full_policy":
            raise ResourceExhausted(f"{self.settings.max_queue_per_policy} requests of {r.policy!r} wait already "
                                    f"(MRL_MAX_QUEUE_PER_POLICY); retry when some are granted")
        if status[0] == "duplicate":
            raise InvalidArgument(f"request id {rid!r} is in use")
        mine = next((g for g in passed.grants if g.lease_id == rid), None)
        return Submitted(rid, mine, passed)

    async def status(self, request_id: str) -> tuple[str, Grant | None, str]:
        """('granted', grant, ''), ('queued', None, ''), ('refused', None, why) or ('gone', None, why)."""
        status, _ = await self._call("status", request_id)
        return self._request_state(request_id, status)

    async def cancel(self, request_id: str) -> tuple[str, Grant | None, str, Pass]:
        """Withdraw a waiting request; a request granted meanwhile stays granted (returned as such)."""
        status, passed = await self._call("cancel", request_id)
        return (*self._request_state(request_id, status), passed)

    @staticmethod
    def _request_state(rid: str, status: list) -> tuple[str, Grant | None, str]:
        if status[0] == "granted":
            return "granted", _grant(*status[1:8]), ""
        return status[0], None, status[1] if len(status) > 1 else ""

    # -- leases ----------------------------------------------------------------------------------
    async def renew(self, lease_id: str, fencing_token: int, ttl_ms: int = 0) -> Grant:
        """Extend a lease to now + ttl_ms (0: its own TTL); returns it with its new expiry."""
        self.check_lease_args(lease_id, fencing_token)
        if ttl_ms and not MIN_TTL_MS <= ttl_ms <= self.settings.max_ttl_s * 1000:
            raise InvalidArgument(f"ttl_ms ({ttl_ms}) must be {MIN_TTL_MS}-{int(self.settings.max_ttl_s * 1000)} "
                                  f"(0: the lease's own)")
        status, _ = await self._call("renew", lease_id, fencing_token, ttl_ms)
        if status[0] == "ok":
            return _grant(*status[1:8])
        raise self._lease_error(lease_id, fencing_token, status)

    async def release(self, lease_id: str, fencing_token: int, *, force: bool = False,
                      detail: str = "released by its holder") -> tuple[bool, Pass]:
        """End a lease (idempotent: False when it had ended already). `force` (an admin) revokes it
        whatever its token."""
        if force:
            experience.validate_name("lease_id", lease_id)
        else:
            self.check_lease_args(lease_id, fencing_token)
        status, passed = await self._call("release", lease_id, "" if force else fencing_token, detail)
        if status[0] in ("released", "already"):
            return status[0] == "released", passed
        raise self._lease_error(lease_id, fencing_token, status)

    @staticmethod
    def check_lease_args(lease_id: str, fencing_token: int) -> None:
        experience.validate_name("lease_id", lease_id)
        if fencing_token <= 0:
            raise InvalidArgument("fencing_token is required: pass the token returned with the lease")

    @staticmethod
    def _lease_error(lease_id: str, token: int, status: list) -> Exception:
        if status[0] == "unknown":
            return NotFound(f"lease {lease_id!r} is unknown (never granted, or ended long ago)")
        if status[0] == "stale":
            return FailedPrecondition(f"fencing token {token} is not lease {lease_id!r}'s: a stale holder must "
                                      f"stop using its devices")
        return FailedPrecondition(f"lease {lease_id!r} is lost ({status[1]}: {status[2]}); stop using its devices "
                                  f"and acquire again")

    async def tick(self, alive: Sequence[str] = ()) -> tuple[Pass, dict[str, int]]:
        """Keep the waiting requests `alive` (this replica's Acquires wait on them) for request_liveness_s more,
        expire leases past their expiry, drop the requests nobody kept alive, trim the events, grant; returns
        the pass and gauges: devices, free, leases, queued."""
        status, passed = await self._call("tick", self._liveness_ms, *alive)
        return passed, dict(zip(("devices", "free", "leases", "queued"), map(int, status[1:5])))

    async def register(self, node: str, devices: Sequence[DeviceSpec]) -> tuple[int, int, Pass]:
        """Make `devices` node's whole device set; returns (leases revoked, requests refused, pass): a lease
        on a device that left is revoked, a waiting request no inventory can satisfy any more is refused."""
        experience.validate_name("node", node)
        args: list = [node]
        for d in devices:
            if d.node != node:
                raise InvalidArgument(f"device {d.device_id} is not on node {node!r}")
            args += [d.device_id, d.index, d.memory_bytes, d.kind]
        if len(set(args[1::4])) != len(devices):
            raise InvalidArgument(f"node {node!r}: device indexes repeat")
        self._devices.clear()
        status, passed = await self._call("register", *args)
        return int(status[1]), int(status[2]), passed

    # -- reading ---------------------------------------------------------------------------------
    async def owner(self, lease_id: str) -> tuple[str, str]:
        """(policy, run_id) of a live or recently ended lease, for authorization; NotFound otherwise."""
        experience.validate_name("lease_id", lease_id)
        policy, run_id = await redis_call(self.redis.hmget(self.key(f"lease:{lease_id}"), "p", "r"))
        if policy is not None:
            return policy, run_id
        tombstone = await redis_call(self.redis.get(self.key(f"ended:{lease_id}")))
        if tombstone is not None:
            _, _, policy, run_id, *_ = tombstone.split("\t")
            return policy, run_id
        raise NotFound(f"lease {lease_id!r} is unknown (never granted, or ended long ago)")

    async def device_protos(self, ids: Sequence[str]) -> list[spb.Device]:
        """Devices by id (cached; the cache is refreshed when an id is missing)."""
        if any(i not in self._devices for i in ids):
            raw = await redis_call(self.redis.hgetall(self.key("dev")))
            self._devices = {d: _device(d, info) for d, info in raw.items()}
        return [self._devices.get(i) or spb.Device(device_id=i) for i in ids]

    async def lease_proto(self, grant: Grant) -> spb.Lease:
        lease = spb.Lease(lease_id=grant.lease_id, fencing_token=grant.fencing_token, policy=grant.policy,
                          worker=grant.worker, phase=grant.phase, devices=await self.device_protos(grant.device_ids))
        for d in lease.devices:
            d.lease_id, d.leased = grant.lease_id, True
        lease.expires_at.FromMilliseconds(grant.expires_ms)
        return lease

    async def leases(self) -> list[spb.Lease]:
        ids = await redis_call(self.redis.zrange(self.key("expiry"), 0, -1))
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hgetall(self.key(f"lease:{i}"))
            rows = await redis_call(pipe.execute())
        return [await self.lease_proto(_grant(i, r["tok"], r["d"], r["x"], r["p"], r["w"], r["ph"]))
                for i, r in zip(ids, rows) if r]

    async def inventory(self) -> spb.InventoryResponse:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key("dev")).hgetall(self.key("owner")).zcard(self.key("reqdl"))
            devs, owners, queued = await redis_call(pipe.execute())
        self._devices = {d: _device(d, info) for d, info in devs.items()}
        devices = [_device(d, devs[d], owners.get(d, "")) for d in sorted(devs)]
        return spb.InventoryResponse(devices=devices, leases=await self.leases(), queued=int(queued or 0))

    async def queue(self, limit: int = 1000) -> list[dict]:
        """Waiting requests, per policy in FIFO order (at most `limit` per policy)."""
        policies = sorted(await redis_call(self.redis.hkeys(self.key("heads"))))
        out = []
        for p in policies:
            entries = [e.split() for e in await redis_call(self.redis.lrange(self.key(f"q:{p}"), 0, limit - 1))]
            reserved = await redis_call(self.redis.hmget(self.key("resv"), [e[0] for e in entries])) \
                if entries else []
            for i, (e, rn) in enumerate(zip(entries, reserved)):
                rid, k, m, same, _, enq, phase, worker, run_id, *pins = e
                out.append({"request_id": rid, "policy": p, "position": i, "worker": worker, "phase": phase,
                            "run_id": run_id, "devices": int(k), "min_memory_bytes": int(m), "same_node": same == "1",
                            "device_ids": pins[0].split(",") if pins else [], "enqueued_ms": int(enq),
                            "reserved_node": rn.split()[0] if rn else None})
        return out

    async def policy_state(self) -> dict[str, dict[str, float]]:
        """Columns weight, held, queued, usage_ms, vt: {policy: value} (the input of fairshare.shares)."""
        state = await redis_call(self.redis.hgetall(self.key("pstate")))
        columns = {"weight": {}, "held": {}, "usage_ms": {}, "vt": {}, "queued": {}}
        names = {"wt": "weight", "held": "held", "usage": "usage_ms", "vt": "vt"}
        for field, value in state.items():
            policy, _, name = field.partition("|")
            if name in names:
                columns[names[name]][policy] = float(value)
        for p in await redis_call(self.redis.hkeys(self.key("heads"))):
            columns["queued"][p] = await redis_call(self.redis.llen(self.key(f"q:{p}")))
        return columns

    async def read_events(self, after: str, block_ms: int, count: int = 512) -> list[tuple[str, dict]]:
        """(stream id, event) after stream id `after`, waiting up to block_ms for the first; an event is a
        dict of t (type), id, p (policy), w (worker), ph (phase), r (run), tok, d (devices), x, at, why."""
        reply = await redis_call(self.redis.xread({self.key("events"): after}, count=count, block=block_ms))
        return [(entry_id, dict(zip(EVENT_FIELDS, fields["e"].split("\t")))) for entry_id, fields in reply[0][1]] \
            if reply else []

    async def last_event_id(self) -> str:
        info = await redis_call(self.redis.xinfo_stream(self.key("events"))) if await redis_call(
            self.redis.exists(self.key("events"))) else None
        return info["last-generated-id"] if info else "0-0"


def _device(device_id: str, info: str, lease_id: str = "") -> spb.Device:
    node, index, memory, kind = info.split()
    return spb.Device(device_id=device_id, node=node, index=int(index), memory_bytes=int(memory), kind=kind,
                      lease_id=lease_id, leased=bool(lease_id))

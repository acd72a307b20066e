"""The exchange core: Redis Streams layout, atomic idempotent publish, ack, topics, admin.

Keys (the run in braces is a Redis Cluster hash tag: a run's keys live on one shard):

    mrl:{run}:x:{kind}:{producer}   stream of one (run, kind, producer); fields e=Experience bytes, v=version
    mrl:{run}:topics                set of "kind:producer" with a stream
    mrl:{run}:versions              hash producer -> latest policy_version published
    mrl:{run}:seen:{producer}:{id}  dedupe marker, expires after dedupe_ttl_s
    mrl:{run}:start:{subscriber}    a policy's LATEST start position, fixed at its first subscription
    mrl:{run}:library:{producer}:{prompt digest}
                                    list of a producer's newest successes for one prompt (successes.py)
    mrl:{run}:library-order         counter of the successes the library has taken, their order across producers

One consumer group per subscribing policy on each stream, named after the policy, so each
policy sees every entry once; at-least-once: an entry stays in the group's pending list
until acked (see subscription.py for redelivery).
"""
import hashlib
import logging

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from mrl import experience
from mrl.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, Unavailable
from mrl_serving.redis_io import connect, ping, redis_call
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import experience_pb2 as pb
from mrl_exchange.metrics import ExchangeMetrics
from mrl_exchange.settings import ExchangeSettings

__all__ = ["Exchange", "stream_key", "library_key", "parse_delivery_id", "redis_call", "response_limit"]

log = logging.getLogger(__name__)


def stream_key(run_id: str, kind: str, producer: str) -> str:
    return f"mrl:{{{run_id}}}:x:{kind}:{producer}"


def topics_key(run_id: str) -> str:
    return f"mrl:{{{run_id}}}:topics"


def versions_key(run_id: str) -> str:
    return f"mrl:{{{run_id}}}:versions"


def seen_key(run_id: str, producer: str, experience_id: str) -> str:
    return f"mrl:{{{run_id}}}:seen:{producer}:{experience_id}"


def start_key(run_id: str, subscriber: str) -> str:
    return f"mrl:{{{run_id}}}:start:{subscriber}"


def library_order_key(run_id: str) -> str:
    return f"mrl:{{{run_id}}}:library-order"


def library_key(run_id: str, producer: str, prompt_id: str) -> str:
    """The success library of one (run, producer, prompt); the prompt id (free text, up to 256 characters) enters
    the key as a digest, so no brace, colon or glob character of it can reach a key pattern."""
    digest = hashlib.sha256(prompt_id.encode()).hexdigest()[:32]
    return f"mrl:{{{run_id}}}:library:{producer}:{digest}"


DEFAULT_RESPONSE_BYTES = 4 << 20  # max_response_bytes 0: gRPC's default receive limit in every language
MIN_RESPONSE_BYTES = 64 << 10     # the smallest max_response_bytes accepted: below it little experience would fit


def response_limit(max_response_bytes: int, max_message_bytes: int) -> int:
    """The largest response a caller accepts (a request's max_response_bytes: 0 is gRPC's default receive limit),
    at most the exchange's max_message_bytes; InvalidArgument below MIN_RESPONSE_BYTES."""
    if 0 < max_response_bytes < MIN_RESPONSE_BYTES:
        raise InvalidArgument(f"max_response_bytes {max_response_bytes} is below {MIN_RESPONSE_BYTES}: "
                              f"state your client's receive limit (0: gRPC's default, 4 MiB)")
    return min(max_response_bytes or DEFAULT_RESPONSE_BYTES, max_message_bytes)


def parse_delivery_id(delivery_id: str) -> tuple[str, str, str]:
    """'kind:producer:entry_id' -> (kind, producer, entry_id), or InvalidArgument."""
    parts = delivery_id.split(":")
    if len(parts) != 3 or parts[0] not in experience.KINDS or not _is_entry_id(parts[2]):
        raise InvalidArgument(f"delivery_id {delivery_id!r} is malformed: pass the delivery_id of a Delivery "
                              f"unchanged")
    experience.validate_name("delivery_id producer", parts[1])
    return parts[0], parts[1], parts[2]


def _is_entry_id(s: str) -> bool:
    ms, _, seq = s.partition("-")
    return ms.isdigit() and seq.isdigit()


# KEYS = topics, versions, library order, then (seen_i, stream_i) per experience, then the library key of each
#        success kept.
# ARGV = maxlen, max_age_ms, dedupe_ttl_s, library_cap, library_ttl_s,
#        then (payload_i, version_i, topic_i, producer_i, library_i) where library_i is the index in KEYS of the
#        experience's library key, 0 for none. Dedupe, append and library write are one atomic step; returns the
#        0-based indexes of duplicates. A library entry is "<order> <payload>", newest first, where order is the
#        run's count of library writes (INCR): a total order across producers, which stream entry ids are not
#        (each stream numbers its own entries; two streams give the same id within one millisecond).
_PUBLISH_LUA = """
local maxlen, max_age_ms, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local library_cap, library_ttl = tonumber(ARGV[4]), ARGV[5]
local minid = nil
if max_age_ms > 0 then
  local t = redis.call('TIME')
  minid = string.format('%d-0', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - max_age_ms)
end
local dups = {}
for i = 1, (#ARGV - 5) / 5 do
  local a = 5 + (i - 1) * 5
  if redis.call('SET', KEYS[2 + 2 * i], '1', 'NX', 'EX', ttl) then
    local skey = KEYS[3 + 2 * i]
    redis.call('XADD', skey, 'MAXLEN', '~', maxlen, '*', 'e', ARGV[a + 1], 'v', ARGV[a + 2])
    if minid then redis.call('XTRIM', skey, 'MINID', '~', minid) end
    redis.call('SADD', KEYS[1], ARGV[a + 3])
    local cur = redis.call('HGET', KEYS[2], ARGV[a + 4])
    if (not cur) or tonumber(ARGV[a + 2]) > tonumber(cur) then
      redis.call('HSET', KEYS[2], ARGV[a + 4], ARGV[a + 2])
    end
    local library = tonumber(ARGV[a + 5])
    if library > 0 then
      local order = redis.call('INCR', KEYS[3])
      redis.call('LPUSH', KEYS[library], order .. ' ' .. ARGV[a + 1])
      redis.call('LTRIM', KEYS[library], 0, library_cap - 1)
      redis.call('EXPIRE', KEYS[library], library_ttl)
    end
  else
    dups[#dups + 1] = i - 1
  end
end
return dups
"""


LAG_COUNT_CAP = 10_000  # on Redis < 7, lag is counted by reading ids, at most this many


# Delete a consumer only if it holds nothing pending, atomically (no entry can be lost in between).
_DELETE_IDLE_CONSUMER_LUA = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
"""


class Exchange:
    """Publish, ack, list and administer typed experience in Redis. Subscribe: see `subscription`."""

    def __init__(self, redis: aioredis.Redis | RedisCluster, settings: ExchangeSettings | None = None):
        self.redis = redis
        self.settings = settings or ExchangeSettings()
        self.limits = experience.Limits(self.settings.max_experience_bytes, self.settings.max_tokens)
        self.metrics = ExchangeMetrics()
        self.sessions: dict = {}  # subscription id -> live Subscription (subscription.py) on this replica
        self._of_policy: dict[tuple[str, str], dict] = {}  # (run, subscriber) -> {id: its live Subscriptions}
        self._publish = redis.register_script(_PUBLISH_LUA)
        self._delete_idle_consumer = redis.register_script(_DELETE_IDLE_CONSUMER_LUA)
        # Subscriptions read stream entries as Redis sends them (flat field lists, no per-entry dicts):
        # the hot path of delivery. No other code on this client reads these two replies.
        for command in ("XREADGROUP", "XAUTOCLAIM"):
            redis.set_response_callback(command, _raw_reply)

    @classmethod
    def from_url(cls, url: str, settings: ExchangeSettings | None = None) -> "Exchange":
        """A client (of a Redis Cluster with settings.redis_cluster) whose pool holds a connection for every
        subscription's blocking read plus headroom (see redis_io.connect)."""
        settings = settings or ExchangeSettings()
        return cls(connect(url, cluster=settings.redis_cluster, max_connections=settings.max_subscriptions + 64),
                   settings)

    def open_session(self, session) -> None:
        """Admit a subscription within the caps (RESOURCE_EXHAUSTED beyond them)."""
        s = self.settings
        if len(self.sessions) >= s.max_subscriptions:
            raise ResourceExhausted(f"this exchange serves {s.max_subscriptions} subscriptions already "
                                    f"(MRL_MAX_SUBSCRIPTIONS); retry later or use another replica")
        mine = sum(1 for other in self.sessions.values() if other.owner == session.owner)
        if mine >= s.max_subscriptions_per_principal:
            raise ResourceExhausted(f"{session.owner!r} has {mine} open subscriptions, the most allowed "
                                    f"(MRL_MAX_SUBSCRIPTIONS_PER_PRINCIPAL); close one first")
        self.sessions[session.id] = session
        self._of_policy.setdefault((session.run_id, session.subscriber), {})[session.id] = session

    def close_session(self, session) -> None:
        self.sessions.pop(session.id, None)
        key = (session.run_id, session.subscriber)
        of_policy = self._of_policy.get(key, {})
        of_policy.pop(session.id, None)
        if not of_policy:
            self._of_policy.pop(key, None)

    async def delete_consumer_if_idle(self, key: str, group: str, consumer: str) -> bool:
        """XGROUP DELCONSUMER, only when the consumer has nothing pending (one atomic script)."""
        return await self._delete_idle_consumer(keys=[key], args=[group, consumer]) >= 0

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return await ping(self.redis)

    # -- publish ---------------------------------------------------------------------------
    def check_batch(self, experiences) -> list[str]:
        """Validate a whole batch before anything is written; return each experience's kind."""
        if not experiences:
            raise InvalidArgument("the batch is empty: publish at least one experience")
        if len(experiences) > self.settings.max_batch:
            raise InvalidArgument(f"the batch holds {len(experiences)} experiences; at most "
                                  f"{self.settings.max_batch} per Publish (MRL_MAX_BATCH): split it")
        kinds = [experience.validate(e, self.limits) for e in experiences]
        run_id = experiences[0].run_id
        for exp in experiences:
            if exp.run_id != run_id:
                raise InvalidArgument(f"a batch belongs to one run: {exp.experience_id} is in run "
                                      f"{exp.run_id!r}, the batch's first experience in {run_id!r}")
        return kinds

    async def publish(self, experiences: list[pb.Experience]) -> xpb.PublishResponse:
        """Append a batch atomically: every new experience is appended (a success enters the success library
        too: see successes.py), duplicates are counted.

        Raises InvalidArgument (nothing appended) when any experience is malformed.
        """
        try:
            kinds = self.check_batch(experiences)
        except InvalidArgument:
            self.metrics.rejected.inc()
            raise
        s = self.settings
        run_id = experiences[0].run_id
        keys = [topics_key(run_id), versions_key(run_id), library_order_key(run_id)]
        library_keys = []
        args: list = [s.retention_maxlen, int(s.retention_max_age_s * 1000), s.dedupe_ttl_s,
                      s.success_library_per_prompt, s.success_library_ttl_s]
        for exp, kind in zip(experiences, kinds):
            keys += [seen_key(run_id, exp.producer, exp.experience_id), stream_key(run_id, kind, exp.producer)]
            library = 0
            if kind == "success" and s.success_library_per_prompt:
                library_keys.append(library_key(run_id, exp.producer, exp.success.prompt_id))
                library = 3 + 2 * len(experiences) + len(library_keys)  # its 1-based index in KEYS
            args += [exp.SerializeToString(), exp.policy_version, f"{kind}:{exp.producer}", exp.producer, library]
        keys += library_keys
        try:
            dup_indexes = await self._publish(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise Unavailable(f"Redis is unreachable or failed: {exc}; retry the same batch (publish is "
                              f"idempotent)") from exc
        dup_set = set(dup_indexes)
        for i, kind in enumerate(kinds):
            if i not in dup_set:
                self.metrics.published.labels(kind).inc()
        self.metrics.duplicates.inc(len(dup_set))
        return xpb.PublishResponse(accepted=len(experiences) - len(dup_set), duplicates=len(dup_set),
                                   duplicate_ids=[experiences[i].experience_id for i in dup_indexes])

    # -- ack -------------------------------------------------------------------------------
    async def ack(self, run_id: str, subscriber: str, delivery_ids, subscription_id: str = "") -> int:
        """XACK each delivery in the subscriber's group; return the credit at once to whichever live subscription
        of the policy on this replica holds them. `subscription_id` is optional: a client that leaves it out
        (or names the subscription before a reconnect) must not wait out the visibility timeout for credit."""
        experience.validate_name("run_id", run_id)
        experience.validate_name("subscriber", subscriber)
        if len(delivery_ids) > self.settings.max_in_flight_limit:
            raise InvalidArgument(f"{len(delivery_ids)} delivery ids in one Ack; at most "
                                  f"{self.settings.max_in_flight_limit} (MRL_MAX_IN_FLIGHT_LIMIT): split it")
        session = self.sessions.get(subscription_id)
        if session is not None and (session.run_id, session.subscriber) != (run_id, subscriber):
            raise PermissionDenied(f"subscription {subscription_id!r} is not a subscription of {subscriber!r} "
                                   f"in run {run_id!r}")
        parsed = [parse_delivery_id(d) for d in delivery_ids]
        by_stream: dict[str, list[str]] = {}
        for kind, producer, entry_id in parsed:
            by_stream.setdefault(stream_key(run_id, kind, producer), []).append(entry_id)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, ids in by_stream.items():
                    pipe.xack(key, subscriber, *ids)
                acked = sum(await pipe.execute())
        except (RedisError, OSError) as exc:
            raise Unavailable(f"Redis is unreachable or failed: {exc}; ack again (acks are idempotent)") from exc
        for session in self._of_policy.get((run_id, subscriber), {}).values():
            session.release(delivery_ids)  # frees only what it holds: acked entries are done for the policy
        if subscription_id and subscription_id not in self.sessions:
            # a late Ack of an ended subscription: its consumer was kept while it held this work; drop it once
            # it holds nothing (the sweep that would otherwise remove it runs only while the policy subscribes)
            try:
                for key in by_stream:
                    await self.delete_consumer_if_idle(key, subscriber, subscription_id)
            except (RedisError, OSError):
                pass  # the acks stand; the consumer only lingers (empty) until a sweep
        self.metrics.acked.inc(acked)
        return acked

    # -- topics and admin ------------------------------------------------------------------
    async def topics(self, run_id: str) -> list[tuple[str, str]]:
        """(kind, producer) of every stream of a run, sorted."""
        experience.validate_name("run_id", run_id)
        members = await redis_call(self.redis.smembers(topics_key(run_id)))
        return sorted(tuple(m.decode().split(":", 1)) for m in members)

    async def runs(self) -> list[str]:
        runs = []
        async for key in self.redis.scan_iter(match="mrl:{*}:topics", count=1000):
            runs.append(key.decode()[len("mrl:{"):-len("}:topics")])
        return sorted(runs)

    async def topic_stats(self, run_id: str, kind: str = "", producer: str = "") -> list[xpb.TopicStats]:
        versions = await redis_call(self.redis.hgetall(versions_key(run_id)))
        out = []
        for k, p in await self.topics(run_id):
            if (kind and k != kind) or (producer and p != producer):
                continue
            key = stream_key(run_id, k, p)
            try:
                info = await self.redis.xinfo_stream(key)
                groups = await self.redis.xinfo_groups(key)
            except ResponseError:  # the stream was trimmed away or deleted
                continue
            except (RedisError, OSError) as exc:
                raise Unavailable(f"Redis is unreachable: {exc}") from exc
            stats = xpb.TopicStats(
                topic=xpb.Topic(run_id=run_id, kind=experience.kind_enum(k), producer=p),
                length=info["length"], last_id=_text(info["last-generated-id"]),
                latest_policy_version=int(versions.get(p.encode(), 0)))
            for g in groups:
                last = _text(g["last-delivered-id"])
                lag = g.get("lag")
                if lag is None:  # Redis < 7 reports no lag: count entries after the position, up to a cap
                    lag = len(await self.redis.xrange(key, min=f"({last}", max="+", count=LAG_COUNT_CAP))
                stats.groups.append(xpb.ConsumerGroupStats(
                    subscriber=_text(g["name"]), pending=g["pending"], lag=lag, last_delivered_id=last,
                    consumers=g["consumers"]))
            out.append(stats)
        return out

    async def trim(self, run_id: str, kind: str, producer: str, maxlen: int) -> int:
        """Keep the newest `maxlen` entries of one stream; return how many were removed."""
        if maxlen < 0:
            raise InvalidArgument(f"maxlen ({maxlen}) must be >= 0")
        experience.kind_enum(kind)
        key = stream_key(run_id, kind, experience.validate_name("producer", producer))
        if (kind, producer) not in await self.topics(run_id):
            raise NotFound(f"run {run_id!r} has no {kind} stream from {producer!r}")
        return await redis_call(self.redis.xtrim(key, maxlen=maxlen, approximate=False))

    async def delete_run(self, run_id: str) -> int:
        """Delete every key of a run (streams, groups, dedupe markers); return how many."""
        experience.validate_name("run_id", run_id)
        deleted = 0
        batch = []
        async for key in self.redis.scan_iter(match=f"mrl:{{{run_id}}}:*", count=1000):
            batch.append(key)
            if len(batch) == 500:
                deleted += await redis_call(self.redis.unlink(*batch))
                batch = []
        if batch:
            deleted += await redis_call(self.redis.unlink(*batch))
        if not deleted:
            raise NotFound(f"run {run_id!r} has no data")
        return deleted

    async def latest_versions(self, run_id: str) -> dict[str, int]:
        raw = await redis_call(self.redis.hgetall(versions_key(run_id)))
        return {k.decode(): int(v) for k, v in raw.items()}



def _raw_reply(response, **options):
    return response


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

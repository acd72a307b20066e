"""The exchange and the scheduler against a real Redis Cluster of 3 masters (tests/redis_cluster.py), over real
gRPC: publish/subscribe/ack/redelivery, the success library; acquire/renew/release/expiry. Every run's keys and every scheduler
namespace hash to one slot; runs and namespaces spread over the masters."""
import time
import uuid

import pytest
import redis
from redis.cluster import RedisCluster

from helpers import rollout, success, wait_for
from mrl import errors
from mrl.exchange_client import ExchangeClient
from mrl.grpc_client import Backoff
from mrl.scheduler_client import SchedulerClient
from mrl.errors import InvalidArgument
from mrl_exchange.core import Exchange
from mrl_exchange.settings import ExchangeSettings
from mrl_serving.redis_io import wait_for_redis

pytestmark = pytest.mark.scale


def take(deliveries, n):
    """The next n deliveries of an iterator over a subscription (each iter() of it would be a new Subscribe)."""
    return [next(deliveries) for _ in range(n)]


def slots_of(url: str, pattern: str) -> set[int]:
    client = RedisCluster.from_url(url)
    try:
        return {client.keyslot(k) for k in client.scan_iter(match=pattern, target_nodes=RedisCluster.ALL_NODES)}
    finally:
        client.close()


def runs_on_every_master(url: str, per_master: int) -> list[str]:
    """Fresh run ids, `per_master` of them hashed (by their {run} tag) to each master of the cluster."""
    client, taken = RedisCluster.from_url(url), {}
    try:
        masters = {node.name for node in client.get_primaries()}
        while any(len(taken.get(m, [])) < per_master for m in masters):
            run_id = f"run-{uuid.uuid4().hex[:12]}"
            owner = client.get_node_from_key(f"{{{run_id}}}").name
            if len(taken.setdefault(owner, [])) < per_master:
                taken[owner].append(run_id)
    finally:
        client.close()
    return [run_id for owned in taken.values() for run_id in owned]


def test_exchange_publish_subscribe_ack_and_redelivery_on_a_cluster(start_exchange, cluster_url):
    server = start_exchange(redis_url=cluster_url, redis_cluster=True)
    runs = runs_on_every_master(cluster_url, per_master=2)
    with ExchangeClient(server.target) as x:
        for run_id in runs:
            assert x.publish([rollout(run_id, "policy-a"), rollout(run_id, "policy-c")]).accepted == 2
        run_id = runs[0]
        first = x.subscribe(run_id, "policy-b", start="earliest", visibility_timeout_s=0.5)
        got = take(iter(first), 2)
        assert sorted(d.experience.producer for d in got) == ["policy-a", "policy-c"]
        first.close()                                    # dies without acking: redelivered
        wait_for(lambda: not server.server.exchange.sessions)
        second = x.subscribe(run_id, "policy-b", start="earliest", visibility_timeout_s=0.5)
        deliveries = iter(second)
        again = take(deliveries, 2)
        assert {d.delivery_id for d in again} == {d.delivery_id for d in got} and all(d.redelivered for d in again)
        assert second.ack(again) == 2
        assert x.publish([rollout(run_id, "policy-a")]).accepted == 1
        [fresh] = take(deliveries, 1)
        assert not fresh.redelivered and second.ack([fresh]) == 1
        second.close()
        stats = {(t.topic.producer, g.subscriber): g.pending for t in x.topic_stats(run_id) for g in t.groups}
        assert stats == {("policy-a", "policy-b"): 0, ("policy-c", "policy-b"): 0}
        solved = success(run_id, "policy-c", prompt_id="gsm8k/0/1")   # the success library: one slot too
        assert x.publish([solved]).accepted == 1
        assert x.get_successes(run_id, "policy-b", ["gsm8k/0/1", "gsm8k/0/2"]) == [solved]
    core = server.server.exchange           # the admin's views scan every master
    assert set(runs) <= set(server._run(core.runs()))
    assert server._run(core.delete_run(runs[-1])) > 0 and runs[-1] not in server._run(core.runs())
    runs.pop()
    # every key of a run in one slot, its hash tag's (multi-key scripts and XREADGROUP over several streams need
    # it); the runs were chosen on every master, so the exchange served runs on all three
    owners = RedisCluster.from_url(cluster_url)
    assert all(slots_of(cluster_url, f"mrl:{{{r}}}:*") == {owners.keyslot(f"{{{r}}}")} for r in runs)
    owners.close()


def test_scheduler_acquire_renew_release_and_expiry_on_a_cluster(start_scheduler, cluster_url):
    servers = [start_scheduler(redis_url=cluster_url, redis_cluster=True, slots=2) for _ in range(3)]
    for server in servers:
        with SchedulerClient(server.target, run_id="run-1", policy="policy-a", worker="w-1",
                             backoff=Backoff(attempts=1)) as c:
            lease = c.acquire(2, "rollout", ttl_s=5)
            assert lease.fencing_token > 0 and len(lease.devices) == 2
            renewed = c.renew(lease, ttl_s=10)
            assert renewed.expires_at.ToMilliseconds() > lease.expires_at.ToMilliseconds()
            assert c.release(lease) is True and c.release(lease) is False
            short = c.acquire(1, "rollout", ttl_s=0.2)
            time.sleep(0.6)                                   # the sweeper ends it
            with pytest.raises(errors.FailedPrecondition, match="expired"):
                c.renew(short)
            assert not c.inventory().leases
    namespaces = [s.settings.namespace for s in servers]
    assert all(len(slots_of(cluster_url, f"mrl:sched:{{{ns}}}:*")) == 1 for ns in namespaces)


@pytest.mark.asyncio
async def test_a_cluster_node_without_redis_cluster_set_is_refused(cluster_url):
    exchange = Exchange.from_url(cluster_url, ExchangeSettings())
    with pytest.raises(InvalidArgument, match="redis_cluster"):
        await wait_for_redis(exchange.redis, timeout_s=5)
    await exchange.close()


def test_redis_cluster_set_for_a_unix_socket_is_refused(redis_url):
    with pytest.raises(InvalidArgument, match="unix socket"):
        Exchange.from_url(redis_url, ExchangeSettings(redis_cluster=True))

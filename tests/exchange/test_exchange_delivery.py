"""Delivery semantics over real Redis and real gRPC: at-least-once, credit, groups, staleness, restart."""
import time

import pytest

from helpers import Collector, rollout, success, wait_for
from mrl_serving.embedded_redis import EmbeddedRedis
from mrl.exchange_client import ExchangeClient


def test_unacked_deliveries_are_redelivered_after_the_subscriber_dies(exchange, run_id):
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id) for _ in range(3)])
        first = Collector(see.subscribe(run_id, "policy-b", start="earliest", visibility_timeout_s=0.5))
        got = first.take(3)
        assert not any(d.redelivered for d in got)
        first.close()  # dies without acking
        second = Collector(see.subscribe(run_id, "policy-b", visibility_timeout_s=0.5))
        again = second.take(3)
        assert {d.delivery_id for d in again} == {d.delivery_id for d in got}
        assert all(d.redelivered for d in again)
        second.subscription.ack(again)
        assert second.nothing_more(1.5)  # acked: never again
        second.close()


def test_in_flight_never_exceeds_the_granted_credit(exchange, run_id):
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id) for _ in range(10)])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=3))
        got = c.take(3)
        assert c.nothing_more(1.0)
        sessions = list(exchange.server.exchange.sessions.values())
        assert [s.in_flight for s in sessions] == [3]
        c.subscription.ack(got[:2])
        more = c.take(2)
        assert c.nothing_more(0.7)
        c.subscription.ack([got[2], *more])
        rest = c.take(3)
        c.subscription.ack(rest)
        c.take(2)
        assert c.nothing_more(0.5)
        c.close()


def test_two_consumer_groups_each_see_every_entry(exchange, run_id):
    with ExchangeClient(exchange.target) as see:
        b = Collector(see.subscribe(run_id, "policy-b", start="earliest"))
        c = Collector(see.subscribe(run_id, "policy-c", start="earliest"))
        sent = [rollout(run_id, "policy-a") for _ in range(20)]
        see.publish(sent)
        ids = {e.experience_id for e in sent}
        for col in (b, c):
            got = col.take(20)
            assert {d.experience.experience_id for d in got} == ids
            col.subscription.ack(got)
            col.close()


def test_start_latest_skips_what_was_published_before(exchange, run_id):
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id)])
        c = Collector(see.subscribe(run_id, "policy-b", start="latest")).started()
        new = rollout(run_id)
        see.publish([new])
        assert [d.experience.experience_id for d in c.take(1)] == [new.experience_id]
        assert c.nothing_more(0.5)
        c.close()


@pytest.mark.parametrize("bound, delivered_versions", [
    ({"min_policy_version": 5}, [5, 6, 10]),
    ({"max_version_lag": 4}, [6, 10]),
], ids=["min_policy_version", "max_version_lag"])
def test_staleness_bound_drops_old_producer_versions(exchange, run_id, bound, delivered_versions):
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id, version=v) for v in (1, 3, 5, 6, 10)])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", **bound))
        got = c.take(len(delivered_versions))
        assert sorted(d.experience.policy_version for d in got) == delivered_versions
        assert c.nothing_more(0.7)
        c.close()
        stats = see.topic_stats(run_id)[0]
        assert stats.latest_policy_version == 10
        # dropped entries were acked, so only the delivered (un-acked) ones stay pending
        assert stats.groups[0].pending == len(delivered_versions)


def test_the_version_lag_spares_the_kinds_the_subscriber_judges_itself(exchange, run_id):
    """lag_exempt_kinds: max_version_lag drops old rollouts but not old successes (an asynchronous receiver keeps
    verified successes whatever their age); min_policy_version still applies to every kind."""
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id, version=v) for v in (1, 10)] + [success(run_id, version=v) for v in (0, 1, 10)])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_version_lag=4, min_policy_version=1,
                                    lag_exempt_kinds=["success"]))
        got = c.take(3)
        assert sorted((d.experience.WhichOneof("payload"), d.experience.policy_version) for d in got) == [
            ("rollout", 10), ("success", 1), ("success", 10)]
        assert c.nothing_more(0.7)
        c.close()


def test_exchange_and_redis_restart_keep_undelivered_entries(start_exchange, run_id, tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis")
    url = redis.start()
    try:
        ex = start_exchange(redis_url=url)
        sent = [rollout(run_id) for _ in range(5)]
        with ExchangeClient(ex.target) as see:
            see.publish(sent)
            c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=2,
                                        visibility_timeout_s=0.5))
            c.take(2)  # delivered, never acked
            c.close()
        ex.stop()
        redis.stop()  # SHUTDOWN: the AOF is flushed
        url = redis.start()
        ex = start_exchange(redis_url=url)
        with ExchangeClient(ex.target) as see:
            c = Collector(see.subscribe(run_id, "policy-b", visibility_timeout_s=0.5))
            got = c.take(5)
            assert {d.experience.experience_id for d in got} == {e.experience_id for e in sent}
            assert sum(d.redelivered for d in got) == 2
            c.subscription.ack(got)
            c.close()
    finally:
        redis.stop()


def test_admin_rest_reports_lag_pending_and_trims_and_deletes(exchange, run_id):
    import httpx
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id) for _ in range(6)])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=2))
        c.take(2)
        time.sleep(0.3)
        topics = httpx.get(f"{exchange.admin}/v1/runs/{run_id}/topics").json()["topics"]
        group = topics[0]["groups"][0]
        assert (topics[0]["length"], group["subscriber"], group["pending"], group["lag"]) == (6, "policy-b", 2, 4)
        c.close()
        assert run_id in httpx.get(f"{exchange.admin}/v1/runs").json()["runs"]
        r = httpx.post(f"{exchange.admin}/v1/runs/{run_id}/topics/rollout/policy-a/trim", params={"maxlen": 1})
        assert r.status_code == 200 and r.json()["removed"] == 5
        assert httpx.delete(f"{exchange.admin}/v1/runs/{run_id}").status_code == 200
        assert see.list_topics(run_id) == []
        metrics = httpx.get(f"{exchange.admin}/metrics").text
        assert 'mrl_exchange_published_total{kind="rollout"}' in metrics


@pytest.mark.parametrize("settings, low, high", [
    ({"retention_maxlen": 10}, 10, 301),      # the newest 10 kept, at most a node (100) more
    ({"retention_max_age_s": 0.3}, 1, 101),   # only the last publish is younger than 0.3 s
], ids=["maxlen", "max_age"])
def test_retention_trims_streams_at_append(start_exchange, run_id, settings, low, high):
    ex = start_exchange(**settings)
    with ExchangeClient(ex.target) as see:
        for _ in range(3):
            see.publish([rollout(run_id) for _ in range(200)])
            time.sleep(0.4)
        see.publish([rollout(run_id)])
        # trimming is approximate (whole radix-tree nodes of 100 entries), never past the bound
        length = see.topic_stats(run_id)[0].length
        assert low <= length <= high, length


def test_subscriptions_are_capped_per_principal(start_exchange, run_id):
    from mrl import errors
    ex = start_exchange(max_subscriptions_per_principal=2)
    with ExchangeClient(ex.target) as see:
        open_ = [Collector(see.subscribe(run_id, "policy-b")) for _ in range(2)]
        time.sleep(0.3)
        with pytest.raises(errors.ResourceExhausted, match="2 open subscriptions"):
            next(iter(see.subscribe(run_id, "policy-b", reconnect=None)))
        for c in open_:
            c.close()


def test_deliveries_never_exceed_one_message(start_exchange, run_id):
    """Credit 64 of ~100 KiB experiences under a 256 KiB message limit: split over several responses."""
    ex = start_exchange(max_message_bytes=256 * 1024, max_experience_bytes=128 * 1024)
    big = []
    for _ in range(6):
        e = rollout(run_id)
        e.rollout.prompt_text = "x" * (100 * 1024)
        big.append(e)
    with ExchangeClient(ex.target, max_message_bytes=256 * 1024) as see:
        see.publish(big[:2])
        see.publish(big[2:4])
        see.publish(big[4:])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=64))
        got = c.take(6)
        assert {d.experience.experience_id for d in got} == {e.experience_id for e in big}
        c.subscription.ack(got)
        c.close()


def test_latest_start_is_kept_across_reconnects(exchange, run_id):
    """A producer's first experience, published while the subscriber is away, is delivered on reconnect."""
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id, "policy-a")])
        first = Collector(see.subscribe(run_id, "policy-b", start="latest")).started()
        first.close()
        newcomer = rollout(run_id, "policy-c")
        see.publish([newcomer])
        again = Collector(see.subscribe(run_id, "policy-b", start="latest"))
        assert [d.experience.experience_id for d in again.take(1)] == [newcomer.experience_id]
        again.close()


def test_the_same_id_from_two_producers_is_two_experiences(exchange, run_id):
    a, b = rollout(run_id, "policy-a"), rollout(run_id, "policy-b")
    b.experience_id = a.experience_id
    with ExchangeClient(exchange.target) as see:
        assert see.publish([a]).accepted == 1
        assert see.publish([b]).accepted == 1


def test_ended_subscriptions_leave_no_consumers_behind(start_exchange, run_id):
    """Consumers of ended subscriptions are removed: at once when nothing is pending, else by the sweep
    once another subscription has taken over and acked their work."""
    import redis
    ex = start_exchange(visibility_timeout_s=0.3)
    with ExchangeClient(ex.target) as see:
        see.publish([rollout(run_id) for _ in range(3)])
        for _ in range(3):  # each dies holding un-acked deliveries
            c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=1))
            c.take(1)
            c.close()
        from mrl_exchange import subscription
        subscription._SWEEP_S, old = 0.2, subscription._SWEEP_S
        try:
            last = Collector(see.subscribe(run_id, "policy-b", visibility_timeout_s=0.3))
            got = last.take(3)
            last.subscription.ack(got)
            time.sleep(1.5)  # a sweep runs after the visibility timeout
            key = f"mrl:{{{run_id}}}:x:rollout:policy-a"
            r = redis.Redis.from_url(ex.settings.redis_url)
            names = [c["name"] for c in r.xinfo_consumers(key, "policy-b")]
            assert len(names) == 1, names  # only the live subscription's consumer
            # a slow ack (> 0.3 s on a loaded machine) gets an entry delivered again: ack those too, so the
            # live consumer holds nothing pending when it ends
            deadline = time.monotonic() + 10
            while r.xpending(key, "policy-b")["pending"] and time.monotonic() < deadline:
                while not last.items.empty():
                    last.subscription.ack([last.items.get()])
                time.sleep(0.05)
            last.close()
            # removed once the server has ended the subscription (seen once in CI to take over 10 s under load:
            # the consumer was still there, idle and with nothing pending, 10 s after the close)
            wait_for(lambda: not ex.server.exchange.sessions, 60, "the server ending the subscription")
            wait_for(lambda: not r.xinfo_consumers(key, "policy-b"), 10, "the ended subscription's consumer removed")
        finally:
            subscription._SWEEP_S = old


def test_an_ack_after_the_subscription_ended_removes_its_consumer(start_exchange, run_id):
    """A subscription that ends holding a delivery keeps its consumer (its work is pending); the late Ack
    that settles that work removes the consumer, since no sweep of that group may ever run again."""
    import redis
    ex = start_exchange(visibility_timeout_s=30)
    with ExchangeClient(ex.target) as see:
        see.publish([rollout(run_id)])
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=1))
        held = c.take(1)
        subscription_id = c.subscription.subscription_id
        c.close()
        key = f"mrl:{{{run_id}}}:x:rollout:policy-a"
        r = redis.Redis.from_url(ex.settings.redis_url)
        deadline = time.monotonic() + 10   # the server sees the stream end
        while ex.server.exchange.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [c["pending"] for c in r.xinfo_consumers(key, "policy-b")] == [1]
        assert see.ack(run_id, "policy-b", [d.delivery_id for d in held], subscription_id) == 1
        assert r.xinfo_consumers(key, "policy-b") == []


def _rollouts_of(run_id, n, text_bytes):
    out = []
    for _ in range(n):
        e = rollout(run_id)
        e.rollout.prompt_text = "x" * text_bytes
        out.append(e)
    return out


def _raw_subscribe(channel, run_id, **fields):
    """A foreign client's subscription: the generated stub, nothing of the SDK."""
    from mrl.v1 import exchange_pb2 as xpb
    from mrl.v1 import exchange_pb2_grpc
    stub = exchange_pb2_grpc.ExperienceExchangeStub(channel)
    request = xpb.SubscribeRequest(run_id=run_id, subscriber="policy-b", start=xpb.START_POSITION_EARLIEST, **fields)
    return stub, stub.Subscribe(request, timeout=30)


def test_a_client_with_grpcs_default_4_mib_receive_limit_gets_large_rollouts(exchange, run_id):
    """64 rollouts of 100 KB, the default credit (256) and a channel with gRPC's default 4 MiB receive limit
    (grpc-js, Go, Java, Python) stating no max_response_bytes: every response stays under 4 MiB."""
    import grpc
    big = _rollouts_of(run_id, 64, 100_000)
    with ExchangeClient(exchange.target) as see:
        for i in range(0, 64, 16):
            see.publish(big[i:i + 16])
    with grpc.insecure_channel(exchange.target) as channel:
        _, call = _raw_subscribe(channel, run_id)
        got, responses = [], 0
        for response in call:
            assert response.ByteSize() <= 4 << 20
            responses += bool(response.deliveries)
            got += response.deliveries
            if len(got) == 64:
                break
        call.cancel()
    assert {d.experience.experience_id for d in got} == {e.experience_id for e in big}
    assert responses >= 2  # 6.4 MB could not have come in one


def test_the_sdk_states_its_receive_limit_as_max_response_bytes(exchange, run_id):
    big = _rollouts_of(run_id, 24, 100_000)
    with ExchangeClient(exchange.target) as publisher:
        publisher.publish(big)
    with ExchangeClient(exchange.target, max_message_bytes=1 << 20) as see:
        c = Collector(see.subscribe(run_id, "policy-b", start="earliest", max_in_flight=64))
        got = c.take(24)
        c.subscription.ack(got)
        c.close()
    assert {d.experience.experience_id for d in got} == {e.experience_id for e in big}


def test_an_experience_larger_than_max_response_bytes_is_a_clear_error_not_a_stuck_stream(start_exchange, run_id):
    import grpc
    from mrl import errors
    from mrl.v1 import exchange_pb2 as xpb
    ex = start_exchange(max_experience_bytes=2 << 20)
    [huge] = _rollouts_of(run_id, 1, 1_500_000)
    with grpc.insecure_channel(ex.target) as channel:
        stub, call = _raw_subscribe(channel, run_id, max_response_bytes=1 << 20, visibility_timeout_ms=500)
        stub.Publish(xpb.PublishRequest(experiences=[huge]), timeout=10)  # the SDK checks its own 1 MiB default
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value
    assert "max_response_bytes" in info.value.details() and "MRL_MAX_EXPERIENCE_BYTES" in info.value.details()
    with ExchangeClient(ex.target, max_message_bytes=1 << 20) as small, pytest.raises(errors.FailedPrecondition):
        next(iter(small.subscribe(run_id, "policy-b", start="earliest", visibility_timeout_s=0.5)))
    # each subscription above read it and failed to send it: it comes again after their visibility timeout
    with ExchangeClient(ex.target) as see:  # a subscriber that accepts it gets it: nothing was lost
        c = Collector(see.subscribe(run_id, "policy-b", visibility_timeout_s=0.5))
        [d] = c.take(1)
        assert d.experience.experience_id == huge.experience_id
        c.subscription.ack([d])
        c.close()


def test_an_ack_without_subscription_id_returns_the_credit_at_once(exchange, run_id):
    """Leaving subscription_id out must not throttle a subscriber to its visibility timeout (30 s here):
    40 deliveries at max_in_flight=4, each response acked without the id, arrive within seconds."""
    import grpc
    from mrl.v1 import exchange_pb2 as xpb
    with ExchangeClient(exchange.target) as see:
        see.publish([rollout(run_id) for _ in range(40)])
    start = time.monotonic()
    with grpc.insecure_channel(exchange.target) as channel:
        stub, call = _raw_subscribe(channel, run_id, max_in_flight=4)
        got, waits, acked_at = [], [], None
        for response in call:
            if not response.deliveries:
                continue
            if acked_at is not None:
                waits.append(time.monotonic() - acked_at)  # from an Ack to the deliveries its credit let through
            got += response.deliveries
            ids = [d.delivery_id for d in response.deliveries]
            assert stub.Ack(xpb.AckRequest(run_id=run_id, subscriber="policy-b", delivery_ids=ids)).acked == len(ids)
            acked_at = time.monotonic()
            if len(got) == 40:
                break
        [session] = exchange.server.exchange.sessions.values()
        assert session.in_flight == 0  # the last Ack's credit is back as soon as it is answered
        call.cancel()
    assert len({d.delivery_id for d in got}) == 40
    assert max(waits) < 2.0, waits
    assert time.monotonic() - start < 10


def test_a_max_response_bytes_too_small_for_any_experience_is_invalid_argument(exchange, run_id):
    import grpc

    from mrl.v1 import exchange_pb2 as xpb
    from mrl.v1 import exchange_pb2_grpc
    with grpc.insecure_channel(exchange.target) as channel:
        stream = exchange_pb2_grpc.ExperienceExchangeStub(channel).Subscribe(
            xpb.SubscribeRequest(run_id=run_id, subscriber="policy-b", max_response_bytes=1000), timeout=10)
        with pytest.raises(grpc.RpcError) as exc:
            next(iter(stream))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_response_bytes" in exc.value.details()

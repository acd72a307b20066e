"""Publish → subscribe → ack of every kind through real gRPC sockets and a real Redis."""
import itertools


from helpers import one_of_each, rollout
from mrl.exchange_client import ExchangeClient


def take(subscription, n):
    return list(itertools.islice(iter(subscription), n))


def test_round_trip_of_each_kind(exchange, run_id):
    sent = one_of_each(run_id, "policy-a")
    with ExchangeClient(exchange.target) as see:
        sub = see.subscribe(run_id, "policy-b", start="earliest")
        assert see.publish(sent).accepted == 4
        got = take(sub, 4)
        assert sorted(d.kind for d in got) == ["group_stats", "policy_stats", "rollout", "success"]
        by_id = {d.experience.experience_id: d.experience for d in got}
        for exp in sent:
            assert by_id[exp.experience_id] == exp
        assert sub.ack(got) == 4
        sub.close()
        stats = see.topic_stats(run_id)
        assert {s.length for s in stats} == {1}
        assert all(g.pending == 0 for s in stats for g in s.groups)


def test_publish_is_idempotent(exchange, run_id):
    exp = rollout(run_id)
    with ExchangeClient(exchange.target) as see:
        assert see.publish([exp]).accepted == 1
        again = see.publish([exp, exp])
        assert (again.accepted, again.duplicates) == (0, 2)
        assert list(again.duplicate_ids) == [exp.experience_id] * 2
        assert [s.length for s in see.topic_stats(run_id)] == [1]


def test_subscriber_filters_kinds_and_producers_and_skips_its_own(exchange, run_id):
    with ExchangeClient(exchange.target) as see:
        sub = see.subscribe(run_id, "policy-b", kinds=["rollout"], start="earliest")
        see.publish(one_of_each(run_id, "policy-a") + one_of_each(run_id, "policy-c"))
        see.publish(one_of_each(run_id, "policy-b"))
        got = take(sub, 2)
        assert sorted(d.experience.producer for d in got) == ["policy-a", "policy-c"]
        assert {d.kind for d in got} == {"rollout"}
        sub.ack(got)
        sub.close()


def test_health_checking_and_reflection_are_served(exchange):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    with grpc.insecure_channel(exchange.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(service="mrl.v1.ExperienceExchange")).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in reply.list_services_response.service}
        assert "mrl.v1.ExperienceExchange" in names


def test_async_client_round_trip(exchange, run_id):
    import asyncio
    from mrl.exchange_client import AsyncExchangeClient

    async def scenario():
        async with AsyncExchangeClient(exchange.target) as see:
            sent = one_of_each(run_id, "policy-a")
            assert (await see.publish(sent)).accepted == 4
            got = []
            async for d in see.subscribe(run_id, "policy-b", start="earliest"):
                got.append(d)
                assert await d.ack() == 1
                if len(got) == 4:
                    break
            return got

    got = asyncio.run(scenario())
    assert sorted(d.kind for d in got) == ["group_stats", "policy_stats", "rollout", "success"]


def test_subscription_reconnects_after_the_exchange_restarts(start_exchange, run_id):
    first = start_exchange()
    port = first.server.port
    with ExchangeClient(first.target) as see:
        sub = iter(see.subscribe(run_id, "policy-b", start="earliest"))
        see.publish([rollout(run_id)])
        next(sub).ack()
        first.stop()
        second = start_exchange(port=port)  # same address: the client's channel reconnects
        with ExchangeClient(second.target) as publisher:
            later = rollout(run_id)
            publisher.publish([later])
        d = next(sub)
        assert d.experience.experience_id == later.experience_id
        d.ack()


def test_publish_rides_out_an_exchange_restart_within_its_retry_budget(start_exchange, run_id):
    """Down for a few seconds: a publish with the default retry budget waits for the exchange to come back;
    a budget the caller sets bounds how long it tries."""
    import threading
    import time

    import pytest

    from mrl import errors
    from mrl.exchange_client import Backoff
    first = start_exchange()
    port, target = first.server.port, first.target
    first.stop()
    with ExchangeClient(target, backoff=Backoff(budget_s=1.0)) as impatient:
        start = time.monotonic()
        with pytest.raises(errors.Unavailable):
            impatient.publish([rollout(run_id)])
        assert 0.9 <= time.monotonic() - start < 3.0
    threading.Timer(4.0, start_exchange, kwargs={"port": port}).start()
    sent = [rollout(run_id) for _ in range(3)]
    with ExchangeClient(target) as see:
        assert see.publish(sent).accepted == 3
        assert [s.length for s in see.topic_stats(run_id)] == [3]

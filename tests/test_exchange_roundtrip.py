"""Publish → subscribe → ack of every kind through real gRPC sockets and a real Redis."""
import itertools

import pytest

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

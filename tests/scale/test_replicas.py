"""Two exchange replicas on one Redis, each on its own real gRPC socket, and a client that alternates between
them: the credit of a subscription comes back whichever replica its Acks reach, and a principal's rate limit
holds across the replicas (its token bucket lives in Redis)."""
import time

import pytest

from helpers import Collector, rollout
from mrl import errors
from mrl.exchange_client import ExchangeClient
from mrl.grpc_client import Backoff

pytestmark = pytest.mark.scale


def test_credit_returns_whichever_replica_an_ack_reaches(start_exchange, run_id):
    replicas = [start_exchange(), start_exchange()]
    clients = [ExchangeClient(r.target) for r in replicas]
    try:
        clients[0].publish([rollout(run_id) for _ in range(8)])
        subscription = clients[0].subscribe(run_id, "policy-b", start="earliest", max_in_flight=2,
                                            visibility_timeout_s=60)   # no credit comes back by expiry here
        deliveries = Collector(subscription)
        got = deliveries.take(2, timeout=5.0)
        assert deliveries.nothing_more(0.5)                              # the credit is spent
        for i in range(3):
            other = clients[(i + 1) % 2]                                # B, A, B: the subscription lives on A
            ids = [d.delivery_id for d in got]
            assert other.ack(run_id, "policy-b", ids, subscription.subscription_id if i != 2 else "") == 2
            started = time.monotonic()
            got = deliveries.take(2, timeout=3)                       # well before the visibility timeout
            assert time.monotonic() - started < 3 and not any(d.redelivered for d in got)
            assert deliveries.nothing_more(0.3)
        deliveries.close()
    finally:
        for c in clients:
            c.close()


def test_a_rate_limit_holds_across_replicas(start_exchange, run_id):
    limits = {"rate_limit_per_s": 0.01, "rate_limit_burst": 4, "max_batch": 4, "rate_limit_scope": "replicated"}
    replicas = [start_exchange(**limits), start_exchange(**limits)]
    clients = [ExchangeClient(r.target, backoff=Backoff(attempts=1)) for r in replicas]
    try:
        for i in range(4):                                   # the burst, spent on both replicas in turn
            assert clients[i % 2].publish([rollout(run_id)]).accepted == 1
        for c in clients:                                    # per replica, each would still hold 2 tokens
            with pytest.raises(errors.ResourceExhausted, match="rate limit"):
                c.publish([rollout(run_id)])
    finally:
        for c in clients:
            c.close()

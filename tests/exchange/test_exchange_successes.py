"""The success library (GetSuccesses) over real gRPC sockets and a real Redis: successes outlive their streams'
retention and a subscriber's acks, filters, the per-(prompt, producer) cap, dedupe, authorization, validation,
the library switched off, and responses bounded by the caller's receive limit."""
import grpc
import pytest
import redis

from helpers import rollout, success, write_auth_file
from mrl import errors
from mrl.exchange_client import AsyncExchangeClient, Backoff, ExchangeClient
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import exchange_pb2_grpc
from mrl_exchange.core import library_key


def ids(experiences):
    return [e.experience_id for e in experiences]


def library_keys(redis_url, run_id):
    client = redis.Redis.from_url(redis_url)
    try:
        return sorted(client.scan_iter(match=f"mrl:{{{run_id}}}:library:*"))
    finally:
        client.close()


def test_a_success_outlives_its_trimmed_stream_and_the_subscribers_acks(start_exchange, run_id):
    server = start_exchange(retention_maxlen=1)
    old = success(run_id, "policy-a", prompt_id="old/prompt")
    with ExchangeClient(server.target) as see:
        assert see.publish([old]).accepted == 1
        newer = [success(run_id, "policy-a", prompt_id=f"new/{i}") for i in range(300)]
        assert see.publish(newer).accepted == 300
        [stats] = see.topic_stats(run_id)
        assert stats.length < 300                       # retention trimmed the stream: the old entry is gone
        assert see.get_successes(run_id, "policy-b", ["old/prompt"]) == [old]   # a late subscriber gets it
        sub = see.subscribe(run_id, "policy-c", start="earliest")   # a policy that has acked all it was sent
        got = [d for _, d in zip(range(stats.length), sub)]
        assert sub.ack(got) == len(got)
        sub.close()
        assert see.get_successes(run_id, "policy-c", ["old/prompt", "new/299"]) == [old, newer[-1]]


def test_producers_filter_and_the_subscribers_own_successes(exchange, run_id):
    mine, b, c = (success(run_id, p, prompt_id="p/1") for p in ("policy-a", "policy-b", "policy-c"))
    with ExchangeClient(exchange.target) as see:
        assert see.publish([mine, b, rollout(run_id, "policy-c")]).accepted == 3
        assert see.publish([c]).accepted == 1
        assert see.get_successes(run_id, "policy-a", ["p/1"]) == [c, b]            # newest first, not its own
        assert see.get_successes(run_id, "policy-a", ["p/1"], producers=["policy-b"]) == [b]
        assert see.get_successes(run_id, "policy-a", ["p/1"], producers=["policy-a", "policy-c"]) == [c, mine]
        assert see.get_successes(run_id, "policy-a", ["p/2", "p/1"], producers=["policy-x"]) == []
        assert see.get_successes(run_id, "policy-a", ["p/2"]) == []


def test_each_producer_keeps_its_newest_per_prompt_and_a_query_the_newest_of_all(start_exchange, run_id, redis_url):
    server = start_exchange(success_library_per_prompt=3, success_library_ttl_s=600)
    a = [success(run_id, "policy-a", prompt_id="p/1", response_text=str(i)) for i in range(5)]
    b = [success(run_id, "policy-b", prompt_id="p/1", response_text=str(i)) for i in range(2)]
    with ExchangeClient(server.target) as see:
        assert see.publish(a[:4]).accepted == 4              # one batch: its order is the order of append
        assert see.publish(b).accepted == 2
        assert see.publish([a[4]]).accepted == 1
        assert ids(see.get_successes(run_id, "policy-c", ["p/1"], producers=["policy-a"])) == ids(a[:1:-1])
        assert ids(see.get_successes(run_id, "policy-c", ["p/1"], max_per_prompt=64)) == \
            ids([a[4], b[1], b[0], a[3], a[2]])             # 3 kept per producer: policy-b's not evicted
        assert ids(see.get_successes(run_id, "policy-c", ["p/1"])) == ids([a[4], b[1], b[0]])  # default: 3
        assert ids(see.get_successes(run_id, "policy-c", ["p/1"], max_per_prompt=1)) == ids([a[4]])
    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl(library_key(run_id, "policy-a", "p/1")) <= 600
    client.close()


def test_producers_are_merged_in_the_order_of_publish_even_within_one_millisecond(start_exchange, run_id):
    """Two producers' streams number their entries apart (each stream's ids are its own): a batch that alternates
    producers appends them all within one millisecond, yet a query answers them in the order they were published."""
    server = start_exchange(success_library_per_prompt=8)
    sent = [success(run_id, producer, prompt_id="p/1", response_text=str(i))
            for i in range(8) for producer in ("policy-a", "policy-b")]
    with ExchangeClient(server.target) as see:
        assert see.publish(sent).accepted == 16
        assert ids(see.get_successes(run_id, "policy-c", ["p/1"], max_per_prompt=16)) == ids(sent[::-1])


def test_entries_an_earlier_exchange_stamped_with_stream_ids_count_as_older(exchange, run_id, redis_url):
    old, new = success(run_id, "policy-a", prompt_id="p/1"), success(run_id, "policy-b", prompt_id="p/1")
    client = redis.Redis.from_url(redis_url)
    client.lpush(library_key(run_id, "policy-a", "p/1"), b"99999999999999-0 " + old.SerializeToString())
    client.sadd(f"mrl:{{{run_id}}}:topics", "success:policy-a")
    client.close()
    with ExchangeClient(exchange.target) as see:
        assert see.publish([new]).accepted == 1
        assert see.get_successes(run_id, "policy-c", ["p/1"]) == [new, old]


@pytest.mark.asyncio
async def test_the_asyncio_client_gets_successes_too(exchange, run_id):
    sent = success(run_id, "policy-a", prompt_id="p/1")
    async with AsyncExchangeClient(exchange.target) as see:
        assert (await see.publish([sent])).accepted == 1
        assert await see.get_successes(run_id, "policy-b", ["p/2", "p/1"]) == [sent]


def test_a_duplicate_is_not_kept_twice(exchange, run_id):
    first = success(run_id, "policy-a", prompt_id="p/1")
    with ExchangeClient(exchange.target) as see:
        assert see.publish([first, first]).duplicates == 1
        assert see.publish([first]).duplicates == 1
        assert see.get_successes(run_id, "policy-b", ["p/1"]) == [first]


def test_authorization_is_that_of_subscribe(start_exchange, run_id, tmp_path):
    tokens = write_auth_file(tmp_path / "auth.yaml", run_id)
    server = start_exchange(auth_file=tmp_path / "auth.yaml")
    sent = success(run_id, "policy-b", prompt_id="p/1")

    def client(who=None):
        return ExchangeClient(server.target, tokens[who] if who else None, backoff=Backoff(attempts=1))
    with client("policy-b") as b, client("policy-a") as a, client("admin") as admin, client() as anonymous:
        assert b.publish([sent]).accepted == 1
        assert a.get_successes(run_id, "policy-a", ["p/1"]) == [sent]
        assert admin.get_successes(run_id, "policy-a", ["p/1"]) == [sent]
        with pytest.raises(errors.PermissionDenied, match="only as policy 'policy-a'"):
            a.get_successes(run_id, "policy-b", ["p/1"])
        with pytest.raises(errors.PermissionDenied, match="does not belong to run"):
            a.get_successes(f"{run_id}-other", "policy-a", ["p/1"])
        with pytest.raises(errors.Unauthenticated):
            anonymous.get_successes(run_id, "policy-a", ["p/1"])


@pytest.mark.parametrize("change, field", [
    ({"run_id": "bad run"}, "run_id"),
    ({"subscriber": ""}, "subscriber"),
    ({"prompt_ids": []}, "prompt ids"),
    ({"prompt_ids": [f"p/{i}" for i in range(257)]}, "prompt ids"),
    ({"prompt_ids": ["p/1", ""]}, "prompt_ids[1]"),
    ({"prompt_ids": ["x" * 257]}, "prompt_ids[0]"),
    ({"prompt_ids": ["p/1", "p/1"]}, "prompt_ids[1]"),
    ({"producers": ["policy:b"]}, "producer"),
    ({"producers": [f"p{i}" for i in range(257)]}, "producers"),
    ({"producers": ["policy-a", "policy-a"]}, "more than once"),
    ({"max_per_prompt": 65}, "max_per_prompt"),
    ({"max_response_bytes": 1000}, "max_response_bytes"),
])
def test_a_malformed_request_is_invalid_argument_and_changes_nothing(exchange, run_id, redis_url, change, field):
    sent = success(run_id, "policy-a", prompt_id="p/1")
    with ExchangeClient(exchange.target) as see, grpc.insecure_channel(exchange.target) as channel:
        assert see.publish([sent]).accepted == 1
        keys = library_keys(redis_url, run_id)
        request = {"run_id": run_id, "subscriber": "policy-b", "prompt_ids": ["p/1"], **change}
        with pytest.raises(grpc.RpcError) as info:
            exchange_pb2_grpc.ExperienceExchangeStub(channel).GetSuccesses(xpb.GetSuccessesRequest(**request),
                                                                           timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()
        assert library_keys(redis_url, run_id) == keys
        assert see.get_successes(run_id, "policy-b", ["p/1"]) == [sent]


def test_the_library_switched_off_keeps_nothing_and_is_failed_precondition(start_exchange, run_id, redis_url):
    server = start_exchange(success_library_per_prompt=0)
    with ExchangeClient(server.target) as see:
        assert see.publish([success(run_id, "policy-a", prompt_id="p/1")]).accepted == 1
        with pytest.raises(errors.FailedPrecondition, match="MRL_SUCCESS_LIBRARY_PER_PROMPT"):
            see.get_successes(run_id, "policy-b", ["p/1"])
    assert library_keys(redis_url, run_id) == []


def test_a_response_holds_whole_prompts_within_the_receive_limit_and_the_sdk_asks_for_the_rest(exchange, run_id):
    big = 20_000  # 64 KiB (the smallest receive limit) holds three, not four
    sent = {f"p/{i}": success(run_id, "policy-a", prompt_id=f"p/{i}", response_text="x" * big) for i in range(5)}
    more = success(run_id, "policy-a", prompt_id="p/0", response_text="y" * big)
    with ExchangeClient(exchange.target) as see, grpc.insecure_channel(exchange.target) as channel:
        assert see.publish(list(sent.values())).accepted == 5
        stub = exchange_pb2_grpc.ExperienceExchangeStub(channel)

        def ask(prompts):
            return stub.GetSuccesses(xpb.GetSuccessesRequest(run_id=run_id, subscriber="policy-b", prompt_ids=prompts,
                                                             max_response_bytes=64 << 10), timeout=10)
        reply = ask(list(sent))
        assert (reply.prompts_answered, reply.truncated) == (3, True)
        assert list(reply.successes) == [sent["p/0"], sent["p/1"], sent["p/2"]]
        assert see.publish([more, success(run_id, "policy-c", prompt_id="p/0", response_text="z" * big),
                            success(run_id, "policy-d", prompt_id="p/0", response_text="w" * big)]).accepted == 3
        reply = ask(["p/0", "p/1"])              # the first prompt alone does not fit: its newest that do
        assert (reply.prompts_answered, reply.truncated, len(reply.successes)) == (1, True, 3)
        with ExchangeClient(exchange.target, max_message_bytes=64 << 10) as small:
            got = small.get_successes(run_id, "policy-b", list(sent), producers=["policy-a"])
        assert got == [more, *sent.values()]
        huge = success(run_id, "policy-a", prompt_id="p/huge", response_text="h" * (100 << 10))
        assert see.publish([huge]).accepted == 1
        with pytest.raises(grpc.RpcError) as info:
            ask(["p/huge"])
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "max_response_bytes" in info.value.details()


def test_the_sdk_asks_for_more_prompts_than_one_request_carries_in_several(exchange, run_id):
    from mrl.exchange_client import SUCCESS_PROMPTS_PER_CALL
    prompts = [f"many/{i}" for i in range(SUCCESS_PROMPTS_PER_CALL + 44)]
    sent = [success(run_id, "policy-a", prompt_id=p) for p in prompts]
    with ExchangeClient(exchange.target) as see:
        assert see.publish(sent).accepted == len(sent)
        assert ids(see.get_successes(run_id, "policy-b", prompts)) == ids(sent)

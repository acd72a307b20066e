"""The exchange's own validation, over a raw gRPC stub (the SDK client validates before sending, so it
would hide the server's checks): each bad input is INVALID_ARGUMENT with a message naming the
problem, and a rejected batch appends nothing. Also the REST admin's answers to bad input."""
import math

import grpc
import httpx
import pytest

from helpers import rollout
from mrl.experience import new_experience
from mrl.v1 import exchange_pb2 as xpb
from mrl.v1 import exchange_pb2_grpc
from mrl.v1 import experience_pb2 as pb

MAX_BATCH, MAX_IN_FLIGHT_LIMIT, MAX_TOKENS = 4, 16, 64


@pytest.fixture(scope="module")
def ex(redis_url):
    """One exchange (auth off) for the module; every test works in its own run."""
    from servers import RunningExchange
    running = RunningExchange(redis_url, max_batch=MAX_BATCH, max_in_flight_limit=MAX_IN_FLIGHT_LIMIT,
                              default_max_in_flight=8, max_tokens=MAX_TOKENS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def channel(ex):
    with grpc.insecure_channel(ex.target) as ch:
        yield ch


@pytest.fixture
def stub(channel):
    return exchange_pb2_grpc.ExperienceExchangeStub(channel)


def streams(stub, run_id) -> list[tuple[int, str, int]]:
    """(kind, producer, length) of every stream of a run."""
    topics = stub.ListTopics(xpb.ListTopicsRequest(run_id=run_id), timeout=10).topics
    stats = stub.GetTopicStats(xpb.GetTopicStatsRequest(run_id=run_id), timeout=10).topics
    assert len(topics) == len(stats)
    return sorted((s.topic.kind, s.topic.producer, s.length) for s in stats)


def invalid(call, request, *fragments, **kw) -> str:
    """Make the call, expect INVALID_ARGUMENT whose details hold every fragment; return the details."""
    with pytest.raises(grpc.RpcError) as info:
        result = call(request, timeout=10, **kw)
        if hasattr(result, "__next__"):
            next(result)  # a server stream: the error comes instead of its first message
    exc = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
    for fragment in fragments:
        assert fragment in exc.details(), (fragment, exc.details())
    return exc.details()


# -- Publish: one bad experience in a batch → INVALID_ARGUMENT, nothing appended -------------------
def _set(**fields):
    def make(run_id):
        exp = rollout(run_id, "policy-b")
        for name, value in fields.items():
            setattr(exp, name, value)
        return exp
    return make


def _rollout(**fields):
    def make(run_id):
        exp = rollout(run_id, "policy-b")
        for name, value in fields.items():
            field = getattr(exp.rollout, name)
            if isinstance(value, list):
                del field[:]
                field.extend(value)
            else:
                setattr(exp.rollout, name, value)
        return exp
    return make


def _no_payload(run_id):
    exp = rollout(run_id, "policy-b")
    exp.ClearField("rollout")
    return exp


def _unknown_payload(run_id):
    """A payload of a newer schema: field 14 (length-delimited), unknown to this exchange."""
    exp = _no_payload(run_id)
    exp.MergeFromString(bytes([14 << 3 | 2, 2, 8, 1]))
    return exp


def _no_created_at(run_id):
    exp = rollout(run_id, "policy-b")
    exp.ClearField("created_at")
    return exp


def _group_stats(rewards):
    return lambda run_id: new_experience(run_id, "policy-b", 1, pb.GroupStats(prompt_id="p/0", group_id="g",
                                                                               rewards=rewards))


def _policy_stats_nan(run_id):
    return new_experience(run_id, "policy-b", 1, pb.PolicyStats(step=1, capability=math.nan))


BAD_EXPERIENCES = [
    pytest.param(_set(experience_id=""), ["experience_id", "missing or malformed"], id="missing-experience-id"),
    pytest.param(_set(experience_id="has spaces in it"), ["experience_id 'has spaces in it'"],
                 id="experience-id-with-spaces"),
    pytest.param(_set(experience_id="x" * 129), ["experience_id", "1-128"], id="experience-id-too-long"),
    pytest.param(_set(run_id="run-{x}"), ["run_id 'run-{x}' is not a valid name"], id="run-id-with-braces"),
    pytest.param(_set(run_id="run:x"), ["run_id 'run:x' is not a valid name"], id="run-id-with-colon"),
    pytest.param(_set(producer=""), ["producer '' is not a valid name"], id="missing-producer"),
    pytest.param(_set(producer="policy b"), ["producer 'policy b' is not a valid name"], id="producer-with-space"),
    pytest.param(_no_payload, ["has no payload"], id="no-payload"),
    pytest.param(_unknown_payload, ["has no payload", "newer schema"], id="unknown-payload-kind"),
    pytest.param(_set(schema_version=2), ["schema_version 2 is not supported"], id="schema-version-2"),
    pytest.param(_set(schema_version=0), ["schema_version 0 is not supported"], id="schema-version-0"),
    pytest.param(_no_created_at, ["created_at is not set"], id="missing-created-at"),
    pytest.param(_rollout(reward=math.nan), ["rollout.reward[0] is nan", "finite"], id="nan-reward"),
    pytest.param(_rollout(reward=math.inf), ["rollout.reward[0] is inf", "finite"], id="plus-inf-reward"),
    pytest.param(_rollout(reward=-math.inf), ["rollout.reward[0] is -inf"], id="minus-inf-reward"),
    pytest.param(_rollout(logprobs=[-0.5, math.nan, -0.5, -0.5]), ["rollout.logprobs[1] is nan"],
                 id="nan-logprob"),
    pytest.param(_rollout(logprobs=[-0.5, -0.5]), ["4 token_ids but 2 logprobs"],
                 id="token-ids-and-logprobs-lengths-differ"),
    pytest.param(_rollout(token_ids=list(range(MAX_TOKENS + 1)), logprobs=[]),
                 [f"{MAX_TOKENS + 1} token ids; at most {MAX_TOKENS}"], id="too-many-tokens"),
    pytest.param(_rollout(prompt_id=""), ["rollout.prompt_id must be 1-256 characters"], id="empty-prompt-id"),
    pytest.param(_group_stats([]), ["group_stats.rewards is empty"], id="empty-group-stats-rewards"),
    pytest.param(_group_stats([1.0, math.nan]), ["group_stats.rewards[1] is nan"], id="nan-group-stats-reward"),
    pytest.param(_policy_stats_nan, ["policy_stats[1] is nan"], id="nan-policy-stats"),
]


@pytest.mark.parametrize("make_bad, fragments", BAD_EXPERIENCES)
def test_publish_rejects_bad_experience_and_appends_nothing(stub, run_id, make_bad, fragments):
    stub.Publish(xpb.PublishRequest(experiences=[rollout(run_id, "policy-a")]), timeout=10)
    before = streams(stub, run_id)
    assert before == [(pb.EXPERIENCE_KIND_ROLLOUT, "policy-a", 1)]
    bad = make_bad(run_id)
    batch = [rollout(run_id, "policy-a"), rollout(run_id, "policy-b"), bad]  # the valid ones come first
    details = invalid(stub.Publish, xpb.PublishRequest(experiences=batch), *fragments)
    if bad.experience_id and " " not in bad.experience_id and len(bad.experience_id) <= 128:
        assert bad.experience_id in details  # the message says which experience is bad
    assert streams(stub, run_id) == before
    # The bad experience's id was not remembered either: once fixed, it is accepted (not a duplicate).
    good = rollout(run_id, "policy-b")
    assert stub.Publish(xpb.PublishRequest(experiences=[batch[1], good]), timeout=10).accepted == 2


def test_publish_rejects_empty_batch(stub, run_id):
    invalid(stub.Publish, xpb.PublishRequest(), "the batch is empty")


def test_publish_rejects_batch_over_max_batch(stub, run_id):
    batch = [rollout(run_id) for _ in range(MAX_BATCH + 1)]
    invalid(stub.Publish, xpb.PublishRequest(experiences=batch), f"holds {MAX_BATCH + 1} experiences",
            f"at most {MAX_BATCH}")
    assert streams(stub, run_id) == []
    assert stub.Publish(xpb.PublishRequest(experiences=batch[:MAX_BATCH]), timeout=10).accepted == MAX_BATCH


def test_publish_rejects_batch_mixing_two_runs(stub, run_id):
    other = f"{run_id}-b"
    batch = [rollout(run_id), rollout(run_id, "policy-b"), rollout(other)]
    invalid(stub.Publish, xpb.PublishRequest(experiences=batch), "a batch belongs to one run", repr(other))
    assert streams(stub, run_id) == [] and streams(stub, other) == []


def test_publish_rejects_non_utf8_text_as_invalid_argument(ex, stub, run_id):
    exp = rollout(run_id)
    exp.rollout.response_text = "ZZZZ"
    data = xpb.PublishRequest(experiences=[rollout(run_id, "policy-b"), exp]).SerializeToString()
    assert data.count(b"ZZZZ") == 1
    bad = data.replace(b"ZZZZ", b"\xff\xfe\xff\xfe")
    with grpc.insecure_channel(ex.target) as channel:
        raw = channel.unary_unary("/mrl.v1.ExperienceExchange/Publish", request_serializer=lambda b: b,
                                  response_deserializer=xpb.PublishResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            raw(bad, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (info.value.code(), info.value.details())
        assert "UTF-8" in info.value.details() and "mrl.v1.PublishRequest" in info.value.details()
        assert streams(stub, run_id) == []
        # The same bytes with valid text are accepted through the same raw path.
        assert raw(data, timeout=10).accepted == 2


def test_undecodable_bytes_are_invalid_argument_on_every_method(ex):
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length far beyond the message
    with grpc.insecure_channel(ex.target) as channel:
        for method in ("Publish", "Ack", "GetSuccesses", "ListTopics", "GetTopicStats"):
            call = channel.unary_unary(f"/mrl.v1.ExperienceExchange/{method}", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as info:
                call(garbage, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value.code())
            assert "could not decode" in info.value.details()
        stream = channel.unary_stream("/mrl.v1.ExperienceExchange/Subscribe", request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            next(stream(garbage, timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- Subscribe, Ack, ListTopics, GetTopicStats ----------------------------------------------------
def _subscribe(run, **fields):
    return xpb.SubscribeRequest(**{"run_id": run, "subscriber": "policy-a", **fields})


@pytest.mark.parametrize("fields, fragments", [
    pytest.param({"subscriber": "bad name"}, ["subscriber 'bad name' is not a valid name"], id="subscriber-space"),
    pytest.param({"subscriber": ""}, ["subscriber '' is not a valid name"], id="subscriber-missing"),
    pytest.param({"subscriber": "a:b"}, ["subscriber 'a:b'"], id="subscriber-colon"),
    pytest.param({"run_id": "run-{x}"}, ["run_id 'run-{x}' is not a valid name"], id="run-id-braces"),
    pytest.param({"kinds": [pb.EXPERIENCE_KIND_ROLLOUT, 99]}, ["unknown experience kind 99"], id="kind-99"),
    pytest.param({"kinds": [pb.EXPERIENCE_KIND_UNSPECIFIED]}, ["unknown experience kind 0"],
                 id="kind-unspecified"),
    pytest.param({"producers": ["policy-b", "x y"]}, ["producer 'x y' is not a valid name"],
                 id="producer-filter-bad-name"),
    pytest.param({"max_in_flight": MAX_IN_FLIGHT_LIMIT + 1},
                 [f"max_in_flight {MAX_IN_FLIGHT_LIMIT + 1} exceeds this exchange's limit {MAX_IN_FLIGHT_LIMIT}"],
                 id="max-in-flight-over-limit"),
    pytest.param({"start": 99}, ["start 99 is not a StartPosition"], id="start-99"),
    pytest.param({"visibility_timeout_ms": 1}, ["visibility_timeout_ms 1 must be between 100"],
                 id="visibility-timeout-1ms"),
])
def test_subscribe_rejects_bad_request(stub, run_id, fields, fragments):
    invalid(stub.Subscribe, _subscribe(run_id, **fields), *fragments)


def test_subscribe_accepts_the_limits_themselves(stub, run_id):
    """The counterpart of the cases above: max_in_flight at the limit is fine (first message: the id)."""
    call = stub.Subscribe(_subscribe(run_id, max_in_flight=MAX_IN_FLIGHT_LIMIT,
                                     kinds=[pb.EXPERIENCE_KIND_POLICY_STATS]), timeout=10)
    try:
        first = next(call)
        assert first.subscription_id and not first.deliveries
    finally:
        call.cancel()


@pytest.mark.parametrize("delivery_id", [
    pytest.param("garbage", id="no-colons"),
    pytest.param("rollout:policy-a", id="two-parts"),
    pytest.param("rollout:policy-a:1-0:extra", id="four-parts"),
    pytest.param("bogus:policy-a:1-0", id="unknown-kind"),
    pytest.param("rollout:policy-a:abc", id="entry-id-not-numeric"),
    pytest.param("rollout:policy-a:1-", id="entry-id-no-sequence"),
    pytest.param("rollout:bad name:1-0", id="producer-with-space"),
    pytest.param("", id="empty"),
])
def test_ack_rejects_malformed_delivery_id(stub, run_id, delivery_id):
    req = xpb.AckRequest(run_id=run_id, subscriber="policy-a", delivery_ids=["rollout:policy-b:1-0", delivery_id])
    invalid(stub.Ack, req, "delivery_id" if "bad name" not in delivery_id else "'bad name' is not a valid name")


@pytest.mark.parametrize("fields, fragment", [
    pytest.param({"subscriber": "bad name"}, "subscriber 'bad name'", id="bad-subscriber"),
    pytest.param({"run_id": "run:x"}, "run_id 'run:x'", id="bad-run-id"),
])
def test_ack_rejects_bad_names(stub, run_id, fields, fragment):
    req = xpb.AckRequest(**{"run_id": run_id, "subscriber": "policy-a", "delivery_ids": ["rollout:policy-b:1-0"],
                            **fields})
    invalid(stub.Ack, req, fragment)


def test_ack_of_well_formed_unknown_id_is_zero(stub, run_id):
    assert stub.Ack(xpb.AckRequest(run_id=run_id, subscriber="policy-a", delivery_ids=["rollout:policy-b:1-0"]),
                    timeout=10).acked == 0


def test_list_topics_and_stats_reject_bad_input(stub):
    invalid(stub.ListTopics, xpb.ListTopicsRequest(run_id="run-{x}"), "run_id 'run-{x}' is not a valid name")
    invalid(stub.ListTopics, xpb.ListTopicsRequest(run_id=""), "run_id '' is not a valid name")
    invalid(stub.GetTopicStats, xpb.GetTopicStatsRequest(run_id="a b"), "run_id 'a b' is not a valid name")
    invalid(stub.GetTopicStats, xpb.GetTopicStatsRequest(run_id="run-1", kind=99), "unknown experience kind 99")


# -- REST admin ------------------------------------------------------------------------------------
@pytest.fixture
def published(stub, run_id):
    stub.Publish(xpb.PublishRequest(experiences=[rollout(run_id, "policy-a") for _ in range(3)]), timeout=10)
    return run_id


@pytest.mark.parametrize("method, path, status, fragment", [
    pytest.param("POST", "/v1/runs/{R}/topics/rollout/policy-a/trim?maxlen=-1", 422, "maxlen",
                 id="trim-negative-maxlen-422"),
    pytest.param("POST", "/v1/runs/{R}/topics/rollout/policy-a/trim", 422, "maxlen", id="trim-no-maxlen-422"),
    pytest.param("POST", "/v1/runs/{R}/topics/rollout/policy-a/trim?maxlen=x", 422, "maxlen",
                 id="trim-maxlen-not-int-422"),
    pytest.param("POST", "/v1/runs/{R}/topics/bogus/policy-a/trim?maxlen=0", 400, "unknown experience kind",
                 id="trim-unknown-kind-400"),
    pytest.param("POST", "/v1/runs/{R}/topics/rollout/policy-z/trim?maxlen=0", 404, "no rollout stream",
                 id="trim-unknown-producer-404"),
    pytest.param("POST", "/v1/runs/{R}-unknown/topics/rollout/policy-a/trim?maxlen=0", 404, "has no rollout",
                 id="trim-unknown-run-404"),
    pytest.param("DELETE", "/v1/runs/{R}-unknown", 404, "has no data", id="delete-unknown-run-404"),
    pytest.param("GET", "/v1/runs/run-{{x}}/topics", 400, "not a valid name", id="topics-bad-run-id-400"),
    pytest.param("DELETE", "/v1/runs/run*", 400, "not a valid name", id="delete-glob-run-id-400"),
])
def test_rest_admin_rejects_bad_input(ex, stub, published, method, path, status, fragment):
    before = streams(stub, published)
    r = httpx.request(method, ex.admin + path.format(R=published), timeout=10)
    assert r.status_code == status, r.text
    assert fragment in r.text
    assert streams(stub, published) == before


def test_rest_trim_within_bounds_works(ex, stub, published):
    """The counterpart: a valid trim answers 200 and removes what it says."""
    r = httpx.post(f"{ex.admin}/v1/runs/{published}/topics/rollout/policy-a/trim", params={"maxlen": 1}, timeout=10)
    assert r.status_code == 200 and r.json() == {"removed": 2}
    assert streams(stub, published) == [(pb.EXPERIENCE_KIND_ROLLOUT, "policy-a", 1)]



@pytest.mark.parametrize("message", [pb.Rollout, pb.VerifiedSuccess])
def test_negative_token_ids_cannot_be_expressed(message):
    with pytest.raises(ValueError):
        message(token_ids=[3, -2])

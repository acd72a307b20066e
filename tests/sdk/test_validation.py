"""mrl.experience in-process: envelopes and the validation every experience passes before it is stored."""
import pytest

from helpers import one_of_each, rollout
from mrl.errors import InvalidArgument
from mrl.experience import SCHEMA_VERSION, Limits, kind_of, new_experience, validate, validate_name
from mrl.v1 import experience_pb2 as pb


def test_each_kind_validates_and_names_its_kind():
    assert [validate(e) for e in one_of_each("run-1")] == ["rollout", "group_stats", "success", "policy_stats"]


def test_new_experience_fills_the_envelope():
    exp = rollout("run-1")
    assert exp.schema_version == SCHEMA_VERSION and exp.HasField("created_at") and len(exp.experience_id) == 32
    assert kind_of(exp) == "rollout"
    with pytest.raises(InvalidArgument, match="not an experience kind"):
        new_experience("run-1", "p", 0, pb.Experience())


@pytest.mark.parametrize("name", ["", "-lead", "has space", "x" * 65, "ünï"])
def test_bad_names_are_refused(name):
    with pytest.raises(InvalidArgument, match="not a valid name"):
        validate_name("run_id", name)


def _broken(change) -> pb.Experience:
    exp = rollout("run-1")
    change(exp)
    return exp


@pytest.mark.parametrize("change, message", [
    (lambda e: setattr(e, "experience_id", ""), "experience_id"),
    (lambda e: setattr(e, "experience_id", "bad id!"), "experience_id"),
    (lambda e: setattr(e, "run_id", "bad run"), "run_id"),
    (lambda e: setattr(e, "schema_version", SCHEMA_VERSION + 1), "schema_version"),
    (lambda e: e.ClearField("created_at"), "created_at"),
    (lambda e: setattr(e.rollout, "prompt_id", ""), "prompt_id"),
    (lambda e: setattr(e.rollout, "prompt_id", "p" * 1000), "prompt_id"),
    (lambda e: setattr(e.rollout, "reward", float("nan")), "finite"),
    (lambda e: e.rollout.logprobs.append(-1.0), "one behaviour log-prob per token id"),
    (lambda e: e.rollout.logprobs.__setitem__(0, float("-inf")), "finite"),
])
def test_each_rule_refuses_with_a_message_naming_the_field(change, message):
    with pytest.raises(InvalidArgument, match=message):
        validate(_broken(change))


def test_size_limits_name_their_setting():
    with pytest.raises(InvalidArgument, match="MRL_MAX_EXPERIENCE_BYTES"):
        validate(rollout("run-1", n_tokens=200), Limits(max_experience_bytes=100))
    with pytest.raises(InvalidArgument, match="at most 10"):
        validate(rollout("run-1", n_tokens=11), Limits(max_tokens=10))


def test_empty_group_stats_and_logprob_free_rollouts():
    stats = new_experience("run-1", "p", 0, pb.GroupStats(prompt_id="x/1", group_id="g"))
    with pytest.raises(InvalidArgument, match="rewards is empty"):
        validate(stats)
    exp = rollout("run-1")
    del exp.rollout.logprobs[:]
    assert validate(exp) == "rollout"       # behaviour log-probs are optional

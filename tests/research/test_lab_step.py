"""`mrl lab step` on SmolLM2-135M-Instruct (which adds 1-digit numbers, so its first batch has a signal): every rule
updates from the same weights on the same batch, plain gradient descent moves the weights by η times the clipped
gradient's norm, and a policy with no signal in its first batches is refused with a reason."""
import contextlib
import io
import json
import math

import pytest
import yaml

from helpers import tiny_config
from mrl.assets import tokenizer_cache_dir
from mrl.cli import main
from mrl_research.lab.step import TUNING_FROM, measure_step, parse_rule
from mrl_trainer.errors import TrainerError


def test_rules_are_read_or_refused():
    assert parse_rule("adamw:2e-5") == ("adamw", 2e-5) and parse_rule("sgd:0.1") == ("sgd", 0.1)
    for bad in ("adam:1e-5", "sgd", "sgd:-1", "sgd:x", "adamw:nan"):
        with pytest.raises(TrainerError, match="write adamw:LR or sgd:LR"):
            parse_rule(bad)


def _config(tmp_path, **settings):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / "run", **settings)))
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_rule_steps_from_the_same_weights_on_the_same_batch(tmp_path):
    smollm2 = next((tokenizer_cache_dir() / "smollm2").glob("*.gguf"))
    config = _config(tmp_path, model={"source": "gguf", "path": str(smollm2)}, **{
        "rollout.group_size": 4, "rollout.max_new_tokens": 12, "loss.micro_batch_tokens": 4096})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["lab", "step", config, "--rules", "sgd:0.01,adamw:1e-5,sgd:0.01", "--problems", "4",
              "--out", str(tmp_path / "step.json")])
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "step.json").read_text())
    assert result["rewarded"] and result["verified_samples"] >= len(result["rewarded"])
    assert result["tuning_problems"] == 4
    assert all(int(i.rsplit(":", 1)[1]) < 2 * 16 for i in result["rewarded"])      # found in the first batches
    none, sgd, adamw, again = result["rows"]
    assert [r["rule"] for r in result["rows"]] == ["none", "sgd:0.01", "adamw:1e-5", "sgd:0.01"]
    assert none["moved"] == 0 and none["grad_norm"] is None
    assert all(0 <= r["p_rewarded"] <= 1 and 0 <= r["p_tuning"] <= 1 for r in result["rows"])
    # restored before each rule: the same rule twice is the same update
    assert again == sgd
    assert sgd["moved"] == pytest.approx(0.01 * min(sgd["grad_norm"], 1.0), rel=1e-3)
    assert sgd["p_rewarded"] != none["p_rewarded"]
    assert 0 < adamw["moved"] <= 1e-5 * math.sqrt(200e6)       # AdamW's first step: about lr per coordinate


def test_a_policy_with_no_signal_is_refused(tmp_path):
    with pytest.raises(TrainerError, match="none of the first 2 training batches"):
        measure_step(_config(tmp_path), ["sgd:0.1"], search=2)
    assert TUNING_FROM > 10_000

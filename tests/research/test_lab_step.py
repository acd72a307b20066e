"""`mrl lab step` on SmolLM2-135M-Instruct (which adds 1-digit numbers, so its first batch has a signal): every rule
updates from the same weights on the same batch, plain gradient descent moves the weights by η times the clipped
gradient's norm; --curve traces solo steps; bad rules, a policy with no signal in its next batches and a dataset task
(whose training split wraps onto the run's prompts) are refused with a reason."""
import contextlib
import io
import json
import math

import pytest
import yaml

from helpers import tiny_config
from mrl.assets import tokenizer_cache_dir
from mrl.cli import main
from mrl_research.lab.step import TUNING_FROM, measure_curve, measure_step, parse_rule
from mrl_trainer.errors import TrainerError


def test_rules_are_read_or_refused():
    assert parse_rule("adamw:2e-5") == ("adamw", 2e-5) and parse_rule("sgd:0.1") == ("sgd", 0.1)
    for bad in ("adam:1e-5", "sgd", "sgd:-1", "sgd:x", "adamw:nan", "adamw:inf", "sgd:1e400"):
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


def test_a_policy_with_no_signal_and_bad_input_are_refused(tmp_path, capsys):
    config = _config(tmp_path)
    with pytest.raises(TrainerError, match="none of the 2 training batches from step 0"):
        measure_step(config, ["sgd:0.1"], search=2)
    with pytest.raises(TrainerError, match="at least one rule"):
        measure_step(config, [])
    with pytest.raises(TrainerError, match="at least one tuning problem"):
        measure_step(config, ["sgd:0.1"], problems=0)
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "step", config, "--rules", "adamw:inf"])
    assert exit_.value.code == 2 and "write adamw:LR or sgd:LR" in capsys.readouterr().err
    rows = tmp_path / "tiny.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(20)))
    with pytest.raises(TrainerError, match="is a dataset"):
        measure_curve(_config(tmp_path, task={"family": "jsonl", "path": str(rows)}), 1)


def test_the_curve_traces_the_tuning_answers_over_solo_steps(tmp_path):
    result = measure_curve(_config(tmp_path), 2, problems=3)
    assert [r["step"] for r in result["rows"]] == [0, 1, 2]
    assert result["rows"][0]["reward_mean"] is None and result["tuning_problems"] == 3
    assert all(0 <= r["p_tuning"] <= 1 and r["p_tuning_parts"] == {} for r in result["rows"])
    # random weights solve nothing: no update, so the tuning answers stay exactly where they were
    assert [r["updated"] for r in result["rows"][1:]] == [False, False]
    assert result["rows"][2]["p_tuning"] == result["rows"][0]["p_tuning"]
    assert TUNING_FROM > 1000 * 64          # past the prompts of any run of up to a thousand 64-prompt steps
    mixture = {"family": "mixture", "parts": [{"family": "arithmetic", "level": 1}, {"family": "linear", "level": 1}]}
    parts = measure_curve(_config(tmp_path, task=mixture), 1, problems=4)["rows"][0]["p_tuning_parts"]
    assert list(parts) == ["arithmetic-L1", "linear-L1"] and all(0 <= p <= 1 for p in parts.values())

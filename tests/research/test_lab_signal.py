"""`mrl lab signal` on a tiny real policy (GPT-2 architecture over the real GPT-2 tokenizer): a greedy row per
length and a row per (T, L); a sampled row is exactly what the trainer's own rollout draws with that setting in
its config, a greedy row the engine's greedy decoding; a resumed policy is measured on its next step's prompts;
the informative shares by hand; bad input is refused with a clear message before any model is built."""
import contextlib
import io
import json

import pytest
import yaml

from helpers import tiny_config
from mrl.cli import main
from mrl_research.lab.grpo_signal import expected_informative, informative_share, measure
from mrl_trainer.config import TrainerConfig
from mrl_trainer.app import run
from mrl_trainer.errors import TrainerError
from mrl_trainer.rollout.hf import HFEngine
from mrl_trainer.trainer import build_trainer


def _config(tmp_path, **overrides):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, **{"rollout.group_size": 4, **overrides})))
    return path


def test_informative_shares_by_hand():
    groups = [[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.5, 0.0, 0.0, 0.0]]
    assert informative_share(groups) == 0.5
    # p = 0, 1/4, 1, 0 (a reward of 0.5 is no success): 1 − p^4 − (1 − p)^4 = 0, 1 − 1/256 − 81/256, 0, 0
    assert expected_informative(groups) == pytest.approx((1 - 1 / 256 - 81 / 256) / 4)


def _reference_ids(tmp_path, name, problems, step=0, **settings) -> list[list[int]]:
    """The token ids the trainer's own rollout samples for the tiny config's training prompts of `step`, with
    `settings` in its config."""
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path / name, **settings)))
    try:
        batch = trainer.rollout(step, trainer.task.batch(step, problems))
    finally:
        trainer.close()
    return [s.ids for group in batch.samples for s in group]


@pytest.fixture
def sampled(monkeypatch) -> list:
    """Every HF engine call's (n, temperature, max_new_tokens, the sampled ids), in order (the engine still runs)."""
    calls, generate = [], HFEngine.generate

    def spy(self, prompts, n, params):
        groups = generate(self, prompts, n, params)
        calls.append((n, params.temperature, params.max_new_tokens, [s.ids for g in groups for s in g]))
        return groups
    monkeypatch.setattr(HFEngine, "generate", spy)
    return calls


def test_rows_per_setting_are_the_trainers_own_rollouts(tmp_path, sampled):
    path = _config(tmp_path)
    result = measure(str(path), [1.0, 0.5], [4, 6], prompts=3)
    rows = result["rows"]
    settings = [(0.0, 4, 1), (0.0, 6, 1), (1.0, 4, 4), (1.0, 6, 4), (0.5, 4, 4), (0.5, 6, 4)]
    assert [(r["temperature"], r["max_new_tokens"], r["group_size"]) for r in rows] == settings
    assert [(t, L, n) for n, t, L, _ in sampled] == settings        # what the engine was asked for
    for row in rows:
        assert row["samples"] == 3 * row["group_size"]
        assert 0.0 <= row["success"] <= 1.0 and 0.0 <= row["truncated"] <= 1.0
        assert 0 < row["tokens"] <= row["max_new_tokens"]
    assert result["policy"] == "tiny" and result["prompts"] == 3 and result["group_size"] == 4
    assert result["step"] == 0 and result["resumed_from"] is None
    assert rows[1]["informative"] == 0.0 == rows[1]["expected"]     # one greedy response per prompt
    # a sampled row draws what the trainer draws with that temperature and length in its config
    measured = [ids for *_, ids in sampled]
    assert measured[4] == _reference_ids(tmp_path, "T0.5", 3, **{"rollout.group_size": 4,
                                                                 "rollout.temperature": 0.5,
                                                                 "rollout.max_new_tokens": 4})
    assert measured[4] != measured[2]                               # and the temperature did change the draw
    assert not (tmp_path / "ckpt").exists()       # nothing trained, published or checkpointed


def test_a_resumed_policy_is_measured_on_the_prompts_of_its_next_step(tmp_path, sampled):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path, **{"steps": 1, "checkpoint.every": 1})))
    run(str(path))
    del sampled[:]
    result = measure(str(path), [1.0], prompts=2)
    assert result["resumed_from"] is not None and result["step"] == 1
    assert sampled[-1][3] == _reference_ids(tmp_path, "", 2, step=1, steps=1)   # the checkpoint's policy, step 1


def test_the_command_prints_a_line_per_row_and_ends_with_one_json_line(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["lab", "signal", str(_config(tmp_path)), "--temperatures", "1.0", "--max-new-tokens", "5",
              "--prompts", "2", "--set", "seed=4"])
    lines = out.getvalue().strip().splitlines()
    assert lines[0].split()[:3] == ["greedy", "L", "5"] and lines[1].split()[:2] == ["T", "1"]
    assert [r["temperature"] for r in json.loads(lines[-1])["rows"]] == [0.0, 1.0]


@pytest.mark.parametrize("temperatures, lengths, prompts, message", [
    ([], None, 2, "no temperature given"), ([0.0], None, 2, "temperature 0.0: Input should be greater than 0"),
    ([float("nan")], None, 2, "temperature nan: Input should be a finite number"),
    ([1.0], [], 2, "no max_new_tokens given"),
    ([1.0], [0], 2, "max_new_tokens 0: Input should be greater than or equal to 1"),
    ([1.0], [40000], 2, "max_new_tokens 40000: Input should be less than or equal to 32768"),
    ([1.0], None, 0, "at least one prompt")])
def test_bad_settings_are_refused_before_the_model_is_built(tmp_path, temperatures, lengths, prompts, message):
    with pytest.raises(TrainerError, match=message):
        measure(str(tmp_path / "no-such.yaml"), temperatures, lengths, prompts=prompts)


def test_a_malformed_list_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "signal", str(_config(tmp_path)), "--temperatures", "hot,cold"])
    assert exit_.value.code == 2
    assert "expected comma-separated floats" in capsys.readouterr().err

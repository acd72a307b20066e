"""`mrl lab signal` on a tiny real policy (GPT-2 architecture over the real GPT-2 tokenizer): a greedy row per
length and a row per (T, L); a row's samples are exactly what the trainer's own rollout draws; the informative
shares by hand; bad input is refused with a clear message before any model is built."""
import contextlib
import io
import json

import pytest
import yaml

from helpers import tiny_config
from mrl.cli import main
from mrl_launcher.lab.grpo_signal import expected_informative, informative_share, measure
from mrl_trainer.config import TrainerConfig
from mrl_trainer.errors import TrainerError
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


def test_rows_per_setting_are_the_trainers_own_rollouts(tmp_path):
    path = _config(tmp_path)
    result = measure(str(path), [1.0, 0.5], [4, 6], prompts=3)
    rows = result["rows"]
    assert [(r["temperature"], r["max_new_tokens"], r["group_size"]) for r in rows] == [
        (0.0, 4, 1), (0.0, 6, 1), (1.0, 4, 4), (1.0, 6, 4), (0.5, 4, 4), (0.5, 6, 4)]
    for row in rows:
        assert row["samples"] == 3 * row["group_size"]
        assert 0.0 <= row["success"] <= 1.0 and 0.0 <= row["truncated"] <= 1.0
        assert 0 < row["tokens"] <= row["max_new_tokens"]
    assert all(r["informative"] == 0.0 == r["expected"] for r in rows[:2])    # one greedy response per prompt
    assert result["policy"] == "tiny" and result["prompts"] == 3 and result["group_size"] == 4
    # the row at the config's own settings (T 1.0, L 6) is the trainer's rollout of the first 3 training prompts
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path / "again", **{"rollout.group_size": 4})))
    try:
        batch = trainer.rollout(0, trainer.task.batch(0, 3))
    finally:
        trainer.close()
    samples = [s for group in batch.samples for s in group]
    assert rows[3]["tokens"] == sum(len(s.ids) for s in samples) / len(samples)
    assert rows[3]["success"] == sum(r for group in batch.rewards for r in group) / len(samples)
    assert not (tmp_path / "ckpt").exists()       # nothing trained, published or checkpointed


def test_the_command_prints_a_line_per_row_and_ends_with_one_json_line(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["lab", "signal", str(_config(tmp_path)), "--temperatures", "1.0", "--max-new-tokens", "5",
              "--prompts", "2", "--set", "seed=4"])
    lines = out.getvalue().strip().splitlines()
    assert lines[0].split()[:3] == ["greedy", "L", "5"] and lines[1].split()[:2] == ["T", "1"]
    assert [r["temperature"] for r in json.loads(lines[-1])["rows"]] == [0.0, 1.0]


@pytest.mark.parametrize("temperatures, lengths, prompts, message", [
    ([0.0], None, 2, "each > 0"), ([], None, 2, "at least one"), ([1.0], [0], 2, "each ≥ 1"),
    ([1.0], None, 0, "at least one prompt")])
def test_bad_settings_are_refused_before_the_model_is_built(tmp_path, temperatures, lengths, prompts, message):
    with pytest.raises(TrainerError, match=message):
        measure(str(tmp_path / "no-such.yaml"), temperatures, lengths, prompts=prompts)


def test_a_malformed_list_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "signal", str(_config(tmp_path)), "--temperatures", "hot,cold"])
    assert exit_.value.code == 2
    assert "expected comma-separated floats" in capsys.readouterr().err

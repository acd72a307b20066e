"""Smoke test of `mrl bench trainer --quick`: both sides run end to end and it ends with its JSON line."""
import pytest

from helpers import run_quick_bench

SIDE_KEYS = ("rollout_s", "update_s", "step_s", "rollout_tokens_per_s", "tokens_per_step", "prompt_tokens",
             "peak_rss_mb")


@pytest.mark.slow
def test_bench_trainer_quick_ends_with_one_json_line(tmp_path):
    result = run_quick_bench("trainer", tmp_path, timeout_s=300)
    assert (result["P"], result["G"], result["T"], result["steps"]) == (1, 4, 8, 1)
    for side in ("mrl", "trl"):
        for key in SIDE_KEYS:
            assert result[side][key] > 0, (side, key)
        assert result[side]["threads"] == result["threads"]
        assert result[side]["signal"] == 1.0, side          # every group had unequal rewards: the update ran
        assert result[side]["update_s"] < result[side]["step_s"]
    assert result["mrl"]["prompt_tokens"] == result["trl"]["prompt_tokens"]   # the same chat-templated prompts
    for key in ("ratio_step_vs_trl", "ratio_rollout_vs_trl", "ratio_update_vs_trl", "ratio_peak_rss_vs_trl"):
        assert result[key] > 0, key
    assert result["target"] == "<= 1.0" and result["met"] == (result["ratio_step_vs_trl"] <= 1.0)

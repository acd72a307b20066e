"""Smoke test of `mrl bench trainer --quick`: both sides run end to end and it ends with its JSON line."""
import json
import subprocess
import sys

import pytest

SIDE_KEYS = ("rollout_s", "update_s", "step_s", "rollout_tokens_per_s", "tokens_per_step", "prompt_tokens",
             "peak_rss_mb")


@pytest.mark.slow
def test_bench_trainer_quick_ends_with_one_json_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mrl.cli", "bench", "trainer", "--quick"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "trainer" and result["quick"] is True and result["machine"]
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

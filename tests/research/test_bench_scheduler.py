"""Smoke test of `mrl bench scheduler --quick`: it runs end to end and ends with its JSON line."""
import pytest

from helpers import run_quick_bench


@pytest.mark.slow
def test_bench_scheduler_quick_ends_with_one_json_line(tmp_path):
    result = run_quick_bench("scheduler", tmp_path, timeout_s=180)
    assert [r["gpus"] for r in result["runs"]] == [8, 64]
    for run in result["runs"]:
        for system in ("mrl", "fifo"):
            r = run[system]
            assert r["deadlocks"] == 0 and r["ops"] > 0 and 0 < r["utilization"] <= 1 and 0 < r["jain"] <= 1
        assert run["mrl"]["jain"] > run["fifo"]["jain"]  # fair share beats FIFO on the weights
    assert result["grpc"]["ops"] > 0 and result["grpc"]["deadlocks"] == 0
    assert result["targets"] == {"utilization": 0.95, "jain": 0.95, "ops_per_s": 5000}
    assert set(result["pass"]) == {"utilization", "jain", "ops_per_s", "deadlocks"}
    assert all(isinstance(v, bool) for v in result["pass"].values())

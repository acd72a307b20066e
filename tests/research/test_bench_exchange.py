"""Smoke test of `mrl bench exchange --quick`: it runs end to end and ends with its JSON line."""
import pytest

from helpers import run_quick_bench


@pytest.mark.slow
def test_bench_exchange_quick_ends_with_one_json_line(tmp_path):
    result = run_quick_bench("exchange", tmp_path, timeout_s=120)
    assert result["experiences"] > 0 and result["experience_bytes"] > 900
    for key in ("mrl_exp_per_s", "raw_redis_exp_per_s", "ratio", "p50_ms", "p99_ms", "half_load_exp_per_s",
                "p99_ms_at_half_load"):
        assert result[key] > 0, key
    assert result["p50_ms"] <= result["p99_ms"]
    assert result["targets"] == {"ratio": 0.5, "p99_ms_at_half_load": 10}
    assert set(result["pass"]) == {"ratio", "p99_ms_at_half_load"}
    assert all(isinstance(v, bool) for v in result["pass"].values())

"""`mrl bench exchange --replicas 2`, tiny: one and two replicas measured in the same run, in its JSON line."""
import subprocess
import sys

import pytest

from helpers import run_quick_bench

pytestmark = pytest.mark.scale


def test_bench_exchange_reports_one_and_two_replicas(tmp_path):
    result = run_quick_bench("exchange", tmp_path, 50, "--replicas", "2")
    assert result["replicas"] == 2 and result["replica_anchor"] == "1 replica, same run"
    one, two = result["replica_exp_per_s"]["1"], result["replica_exp_per_s"]["2"]
    assert one == result["mrl_exp_per_s"] and one > 0 and two > 0
    assert result["replica_ratio"] == pytest.approx(two / one, abs=1e-3)
    assert result["cores"] > 0 and result["replica_note"]
    assert set(result["replica_p99_ms"]) == {"1", "2"}


def test_bench_exchange_refuses_a_replica_count_out_of_range(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mrl.cli", "bench", "exchange", "--replicas", "0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "--replicas 0: run 1 to 8 exchange replicas" in proc.stderr

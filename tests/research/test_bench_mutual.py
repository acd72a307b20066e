"""`mrl bench mutual`: its window arithmetic, its checks before anything starts, and `--quick` end to end (the
demo's two real policies under run_topology: embedded Redis, the exchange, THL, the scheduler, two trainers)."""
import json
import subprocess
import sys
import tomllib

import pytest

from helpers import ROOT
from mrl_research.bench.mutual import _figures, main
from mrl_launcher.errors import LauncherError
from mrl_launcher.topology import validate_trainers

MUTUAL = ROOT / "examples" / "mutual.yaml"


def test_steps_per_minute_count_each_step_for_its_share_inside_the_window():
    steps = [{"time": 105.0, "step_s": 10.0, "rollout_s": 6.0, "update_s": 3.0, "active": 0.25,   # half inside
              "tokens": 90, "cpu_s": 8.0, "update_own_s": 2.0, "update_peer_s": 0.0},
             {"time": 120.0, "step_s": 15.0, "rollout_s": 8.0, "update_s": 5.0, "active": 0.75, "tokens": 110,
              "update_own_s": 3.0, "update_peer_s": 1.0, "peer_wait_s": 4.0, "peer_samples": 8},
             {"time": 140.0, "step_s": 20.0}]          # half inside
    figures = _figures(steps + [{"time": 129.0, "step_s": 1.0, "rollout_s": 1.0, "update_s": 0.0, "skipped": 1.0}],
                       100.0, 130.0)
    assert figures["active_mean"] == pytest.approx(1.0 / 3, abs=1e-3)   # a skipped update trained on no sample
    assert figures["update_own_s_mean"] == pytest.approx(5.0 / 3, abs=1e-3)    # and took no time
    figures = _figures(steps, 100.0, 130.0)
    assert figures["steps_per_min"] == pytest.approx(60 * 2.0 / 30)
    assert figures["steps"] == 2 and figures["peer_wait_s_mean"] == 4.0 and figures["peer_samples"] == 8
    assert (figures["rollout_s_mean"], figures["update_s_mean"], figures["active_mean"]) == (7.0, 4.0, 0.5)
    assert figures["tokens_mean"] == 100.0 and figures["cpu_s_mean"] == 8.0
    assert (figures["update_own_s_mean"], figures["update_peer_s_mean"]) == (2.5, 0.5)   # where the update's went
    assert figures["exchange_s_mean"] == 1.5                # (10 − 6 − 3 + 15 − 8 − 5) / 2: the rest of the steps
    assert "sgt_accepted" not in figures and "peers_complete_mean" not in figures


def test_arms_must_include_alone_the_ratios_reference():
    with pytest.raises(LauncherError, match="includes alone"):
        main(arms="lockstep,async", topology=str(MUTUAL))


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_a_window_that_is_not_a_positive_number_of_seconds_is_refused(seconds):
    with pytest.raises(LauncherError, match="--seconds"):
        main(seconds=seconds, topology=str(MUTUAL))


def test_a_setting_a_trainer_refuses_is_an_error_before_anything_starts(tmp_path):
    import yaml
    config = {**yaml.safe_load(MUTUAL.read_text()), "data_dir": str(tmp_path)}
    metrics = validate_trainers(config, MUTUAL.parent, {"eval.every": 0})
    assert metrics == {p: tmp_path / p / "metrics.jsonl" for p in ("policy-a", "policy-b")}
    with pytest.raises(LauncherError, match="no_such_knob"):
        validate_trainers(config, MUTUAL.parent, {"sharing.no_such_knob": 1})
    assert not (tmp_path / "redis").exists()


def _quick(tmp_path, arms: str, *more: str) -> dict:
    """`mrl bench mutual --quick --arms ARMS [MORE]` through the command registry (research/pyproject.toml's entry
    point)."""
    declared = tomllib.loads((ROOT / "research" / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["mrl.commands"]["bench.mutual"] == "mrl_research.cli:bench_mutual"
    code = ("from mrl.cli import build_parser; from mrl_research.cli import bench_mutual; args = build_parser("
            f"{{'bench.mutual': bench_mutual}}).parse_args(['bench', 'mutual', '--quick', '--arms', {arms!r}, "
            f"'--topology', {str(MUTUAL)!r}, *{list(more)!r}]); args.run(args)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=270)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "mutual" and result["quick"] is True and result["machine"] and result["cores"] >= 1
    assert result["threads_per_trainer"] == 1 and result["seconds"] == 10.0 and result["arms"] == arms.split(",")
    assert result["frozen"] is ("--frozen" in more)
    assert {result["fast"], result["slow"]} == {"policy-a", "policy-b"}
    for arm in result["arms"]:
        for policy in ("policy-a", "policy-b"):
            figures = result[arm]["policies"][policy]
            assert figures["steps"] >= 1 and figures["steps_per_min"] > 0, (arm, policy)
    for arm in result["arms"][1:]:
        for side in ("fast", "slow"):
            policy = result[side]
            expected = result[arm]["policies"][policy]["steps_per_min"] / result["alone"]["policies"][policy]["steps_per_min"]
            assert result[arm][f"{side}_ratio_vs_solo"] == pytest.approx(expected, abs=1e-3)
            assert result[arm][f"{side}_tokens_ratio_vs_solo"] > 0
    assert all("peer_wait_s_mean" not in f for f in result["alone"]["policies"].values())   # mode none: no peers
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_mutual_quick_runs_every_arm(tmp_path):
    result = _quick(tmp_path, "alone,lockstep,async")
    lockstep = result["lockstep"]["policies"]
    assert all(f["peers_complete_mean"] > 0 and f["peer_wait_s_mean"] >= 0 for f in lockstep.values())
    assert lockstep["policy-b"]["peer_samples"] > 0          # HACPO took policy-a's rollouts (through THL)
    assert "sgt_accepted" in lockstep["policy-a"]            # SGT ran (accepting needs a verified peer success)
    assert all(f["peer_wait_s_mean"] < 0.5 for f in result["async"]["policies"].values())     # nobody waits


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_mutual_frozen_runs_the_policies_at_lr_0(tmp_path):
    """--frozen: every trainer at loss.lr 0 (the trainer keeps its weights: test_trainer_loop), so that the arms
    differ in what coupling and sharing cost and not in what the policies learn."""
    result = _quick(tmp_path, "alone,async", "--frozen")
    assert result["async"]["policies"]["policy-b"]["steps"] >= 1

"""The trainer across devices (mrl_trainer.distributed): FSDP2 under torchrun, gloo on CPU.

The trainer's update of a step, in every sharing mode with its guard, sharded over 2 ranks equals the single
process's; a sharded checkpoint resumes at the same and at another world size. tests/scale/test_torchrun_trainer.py
runs the whole trainer."""
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

from mrl_trainer.update import TIMINGS

pytestmark = [pytest.mark.scale, pytest.mark.slow]

WORKER = pathlib.Path(__file__).with_name("fsdp_worker.py")
# Means the own loss reports per micro-batch (clip fractions, ratio): a rank's share of a micro-batch weighs them
# by its sequences, not its tokens, so they agree with the single process's only roughly (within 0.02 here).
ROUGH = {"ratio_mean", "clip_low", "clip_high"}


def run_worker(ranks: int, out: pathlib.Path, *options: str) -> dict:
    """The worker alone (ranks 0) or under torchrun with `ranks` ranks; its results."""
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks else []
    args = [sys.executable, *launch, str(WORKER), "--out", str(out), *options]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "exitcode: -6" in proc.stderr:
        # A gloo rank aborted ("terminate called without an active exception", SIGABRT) once in a full-suite
        # run and never alone; not understood yet (see docs/limitations.md): one more try, then fail. The aborted
        # try's output is kept as a warning, so that a passing run still shows it.
        warnings.warn(f"an FSDP worker aborted (SIGABRT); retried once. Its output:\n{proc.stderr[-4000:]}")
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def assert_same(a: dict, b: dict, atol: float | None = 1e-5) -> None:
    """Every mode's parameters agree within atol (and rtol 1e-4); atol None: bit for bit."""
    assert a.keys() == b.keys()
    for mode in a:
        for name in a[mode]["params"]:
            x, y = a[mode]["params"][name], b[mode]["params"][name]
            if atol is None:
                assert torch.equal(x, y), f"{mode}: {name} differs"
            else:
                torch.testing.assert_close(x, y, rtol=1e-4, atol=atol, msg=f"{mode}: {name}")


@pytest.mark.timeout(480)       # four runs of the worker, two of them under torchrun (about 100 s when quiet)
def test_the_update_sharded_over_two_ranks_is_the_single_process_update(tmp_path):
    single = run_worker(0, tmp_path / "single.pt")
    one = run_worker(1, tmp_path / "one.pt")
    two = run_worker(2, tmp_path / "two.pt")
    assert_same(single, one, atol=None)        # FSDP over one rank: the same arithmetic, bit for bit
    assert_same(single, two)                   # over two: the same update, summed in another order
    for mode in single:
        for a, b in zip(single[mode]["stats"], two[mode]["stats"]):
            assert a.keys() == b.keys(), mode
            for name, value in a.items():
                if name in TIMINGS:                 # seconds, not arithmetic
                    continue
                if name in ROUGH:
                    assert b[name] == pytest.approx(value, abs=2e-2), (mode, name)
                elif isinstance(value, float) and value == value:
                    assert b[name] == pytest.approx(value, rel=1e-4, abs=1e-6), (mode, name)
    assert single["sgt"]["stats"][-1]["extras"] > 0 and single["xgrpo"]["stats"][-1]["guard_projected"] > 0
    initial = run_worker(0, tmp_path / "initial.pt", "--steps", "0")
    for mode in single:                         # every mode's update moved the weights
        assert not torch.equal(initial[mode]["params"]["lm_head.weight"], single[mode]["params"]["lm_head.weight"])


@pytest.mark.timeout(300)
def test_at_no_trust_the_sharded_update_takes_solos_steps_and_no_other(tmp_path):
    """Every guard at τ = 0, over 2 ranks: the second mini-batch is uniform (solo takes no step on it) and carries
    peer experience. Every mode takes solo's optimizer steps only (the ranks agree to skip: the guard's inner
    products are summed over them) and ends where solo does, to rounding; a step more would move it by ~lr."""
    two = run_worker(2, tmp_path / "two.pt", "--untrusted", "--steps", "3")
    solo = two["none"]
    for mode in two:
        assert [s["updates"] for s in two[mode]["stats"]] == [s["updates"] for s in solo["stats"]] == [1, 1, 1], mode
    assert_same(two, {mode: solo for mode in two})


@pytest.mark.timeout(480)
def test_a_sharded_checkpoint_resumes_at_the_same_and_at_another_world_size(tmp_path):
    mode = ("--modes", "sgt")
    straight = run_worker(0, tmp_path / "straight.pt", "--steps", "2", *mode)       # the run that never stopped
    for saved, resumed in [(2, 2), (2, 1), (1, 2)]:
        ckpt = tmp_path / f"ckpt-{saved}"
        if not ckpt.exists():
            run_worker(saved, tmp_path / "first.pt", "--steps", "1", "--save", str(ckpt), *mode)
        after = run_worker(resumed, tmp_path / "resumed.pt", "--steps", "1", "--resume", str(ckpt), *mode)
        # model and optimizer state came back. The summation order differs with the world size, and AdamW turns
        # float noise in a gradient that is zero in exact arithmetic (the attention's key bias) into steps of up
        # to lr (1e-3)
        assert_same(straight, after, atol=1e-5)


def test_resuming_from_a_folder_without_a_checkpoint_says_so(tmp_path):
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(WORKER),
            "--steps", "1", "--out", str(tmp_path / "x.pt"), "--resume", str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "holds no distributed checkpoint" in proc.stderr

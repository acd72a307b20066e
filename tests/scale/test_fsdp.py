"""The trainer's update across devices (mrl_trainer.distributed): FSDP2 under torchrun, gloo on CPU. A 2-rank
update equals the 1-rank update on the same global batch, and a checkpoint written at one world size resumes at
the other, continuing exactly as the run that never stopped."""
import pathlib
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.scale, pytest.mark.slow]

WORKER = pathlib.Path(__file__).with_name("fsdp_worker.py")


def torchrun(ranks: int, out: pathlib.Path, steps: int, save=None, resume=None) -> dict:
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(WORKER),
            "--steps", str(steps), "--out", str(out)]
    args += ["--save", str(save)] if save else []
    args += ["--resume", str(resume)] if resume else []
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "exitcode: -6" in proc.stderr:
        # A gloo rank aborted ("terminate called without an active exception", SIGABRT) once in a full-suite
        # run and never alone; not understood yet (see docs/limitations.md): one more try, then fail.
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out)


def assert_same(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=atol, msg=name)


def test_two_ranks_update_as_one_and_resume_at_another_world_size(tmp_path):
    one = torchrun(1, tmp_path / "one.pt", steps=1, save=tmp_path / "ckpt-1rank")
    two = torchrun(2, tmp_path / "two.pt", steps=1, save=tmp_path / "ckpt-2ranks")
    assert one["step"] == two["step"] == 1
    assert_same(one["params"], two["params"])                      # the 2-rank update is the 1-rank one
    straight = torchrun(1, tmp_path / "straight.pt", steps=2)         # the run that never stopped
    assert not torch.equal(straight["params"]["lm_head.weight"], one["params"]["lm_head.weight"])
    for ranks, written_by in ((1, "ckpt-2ranks"), (2, "ckpt-1rank")):  # 2 → 1 and 1 → 2 ranks
        resumed = torchrun(ranks, tmp_path / f"resumed-{ranks}.pt", steps=1, resume=tmp_path / written_by)
        assert resumed["step"] == 2
        # model and optimizer state came back. The summation order differs with the world size, and AdamW turns
        # float noise in a gradient that is zero in exact arithmetic (the attention's key bias) into steps of up
        # to lr (1e-2); 1e-4 is 1% of one step.
        assert_same(resumed["params"], straight["params"], atol=1e-4)


def test_resuming_from_a_folder_without_a_checkpoint_says_so(tmp_path):
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(WORKER),
            "--steps", "1", "--out", str(tmp_path / "x.pt"), "--resume", str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "holds no distributed checkpoint" in proc.stderr

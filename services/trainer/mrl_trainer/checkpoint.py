"""Checkpoint and resume: a killed trainer resumes at the same step with the same state.

    <dir>/step-000040/model.safetensors   the policy's weights (shared tensors once)
    <dir>/step-000040/config.json ...     its config and tokenizer: the folder loads as model.source=hf
    <dir>/step-000040/trainer.pt          optimizer, RNG states (torch, CUDA, python, numpy), TrainState
    <dir>/latest                          the name of the newest complete checkpoint

Under torchrun (FSDP, distributed.py) the weights and the optimizer are written by every rank with
torch.distributed.checkpoint into `step-N/shards/` instead of model.safetensors and trainer.pt's optimizer,
and any number of ranks reads them back; rank 0 writes the rest. A sharded checkpoint resumes only under
torchrun, a single-process one only without it (TrainerError otherwise).

A checkpoint is written into `step-N.tmp/`, renamed into place, and only then named by `latest`
(os.replace): a crash at any point leaves the previous checkpoint intact; should `latest` ever name
a folder that is gone, the newest complete `step-N/` is used. The data cursor is the step itself: the prompts of step t are a pure function of
(task, seed, t), so nothing else about the data needs saving.
"""
import dataclasses
import os
import pathlib
import random
import shutil

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from mrl_trainer import distributed
from mrl_trainer.distributed import Ranks
from mrl_trainer.errors import TrainerError
from mrl_trainer.optimizer import implemented_as

__all__ = ["TrainState", "save_checkpoint", "load_checkpoint", "latest_checkpoint"]


@dataclasses.dataclass
class TrainState:
    step: int = 0                  # optimizer steps done; the next step to run
    rollouts_total: int = 0
    batch_rewards: list[float] = dataclasses.field(default_factory=list)   # recent batch mean rewards
    solved: list[str] = dataclasses.field(default_factory=list)    # prompts own samples solved, oldest first
    sharing: dict = dataclasses.field(default_factory=dict)        # the sharing mode's state (SharingMode.state)


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def latest_checkpoint(directory: str | pathlib.Path) -> pathlib.Path | None:
    """The folder `latest` names; if a crash left it naming a missing folder, the newest complete one."""
    marker = pathlib.Path(directory) / "latest"
    if not marker.exists():
        return None
    folder = marker.parent / marker.read_text().strip()
    if (folder / "trainer.pt").exists():
        return folder
    complete = sorted(f for f in marker.parent.glob("step-[0-9]*[0-9]") if (f / "trainer.pt").exists())
    if not complete:
        raise TrainerError(f"{marker} names {folder.name}, which is incomplete or missing, and no complete "
                           f"step-N folder is left: remove {marker} to start afresh")
    return complete[-1]


def save_checkpoint(directory: str | pathlib.Path, model, tokenizer, optimizer, state: TrainState,
                    keep: int = 2, ranks: Ranks = Ranks()) -> pathlib.Path:
    """Write the checkpoint of step state.step (every rank calls it under torchrun); its folder."""
    directory = pathlib.Path(directory)
    name = f"step-{state.step:06d}"
    tmp, final = directory / f"{name}.tmp", directory / name
    if ranks.main:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    ranks.barrier()
    trainer = {"rng": _rng_state(), "state": dataclasses.asdict(state)}
    if ranks.sharded:
        distributed.save(tmp / "shards", model, optimizer, state.step)
    else:
        save_model(model, str(tmp / "model.safetensors"))
        trainer["optimizer"] = optimizer.state_dict()
    if ranks.main:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer, tmp / "trainer.pt")
        _publish(directory, name, keep)
    ranks.barrier()
    return final


def _publish(directory: pathlib.Path, name: str, keep: int) -> None:
    """step-N.tmp becomes step-N, `latest` names it, and only the newest `keep` step folders stay."""
    tmp, final = directory / f"{name}.tmp", directory / name
    old = directory / f"{name}.old"      # a re-save of the same step: set aside, dropped once replaced
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    marker_tmp = directory / "latest.tmp"
    marker_tmp.write_text(name + "\n")
    os.replace(marker_tmp, directory / "latest")
    shutil.rmtree(old, ignore_errors=True)
    for old in sorted(directory.glob("step-[0-9]*[0-9]"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder: pathlib.Path, model, optimizer, ranks: Ranks = Ranks()) -> TrainState:
    """Load weights, optimizer and RNG states saved in `folder` into the given objects (under torchrun: the
    sharded model and its optimizer, whatever the number of ranks that wrote them)."""
    sharded = (folder / "shards").is_dir()
    if sharded != ranks.sharded:
        raise TrainerError(f"checkpoint {folder} was written by a trainer "
                           f"{'under torchrun (sharded)' if sharded else 'without torchrun'}: resume it "
                           f"{'under torchrun, with any number of ranks' if sharded else 'without torchrun'}, "
                           f"or remove {folder.parent} to start afresh")
    if sharded:
        distributed.load(folder / "shards", model, optimizer)
        blob = torch.load(folder / "trainer.pt", weights_only=False)
        _set_rng_state(blob["rng"])
        return TrainState(**blob["state"])
    try:
        missing, unexpected = load_model(model, str(folder / "model.safetensors"), strict=False)
        blob = torch.load(folder / "trainer.pt", weights_only=False)
    except (OSError, RuntimeError) as exc:
        raise TrainerError(f"cannot resume from {folder}: {exc}; the model config may differ from the one "
                           f"that wrote it (remove the checkpoint dir to start afresh)") from exc
    if unexpected or any(not _tied(model, k) for k in missing):
        raise TrainerError(f"checkpoint {folder} does not fit this model (missing {sorted(missing)[:4]}, "
                           f"unexpected {sorted(unexpected)[:4]}): was it written by another model config?")
    optimizer.load_state_dict(implemented_as(blob["optimizer"], optimizer))
    _set_rng_state(blob["rng"])
    return TrainState(**blob["state"])


def _tied(model, key: str) -> bool:
    """A parameter that safetensors stored once under another name (tied embeddings)."""
    tensor = model.state_dict()[key]
    return any(other != key and t.data_ptr() == tensor.data_ptr() for other, t in model.state_dict().items())

"""A policy's update across devices: PyTorch FSDP2 (`fully_shard`) under torchrun, checkpoints with
torch.distributed.checkpoint (DCP), resumable at another world size.

    rank, world = setup()                            # torchrun's env; gloo on CPU, NCCL on CUDA
    shard(model)                                     # each transformer block, then the root
    loss = update(model, optimizer, loss_fn, batch)  # this rank's share of the global batch
    save(directory, model, optimizer, step)          # every rank writes its shards
    step = load(directory, model, optimizer)         # any world size reads them back
    teardown()

The global batch is split across ranks; `loss_fn(model, batch)` returns this rank's (summed loss, count of
what it averages over, e.g. tokens). `update` divides by the count over all ranks, so the step is the one
a single process would take on the whole batch with a token mean: FSDP averages gradients over the ranks, and
each rank's loss is scaled by the world size to undo that average.

Kept apart from the single-process trainer (trainer.py, update.py): this is the engine a multi-device
policy runs its update on.
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from mrl_trainer.errors import TrainerError

__all__ = ["setup", "teardown", "shard", "update", "save", "load"]


def setup() -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...): NCCL with one GPU per
    local rank when CUDA is there, else gloo. Returns (rank, world size)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise TrainerError("not started by torchrun (RANK and WORLD_SIZE are unset): run it under "
                           "`torchrun --nproc-per-node N ...`")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def teardown() -> None:
    dist.barrier()   # no rank leaves while another still talks to it
    dist.destroy_process_group()


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard each transformer block (the classes transformers names in `_no_split_modules`), then the
    root, over all ranks. TrainerError for a model that names no block."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    if not blocks:
        raise TrainerError(f"{type(model).__name__} names no transformer block (_no_split_modules) to shard")
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)
    return model


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn, batch) -> float:
    """One optimizer step on the global batch, of which `batch` is this rank's share; returns the global
    mean loss."""
    total, count = loss_fn(model, batch)
    n = torch.tensor([float(count)], device=total.device)
    dist.all_reduce(n)
    if n.item() <= 0:
        raise TrainerError("the global batch holds nothing to average over")
    optimizer.zero_grad(set_to_none=True)
    (total * dist.get_world_size() / n).backward()
    optimizer.step()
    mean = total.detach() / n
    dist.all_reduce(mean)
    return mean.item()


def save(directory: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         step: int) -> None:
    """Every rank writes its shards of the model and the optimizer, and the step, under `directory`."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state, "step": torch.tensor(step)},
             checkpoint_id=os.fspath(directory))


def load(directory: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Read a checkpoint of `save` into the sharded model and optimizer, at this world size whatever the one
    that wrote it; returns its step. TrainerError when there is none."""
    if not os.path.isfile(os.path.join(directory, ".metadata")):
        raise TrainerError(f"{os.fspath(directory)!r} holds no distributed checkpoint (no .metadata)")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=os.fspath(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return int(state["step"])

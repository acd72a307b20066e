"""A policy's training across devices: PyTorch FSDP2 (`fully_shard`) under torchrun, checkpoints with
torch.distributed.checkpoint (DCP), resumable at another world size.

    torchrun --nproc-per-node N -m mrl.cli trainer run CONFIG     # `mrl trainer run`, one process per rank

    ranks = setup()                                 # torchrun's env; gloo on CPU, NCCL on CUDA; Ranks()
    shard(model)                                    # each transformer block, then the root
    save(directory, model, optimizer, step)         # every rank writes its shards
    step = load(directory, model, optimizer)        # any world size reads them back
    teardown()

`Ranks` is this process's place among the N ranks and the few collectives the trainer needs; `Ranks()` is a
single process (no process group), where every collective returns its input, so the trainer runs one code
path. How the trainer divides a step (trainer.py, update.py):

    rollout   rank r generates and verifies its block of the step's prompts (Ranks.block); all ranks gather
              the whole batch (Ranks.gather)
    exchange  rank 0 alone publishes, takes the peers' experience, plans; the plan is broadcast
    update    each micro-batch's sequences are dealt over the ranks (Ranks.deal); every loss keeps the whole
              step's normalisers, so the ranks' gradients sum to the single process's. FSDP2 averages
              gradients over the ranks: each rank's loss is scaled by N to undo that average.
    scheduler rank 0 holds each phase's gang lease of N devices for all ranks (scheduler.device_ids, in rank
              order, pins it to the devices the ranks run on)

Every rank forwards every micro-batch (one with no sequence dealt to it forwards one with weight 0), so the
collectives of FSDP stay in step.
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from mrl_trainer.errors import TrainerError
from mrl_trainer.optimizer import implemented_as

__all__ = ["Ranks", "under_torchrun", "setup", "teardown", "shard", "local", "gradient_of", "full", "save", "load"]


class Ranks:
    """Rank `rank` of `world` ranks training one policy; `sharded`: the model is sharded by FSDP over them
    (under torchrun, also with one rank). Ranks() is a single process."""

    def __init__(self, rank: int = 0, world: int = 1, sharded: bool = False):
        self.rank, self.world, self.sharded = rank, world, sharded

    @property
    def main(self) -> bool:
        """Rank 0: the one that talks to the exchange and the scheduler, logs and prints."""
        return self.rank == 0

    def block(self, items: list) -> tuple[list, int]:
        """This rank's contiguous block of ⌈n/N⌉ items and how many of them are real: a short block is filled up
        with repeats of an item, so that every rank generates as many sequences (FSDP's forwards stay in step)."""
        size = -(-len(items) // self.world)
        mine = items[self.rank * size:(self.rank + 1) * size]
        return (mine + [(mine or items)[-1]] * (size - len(mine)) if items else []), len(mine)

    def deal(self, group: list) -> list:
        """This rank's share of a micro-batch: every N-th member from the rank's own index."""
        return group[self.rank::self.world]

    def gather(self, items: list) -> list:
        """Every rank's `items`, concatenated in rank order, on every rank."""
        if self.world == 1:
            return list(items)
        out = [None] * self.world
        dist.all_gather_object(out, items)
        return [x for part in out for x in part]

    def broadcast(self, obj):
        """Rank 0's `obj`, on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.world > 1:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup() -> Ranks:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...): NCCL with one GPU per
    local rank when CUDA is there, else gloo."""
    if not under_torchrun():
        raise TrainerError("not started by torchrun (RANK and WORLD_SIZE are unset): run it under "
                           "`torchrun --nproc-per-node N ...`")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), sharded=True)


def teardown(wait: bool = True) -> None:
    """Leave the process group; with `wait`, once every rank is done (a rank that fails must not wait for the
    others, which may be waiting for it)."""
    if wait:
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


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's part on this rank (the tensor itself when it is not sharded)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gradient_of(param: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """`part`, this rank's part of a gradient of `param`, as the gradient itself: placed as the parameter is when
    it is sharded (the tensor itself when it is not)."""
    if not isinstance(param, DTensor):
        return part
    return DTensor.from_local(part, param.device_mesh, param.placements, shape=param.size(), stride=param.stride())


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded or replicated tensor whole, on every rank (the tensor itself when it is not distributed)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


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
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=implemented_as(state["optimizer"], optimizer))
    return int(state["step"])

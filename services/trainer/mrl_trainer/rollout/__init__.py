"""Rollout engines behind one interface (`RolloutEngine`): hf (transformers generate) and sglang."""
from mrl_trainer.rollout.base import RolloutEngine, Sample, SamplingParams

__all__ = ["RolloutEngine", "Sample", "SamplingParams", "make_engine"]


def make_engine(name: str, model, tokenizer, max_batch: int, synced: bool = False) -> RolloutEngine:
    """`synced`: the model is sharded over ranks (FSDP) that all generate at once (only hf can)."""
    if name == "hf":
        from mrl_trainer.rollout.hf import HFEngine
        return HFEngine(model, tokenizer, max_batch=max_batch, synced=synced)
    if synced:
        raise ValueError(f"rollout engine {name!r} cannot generate from a model sharded over torchrun's ranks: "
                         f"use rollout.engine=hf under torchrun")
    if name == "sglang":
        from mrl_trainer.rollout.sglang import SGLangEngine
        return SGLangEngine(model, tokenizer, max_batch=max_batch)
    raise ValueError(f"unknown rollout engine {name!r}; valid: 'hf', 'sglang'")

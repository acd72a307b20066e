"""The trainer's optimizer: AdamW, on torch's fused kernel where every parameter allows it.

    m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²,   θ ← θ − lr·(m̂ / (√v̂ + ε) + λ·θ)

(m̂, v̂ bias-corrected; λ = loss.weight_decay). The fused kernel takes every parameter in one pass instead of a
loop of small operations per parameter: the same step to rounding; on SmolLM2-135M's parameters on one CPU thread
the clipping and the step together take a quarter of the loop's time (mrl bench guard). A checkpoint keeps the
moments, not the implementation: one written by either resumes on the implementation the running trainer chose
(mrl_trainer.checkpoint).
"""
import torch

__all__ = ["adamw", "implemented_as"]


def adamw(model: torch.nn.Module, loss) -> torch.optim.AdamW:
    """AdamW over the model's parameters at loss.lr and loss.weight_decay; fused when every parameter is a
    floating-point tensor on the CPU or a CUDA device, else torch's default implementation."""
    params = list(model.parameters())
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=loss.lr, weight_decay=loss.weight_decay, fused=fused or None)


def implemented_as(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """`saved` (an optimizer state dict) with the running optimizer's implementation flags, fused and foreach,
    in place of the writer's: load_state_dict then keeps them and puts AdamW's step counts where that
    implementation wants them (the fused kernel: on the parameter's device)."""
    for group, running in zip(saved["param_groups"], optimizer.param_groups):
        group.update({flag: running[flag] for flag in ("fused", "foreach") if flag in running})
    return saved

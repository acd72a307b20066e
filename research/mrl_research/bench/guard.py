"""`mrl bench guard`: what the no-harm guard's combination (mrl_trainer.guard.Guard.combine and observe) costs per
optimizer step on the parameters of the demo's two policies, against the optimizer part of the same step
(clip_grad_norm_ and AdamW's step over the same parameters and gradients), in the same process. Ends with one
JSON line.

Per policy, in a process of its own (so that each peak RSS is its own):

    parameters  the architecture's, from its config (random weights: the cost depends on the shapes only);
                SmolLM2-135M-Instruct (policy-a, SGT) and the demo's GPT-2 4 × 256 (policy-b, HACPO)
    gradients   fixed random g_s and a peer term d that conflicts with g_s, τ = 0.9, so every step takes the
                whole path: the projection, the trust's scaling, the hindsight
    combine_s   the median over `repeats` steps of combine + observe (one mini-batch per step); before each, the
                update's state is restored outside the clock: p.grad ← d, and a fresh g_s buffer (the update
                takes one out of the parameters per mini-batch too)
    anchor      the median of clip_grad_norm_ + AdamW.step over the same parameters (the update's "optimizer"
                part, mrl_trainer.update), with the trainer's AdamW (mrl_trainer.optimizer: the fused kernel)
    loop        the same with AdamW's per-parameter loop, and fused_ratio_vs_loop = anchor ÷ loop
    extra peak  the process's peak RSS during the guard's steps minus its peak before them (parameters,
                gradients, the stored d / g_s and one g_s buffer already counted), in MB and in gradients
                (÷ the parameters' float32 bytes); the optimizers run after them, since the fused step's
                temporaries would raise the peak before them above the guard's

--quick: a tiny GPT-2 (2 layers × 64) and 2 repeats, a smoke test of the plumbing, not a measurement.
"""
import json
import multiprocessing as mp
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from mrl_research import benchmarking

__all__ = ["main"]

SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True}
DEMO_GPT2 = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 512, "vocab_size": 50257}
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64, "vocab_size": 50257}
POLICIES = {"policy-a (SmolLM2-135M, SGT)": SMOLLM2, "policy-b (GPT-2 4×256, HACPO)": DEMO_GPT2}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(architecture: dict, repeats: int, threads: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from mrl_trainer.config import LossConfig
    from mrl_trainer.guard import Guard, GuardConfig
    from mrl_trainer.optimizer import adamw
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = dict(architecture)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    g_s = [torch.randn_like(p) for p in params]
    d = [0.5 * torch.randn_like(s) - 0.5 * s for s in g_s]              # ⟨d, g_s⟩ < 0: projected

    def optimizer_s(optimizer) -> float:
        """The median seconds of clip_grad_norm_ + optimizer.step on g_s + d (the first step, which builds AdamW's
        state, left out)."""
        seconds = []
        for _ in range(repeats + 1):
            for p, s, x in zip(params, g_s, d):
                p.grad = s + x
            start = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds[1:])

    guard = Guard(GuardConfig())
    guard.trust = 0.9
    solo = [s.clone() for s in g_s]
    for p, x in zip(params, d):                                          # the update's p.grad: the peer term
        p.grad = x.clone()
    before = _peak_mb()
    combine_s, evidence = [], {}
    for _ in range(repeats + 1):                                         # the first one has no hindsight yet
        for p, x in zip(params, d):
            p.grad.copy_(x)
        start = time.perf_counter()
        evidence = guard.combine(params, solo)
        stats = guard.observe([evidence])
        combine_s.append(time.perf_counter() - start)
        guard.trust = 0.9
        solo = [s.clone() for s in g_s]
    extra_mb = _peak_mb() - before
    assert evidence["projected"] == 1.0 and "guard_hindsight" in stats          # the whole path was taken
    combine = statistics.median(combine_s[1:])
    anchor = optimizer_s(adamw(model, LossConfig(lr=1e-6)))              # after the guard's peak: the fused step's
    loop = optimizer_s(torch.optim.AdamW(params, lr=1e-6, foreach=False))   # temporaries would hide it
    return {"parameters": numel, "tensors": len(params), "combine_s": round(combine, 4),
            "optimizer_s": round(anchor, 4), "ratio_vs_optimizer": round(combine / anchor, 3),
            "optimizer_loop_s": round(loop, 4), "fused_ratio_vs_loop": round(anchor / loop, 3),
            "extra_peak_mb": round(extra_mb, 1), "extra_gradients": round(extra_mb * 2**20 / (4 * numel), 2)}


def main(quick: bool = False) -> dict:
    import torch
    policies = {"tiny GPT-2 (2 × 64)": TINY} if quick else POLICIES
    repeats, threads = (2, 1) if quick else (7, 1)
    machine = benchmarking.machine(libraries=f"torch {torch.__version__}")
    print(f"mrl bench guard: {machine}\n  {threads} torch thread; median of {repeats} steps; anchor: clip_grad_norm_ + "
          f"the trainer's AdamW.step (fused) over the same parameters, and the same with AdamW's per-parameter loop; "
          f"each policy in its own process", flush=True)
    print(f"  {'policy':<32}{'params':>12}{'guard s':>9}{'optimizer s':>13}{'ratio':>7}"
          f"{'extra MB':>10}{'× grad':>8}{'loop s':>8}{'fused÷loop':>12}", flush=True)
    results = {}
    for name, architecture in policies.items():                # one after the other, never together
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
            r = results[name] = pool.submit(_measure, architecture, repeats, threads).result()
        print(f"  {name:<32}{r['parameters']:>12,}{r['combine_s']:>9.3f}{r['optimizer_s']:>13.3f}"
              f"{r['ratio_vs_optimizer']:>7.2f}{r['extra_peak_mb']:>10.0f}{r['extra_gradients']:>8.2f}"
              f"{r['optimizer_loop_s']:>8.3f}{r['fused_ratio_vs_loop']:>12.2f}", flush=True)
    result = {"bench": "guard", "machine": machine, "quick": quick, "threads": threads, "repeats": repeats,
              "policies": results, "anchor": "clip_grad_norm_ + the trainer's AdamW.step (fused) over the same "
                                             "parameters, same process",
              "ratio_vs_optimizer": {name: r["ratio_vs_optimizer"] for name, r in results.items()},
              "fused_ratio_vs_loop": {name: r["fused_ratio_vs_loop"] for name, r in results.items()}}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv[1:])

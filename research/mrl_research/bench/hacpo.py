"""`mrl bench hacpo`: seconds and peak memory of one HACPO update on SmolLM2-135M's shapes, with the clipped peer
samples screened out of autograd (sharing.hacpo.screen, the default) against the plain update that forwards and
backs up every peer sample (screen: false), in the same process tree. Ends with one JSON line.

Workload, the demo pair's policy-a under HACPO (examples/policy-a.yaml): P = 4 prompts × G = 8 own samples,
8 peer rollouts pooled per prompt; prompts of 48 tokens, own responses of 24, peer responses of 20 (random token
ids: the cost depends on the shapes only, and the ratio s is set, below). HACPO's own plan (its mixed baseline,
ω measured from the re-scored peer rewards, the no-harm guard on, as a user gets it); β = 0, μ = 1, one
mini-batch, loss.micro_batch_tokens 8192 (the whole batch in one micro-batch per kind), AdamW lr 1e-9 (so that s
stays where it is put over the repeats).

    clipped   every peer sample's log s = −5 (s ≈ 0.007, outside [1 − δ, 1]): what the demo pair's HACPO runs saw
              (s ≈ 0.006 and below, every peer sample clipped); screening saves their backward
    inside    every log s = −0.1 (s ≈ 0.90): nothing to save; screening costs one forward without autograd more

The producer's behaviour log-probability of each peer sample is set from the receiver's own, Σ_u log π_old^j =
Σ_t log π_θ(y_t) − C(y) · log s, computed once before the clock. Each (workload, screen) pair runs in a process
of its own, one after the other: the median over `repeats` updates after one warm-up, and the peak RSS the
updates added to the process's peak before them (ru_maxrss). ratio = screened ÷ plain seconds (anchor: the
plain update, same workload, same process tree); the run checks that the workload's clipped share is 1 or 0.

--quick: a tiny GPT-2 (2 layers × 64) and 1 repeat, a smoke test of the plumbing, not a measurement.
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
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 128, "vocab_size": 50257}
WORKLOADS = {"clipped": -5.0, "inside": -0.1}      # log s of every peer sample
PROMPTS, GROUP, PER_PROMPT = 4, 8, 8
PROMPT_TOKENS, OWN_TOKENS, PEER_TOKENS = 48, 24, 20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(architecture: dict, log_s: float, screen: bool, repeats: int, threads: int) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from mrl_trainer.config import LossConfig
    from mrl_trainer.experience import StepBatch
    from mrl_trainer.logprobs import completion_logprobs
    from mrl_trainer.rollout.base import Sample
    from mrl_trainer.sharing import SHARING_MODES, PeerBatch, PeerSample, Verifier, sharing_config
    from mrl_trainer.tasks import Problem
    from mrl_trainer.update import update
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = dict(architecture)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    tokens = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731

    def logprobs(prompts, completions):
        return completion_logprobs(model, prompts, completions, 0, 1.0)

    prompts = [tokens(PROMPT_TOKENS) for _ in range(PROMPTS)]
    problems = [Problem(prompt_id=f"bench:train:0:{p}", question=f"q{p}", answer="right") for p in range(PROMPTS)]
    samples = [[Sample(prompt_ids=prompts[p], ids=tokens(OWN_TOKENS), logprobs=[-1.0] * OWN_TOKENS, text="",
                       truncated=False) for _ in range(GROUP)] for p in range(PROMPTS)]
    rewards = [[float(i % 2) for i in range(GROUP)] for _ in range(PROMPTS)]
    batch = StepBatch(step=0, problems=problems, samples=samples, rewards=rewards,
                      answers=[[None] * GROUP for _ in range(PROMPTS)])
    peer_ids = [[tokens(PEER_TOKENS) for _ in range(PER_PROMPT)] for _ in range(PROMPTS)]
    with torch.no_grad():       # Σ_t log π_θ(y_t) of every peer response, to put its s where the workload says
        logp, mask = logprobs([prompts[p] for p in range(PROMPTS) for _ in range(PER_PROMPT)],
                              [ids for row in peer_ids for ids in row])
        own_sums = torch.where(mask.bool(), logp, 0.0).sum(-1).tolist()
    peers = PeerBatch(rollouts={p: [PeerSample(producer="policy-b", prompt_index=p, ids=ids,
                                               text="right" if i % 4 == 0 else "wrong", reward=0.0,
                                               behaviour_logp=own_sums[p * PER_PROMPT + i] - PEER_TOKENS * log_s,
                                               chunks=PEER_TOKENS)
                                    for i, ids in enumerate(peer_ids[p])] for p in range(PROMPTS)})
    loss = LossConfig(lr=1e-9, micro_batch_tokens=8192)
    mode = SHARING_MODES["hacpo"](sharing_config(mode="hacpo", hacpo={"screen": screen}), loss)
    verify = Verifier(batch, lambda problem, text: float(text == problem.answer))
    plan = mode.plan(batch, peers, capability=0.5, verify=verify)
    optimizer = torch.optim.AdamW(params, lr=loss.lr)
    before = _peak_mb()
    seconds, stats = [], {}
    for _ in range(repeats + 1):
        start = time.perf_counter()
        stats = update(logprobs, params, optimizer, mode, loss, batch, plan, max_tokens=OWN_TOKENS)
        seconds.append(time.perf_counter() - start)
    expected = 1.0 if log_s < -1 else 0.0
    if stats.get("hacpo_clipped") != expected:
        raise RuntimeError(f"the workload's clipped share is {stats.get('hacpo_clipped')}, not {expected}")
    return {"update_s": round(statistics.median(seconds[1:]), 3), "extras_s": round(stats["update_extras_s"], 3),
            "own_s": round(stats["update_own_s"], 3), "extras": int(stats["extras"]),
            "clipped": stats["hacpo_clipped"], "peak_mb": round(_peak_mb(), 1),
            "update_peak_mb": round(_peak_mb() - before, 1)}


def main(quick: bool = False) -> dict:
    import torch
    architecture, repeats, threads = (TINY, 1, 1) if quick else (SMOLLM2, 3, 2)
    machine = benchmarking.machine(libraries=f"torch {torch.__version__}")
    print(f"mrl bench hacpo: {machine}\n  {'tiny GPT-2 (2 × 64)' if quick else 'SmolLM2-135M shapes'}, {threads} "
          f"torch threads; {PROMPTS} prompts × {GROUP} own + {PER_PROMPT} peer samples each; median of {repeats} "
          f"updates; anchor: the plain update (screen: false); each run in its own process", flush=True)
    print(f"  {'workload':<10}{'screen':>8}{'update s':>10}{'extras s':>10}{'own s':>8}{'extras':>8}{'clipped':>9}"
          f"{'peak MB':>9}{'+update MB':>12}", flush=True)
    results = {}
    for workload, log_s in WORKLOADS.items():
        for screen in (False, True):                            # one after the other, never together
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                r = pool.submit(_measure, architecture, log_s, screen, repeats, threads).result()
            results.setdefault(workload, {})["screened" if screen else "plain"] = r
            print(f"  {workload:<10}{'on' if screen else 'off':>8}{r['update_s']:>10.3f}{r['extras_s']:>10.3f}"
                  f"{r['own_s']:>8.3f}{r['extras']:>8}{r['clipped']:>9.2f}{r['peak_mb']:>9.0f}"
                  f"{r['update_peak_mb']:>12.0f}", flush=True)
    ratio = {w: round(r["screened"]["update_s"] / r["plain"]["update_s"], 3) for w, r in results.items()}
    memory = {w: round(r["screened"]["update_peak_mb"] - r["plain"]["update_peak_mb"], 1) for w, r in results.items()}
    result = {"bench": "hacpo", "machine": machine, "quick": quick, "threads": threads, "repeats": repeats,
              "workloads": results, "anchor": "the plain HACPO update (sharing.hacpo.screen: false), same workload, "
                                              "same process tree",
              "ratio_vs_plain": ratio, "update_peak_mb_vs_plain": memory}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv[1:])

"""`mrl bench trainer`: seconds per GRPO step (rollout, update) and peak memory, against TRL's GRPOTrainer.

The same workload on both sides, in one run on this machine:

  model   SmolLM2-135M-Instruct: its GGUF dequantised once to fp32 (policy.gguf_folder); both sides
          load that same safetensors folder. --quick: a tiny GPT-2-architecture policy (random weights
          over the real GPT-2 tokenizer), saved to a temporary folder that both sides load.
          fp32 on the CPU (on CUDA when there is one); the same torch thread count on both sides.
  step    P prompts of the `arithmetic` task (level 2) × G samples of at most T new tokens; temperature 1,
          top-p 1, no top-k; reward = (characters mod 10) / 9, not the verifier: a timing workload in which
          (almost) every group has unequal rewards, so both sides run the whole update (with the verifier,
          SmolLM2 at ~15-20% leaves many groups all-wrong, and mrl skips their update — see below); advantages
          scaled by the group std; token-mean loss (TRL "dapo"), clip [1 − 0.2, 1 + 0.28], beta 0, μ = 1
          (no old-log-prob forward on either side), AdamW on torch's fused kernel (the default of both)
          at lr 1e-6 constant, grad-norm clip 1, dropout off, no gradient checkpointing, the whole batch in
          one forward/backward.
  mrl     Trainer.rollout(step) (generate, decode, verify) and Trainer.update(batch) (advantages,
          forward/backward, clip, optimizer step), each timed.
  trl     GRPOTrainer.train() over the same prompts in the same order. A TrainerCallback times each
          optimizer step (on_step_begin → on_step_end). TRL's own timers (`profiling_context`) report only
          to wandb/mlflow/trackio, so its rollout is timed by wrapping, on the instance,
          GRPOTrainer._generate_and_score_completions (tokenize, generate, decode, reward, advantages;
          called from _prepare_inputs inside training_step); update = step − rollout (forward/backward,
          clip, optimizer and scheduler step). TRL as shipped: its training forward always goes through its
          fused, chunked LM-head log-prob (trl.kernels.chunked_logprob), which recomputes logits in backward.

Each side runs in its own spawned process, one after the other, W warm-up steps first. Peak memory is
that process's peak RSS (ru_maxrss: imports, model, optimizer state, the steps), plus
torch.cuda.max_memory_allocated on CUDA. Figures are medians over the measured steps; rollout tokens/s =
generated tokens (stop token included) ÷ rollout seconds. ratio = mrl step ÷ TRL step, target
≤ 1.0. Caveat: with beta = 0 our update forwards only samples whose advantage is non-zero (trainer.py),
so a group whose rewards are all equal costs mrl no update compute and TRL a full one; `signal` is, per
side, the share of groups with unequal rewards. The last stdout line is one JSON object.
"""
import importlib.metadata
import json
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from mrl.assets import tokenizer_cache_dir
from mrl.errors import FailedPrecondition
from mrl_research import benchmarking

__all__ = ["main", "TARGET"]

TARGET = 1.0
TASK = {"family": "arithmetic", "level": 2, "seed": 0}
LR, EPS_LOW, EPS_HIGH, SEED = 1e-6, 0.2, 0.28, 0
SMOLLM2 = tokenizer_cache_dir() / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256}


def _timing_reward(problem, text: str) -> float:
    """The timing workload's reward (module docstring), the same on both sides."""
    return (len(text) % 10) / 9


def _signal(rewards: list[float], G: int) -> float:
    """Share of groups (G consecutive rewards) whose rewards are not all equal."""
    groups = [rewards[i:i + G] for i in range(0, len(rewards), G)]
    return sum(len(set(g)) > 1 for g in groups) / len(groups)


def _summary(warmup, device, rollout, step, tokens, prompt_tokens, signal) -> dict:
    """Medians over the measured steps (after `warmup`), and this process's peak memory."""
    import torch
    r, s = rollout[warmup:], step[warmup:]
    out = {"rollout_s": round(statistics.median(r), 3),
           "update_s": round(statistics.median([b - a for a, b in zip(r, s)]), 3),
           "step_s": round(statistics.median(s), 3),
           "rollout_tokens_per_s": round(statistics.median([n / x for n, x in zip(tokens[warmup:], r)]), 1),
           "tokens_per_step": statistics.median(tokens[warmup:]),
           "prompt_tokens": round(statistics.mean(prompt_tokens), 1),
           "signal": round(statistics.mean(signal[warmup:]), 3),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "threads": torch.get_num_threads()}
    if device == "cuda":
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _run_mrl(folder, P, G, T, steps, warmup, threads, device) -> dict:
    import torch
    torch.set_num_threads(threads)
    from mrl_trainer.config import TrainerConfig
    from mrl_trainer.trainer import build_trainer
    rollout, step, tokens, prompt_tokens, signal = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="mrl-bench-trainer-") as tmp:
        trainer = build_trainer(TrainerConfig.model_validate({
            "policy": "bench", "seed": SEED, "device": device, "steps": warmup + steps,
            "model": {"source": "hf", "path": folder, "dtype": "float32"}, "task": TASK,
            "rollout": {"group_size": G, "prompts_per_step": P, "max_new_tokens": T, "temperature": 1.0,
                        "top_p": 1.0, "max_batch": P * G},
            "loss": {"lr": LR, "beta": 0.0, "eps_low": EPS_LOW, "eps_high": EPS_HIGH, "aggregation": "token-mean",
                     "scale_rewards": True, "updates_per_step": 1, "max_grad_norm": 1.0,
                     "micro_batch_tokens": 1 << 20},
            "eval": {"every": 0}, "checkpoint": {"dir": tmp, "resume": False}, "metrics": {"progress": False}}))
        trainer.task.reward = _timing_reward
        for t in range(warmup + steps):
            start = time.perf_counter()
            batch = trainer.rollout(t)
            mid = time.perf_counter()
            trainer.update(batch)
            rollout.append(mid - start)
            step.append(time.perf_counter() - start)
            flat = [s for group in batch.samples for s in group]
            tokens.append(sum(len(s.ids) for s in flat))
            prompt_tokens.append(statistics.mean(len(s.prompt_ids) for s in flat))
            signal.append(_signal([r for group in batch.rewards for r in group], G))
        trainer.close()
    return _summary(warmup, device, rollout, step, tokens, prompt_tokens, signal)


def _run_trl(folder, P, G, T, steps, warmup, threads, device) -> dict:
    import torch
    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    from mrl.tasks import make_task
    task = make_task(TASK)
    problems = task.batch(0, (warmup + steps) * P)        # = task.batch(t, P) for t = 0, 1, ... in turn
    rollout, step, tokens, prompt_tokens, signal = [], [], [], [], []

    def verifier(completions, index, **_):
        out = [_timing_reward(problems[i], c[0]["content"] if isinstance(c, list) else c) for c, i in zip(completions, index)]
        signal.append(_signal(out, G))
        return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory(prefix="mrl-bench-trl-") as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=device == "cpu", seed=SEED, max_steps=warmup + steps, bf16=False,
            per_device_train_batch_size=P * G, num_generations=G, gradient_accumulation_steps=1,
            max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0, shuffle_dataset=False,
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch_fused", weight_decay=0.0,
            max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
            loss_type="dapo", scale_rewards="group", disable_dropout=True, activation_checkpointing=False,
            report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        data = Dataset.from_list([{"prompt": [{"role": "user", "content": p.question}], "index": i}
                                  for i, p in enumerate(problems)])
        trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=args, train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(folder), callbacks=[StepTimer()])
        for callback in (PrinterCallback, ProgressCallback):   # keep stdout for the figures
            trainer.remove_callback(callback)
        generate = trainer._generate_and_score_completions

        def timed_generate(inputs):
            start = time.perf_counter()
            out = generate(inputs)
            rollout.append(time.perf_counter() - start)
            tokens.append(int(out["completion_mask"].sum()))
            prompt_tokens.append(float(out["prompt_mask"].sum(dim=1).float().mean()))
            return out

        trainer._generate_and_score_completions = timed_generate
        trainer.train()
    if not (len(rollout) == len(step) == warmup + steps):
        raise RuntimeError(f"TRL ran {len(step)} steps and {len(rollout)} generations, expected {warmup + steps} "
                           f"of each: the TRL version changed how a step is split")
    return _summary(warmup, device, rollout, step, tokens, prompt_tokens, signal)


def _tiny_folder(tmp: str) -> str:
    """The --quick policy, saved so that both sides load the same weights and tokenizer."""
    from mrl_trainer.policy import ModelSpec, load_policy
    model, tokenizer = load_policy(ModelSpec(source="config", tokenizer=str(tokenizer_cache_dir() / "gpt2.tiktoken"),
                                             architecture=TINY), seed=SEED)
    folder = os.path.join(tmp, "tiny-gpt2")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(quick: bool = False) -> dict:
    import torch
    from mrl_trainer.policy import gguf_folder
    P, G, T, steps, warmup = (1, 4, 8, 1, 1) if quick else (2, 8, 32, 3, 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    threads = torch.get_num_threads()
    version = importlib.metadata.version
    machine = benchmarking.machine(libraries=f"torch {torch.__version__}, transformers {version('transformers')}, "
                                             f"trl {version('trl')}")
    with tempfile.TemporaryDirectory(prefix="mrl-bench-trainer-") as tmp:
        if quick:
            folder, model = _tiny_folder(tmp), "tiny GPT-2 (2 layers × 64, random weights, GPT-2 tokenizer)"
        else:
            if not SMOLLM2.is_file():
                raise FailedPrecondition(f"mrl bench trainer: {SMOLLM2} is missing: run `make tokenizers`")
            folder, model = str(gguf_folder(str(SMOLLM2))), "SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to fp32)"
        print(f"mrl bench trainer: {machine}\n  {model}, {device}, {threads} threads; arithmetic L2, P={P} prompts × "
              f"G={G}, T={T} new tokens; {warmup} warm-up + {steps} measured steps; each side in its own process",
              flush=True)
        print(f"  {'':<5}{'rollout s':>10}{'update s':>10}{'step s':>9}{'rollout tok/s':>15}{'tokens':>8}"
              f"{'peak RSS MB':>13}{'signal':>8}", flush=True)
        results = {}
        for side, run in (("mrl", _run_mrl), ("trl", _run_trl)):           # one after the other, never together
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                r = results[side] = pool.submit(run, folder, P, G, T, steps, warmup, threads, device).result()
            print(f"  {side:<5}{r['rollout_s']:>10.3f}{r['update_s']:>10.3f}{r['step_s']:>9.3f}"
                  f"{r['rollout_tokens_per_s']:>15.1f}{r['tokens_per_step']:>8}{r['peak_rss_mb']:>13.0f}"
                  f"{r['signal']:>8.2f}", flush=True)
    mrl, trl = results["mrl"], results["trl"]
    ratio = round(mrl["step_s"] / trl["step_s"], 3)
    result = {"bench": "trainer", "machine": machine, "quick": quick, "model": model, "device": device,
              "threads": threads, "task": "arithmetic level 2", "P": P, "G": G, "T": T, "warmup_steps": warmup,
              "steps": steps, "mrl": mrl, "trl": trl, "ratio_step_vs_trl": ratio,
              "ratio_rollout_vs_trl": round(mrl["rollout_s"] / trl["rollout_s"], 3),
              "ratio_update_vs_trl": round(mrl["update_s"] / trl["update_s"], 3),
              "ratio_peak_rss_vs_trl": round(mrl["peak_rss_mb"] / trl["peak_rss_mb"], 3),
              "anchor": "TRL GRPOTrainer, same model, prompts, batch, lengths and loss settings, same run",
              "target": f"<= {TARGET}", "met": ratio <= TARGET}
    print(f"  step ratio mrl/TRL {ratio} (target ≤ {TARGET}): {'met' if result['met'] else 'NOT met'}; rollout "
          f"{result['ratio_rollout_vs_trl']}, update {result['ratio_update_vs_trl']}, peak RSS "
          f"{result['ratio_peak_rss_vs_trl']}", flush=True)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv[1:])

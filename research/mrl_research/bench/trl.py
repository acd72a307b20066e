"""`mrl bench trl`: the step time of TRL's GRPOTrainer joining a run (mrl.integrations.trl) against plain TRL.

One process, one machine, the same run on every side:

  model   a tiny GPT-2-architecture policy (2 layers × 64, random weights over the real GPT-2 tokenizer),
          fp32 on the CPU, the same initial weights and seed for every side
  step    P prompts of the `arithmetic` task (level 1) × G completions of at most T new tokens, reward =
          the task's verifier, TRL's defaults otherwise (loss "dapo", β = 0, one generation per optimizer step)
  plain   GRPOTrainer.train()
  mrl     MutualGRPOTrainer.train() with each sharing mode, a peer publishing: "none" (publish only),
          "xgrpo" (pooled baselines from the peer's group_stats), "sgt" (the peer's successes, re-verified
          by the reward function, as an NLL term: the model fails every prompt, so each step rescues P)
  peer    publishes, before the run, group_stats and one correct success per prompt for every step, in the
          GPT-2 tokenizer (no THL call), to the real exchange (a child process over an embedded Redis):
          what is measured is the integration's own cost (publish, the inbox, re-verification, the NLL
          forward/backward), not a wait for a slower peer

Torch runs one compute thread (a shared machine's other load makes multi-threaded CPU steps swing by
several times; one thread keeps the sides comparable). The sides alternate (plain, none, xgrpo, sgt) R times; each run's step time is the median of its optimizer
steps after the first (TrainerCallback on_step_begin → on_step_end: generation, reward, publish, peers,
loss, backward, optimizer). overhead_ratio = integration step ÷ plain step of the same repeat; reported per
mode as the median and the range over repeats, and `overhead_ratio` = the worst mode's median (goal ≤ 1.10).
`cpu_overhead_ratio` is the same over the CPU time this process spends in the steps (all its threads: the
subscription's too; not the exchange's and Redis's child processes): on a machine whose other load steals
wall time from one side or the other it still says what the integration itself costs.
`peer_experiences_used` = the peer experiences the integration runs used (XGRPO: group_stats pooled; SGT:
rescued responses). The last stdout line is one JSON object.

The builders (`tiny_policy`, `grpo_config`, and mrl.integrations.trl's `task_dataset`, `task_reward`) are the ones
the integration tests use.
"""
import copy
import importlib.metadata
import json
import statistics
import tempfile
import time
import uuid

from mrl.assets import tokenizer_cache_dir
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_research import benchmarking

__all__ = ["main", "TARGET", "TASK", "tiny_policy", "grpo_config", "peer_experiences"]

TARGET = 1.10
TASK = {"family": "arithmetic", "level": 1, "seed": 0}
TINY = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256}
MODES = ("none", "xgrpo", "sgt")


def tiny_policy(seed: int = 0, tokenizer: str | None = None, architecture: dict | None = None):
    """(model, tokenizer): a tiny causal LM with random weights over a shipped tokenizer (default GPT-2's)."""
    from mrl_trainer.policy import ModelSpec, load_policy
    spec = ModelSpec(source="config", tokenizer=tokenizer or str(tokenizer_cache_dir() / "gpt2.tiktoken"),
                     architecture=architecture or TINY)
    return load_policy(spec, seed=seed)


def grpo_config(output_dir: str, *, P: int, G: int, T: int, steps: int, seed: int = 0, lr: float = 1e-3):
    """A GRPOConfig for the CPU: one generation of P prompts × G completions per optimizer step, prompts in order."""
    from trl import GRPOConfig
    return GRPOConfig(output_dir=output_dir, use_cpu=True, bf16=False, seed=seed, max_steps=steps,
                      per_device_train_batch_size=P * G, num_generations=G, gradient_accumulation_steps=1,
                      max_completion_length=T, temperature=1.0, shuffle_dataset=False, learning_rate=lr, beta=0.0,
                      activation_checkpointing=False, use_vllm=False, report_to="none", save_strategy="no",
                      logging_steps=1, disable_tqdm=True, dataloader_num_workers=0)


def peer_experiences(run_id: str, producer: str, task, tokenizer, tokenizer_id: str, steps: int, P: int,
                     rewards: list[float], answer_of=lambda problem: problem.answer) -> list:
    """What a peer publishes for steps 0..steps-1 (task.batch(t, P)): per prompt its group_stats (`rewards`) and,
    for each reward ≥ 1, a success "Answer: {answer_of(problem)}" in the ids of `tokenizer` (THL's `tokenizer_id`)."""
    out = []
    for t in range(steps):
        for i, problem in enumerate(task.batch(t, P)):
            text = f"Answer: {answer_of(problem)}"
            out.append(new_experience(run_id, producer, t, pb.GroupStats(
                prompt_id=problem.prompt_id, group_id=f"{producer}.{t}.{i}", rewards=rewards),
                f"{producer}.{t}.group_stats.{i}"))
            for k, _ in enumerate(r for r in rewards if r >= 1.0):
                out.append(new_experience(run_id, producer, t, pb.VerifiedSuccess(
                    prompt_id=problem.prompt_id, prompt_text=problem.question, response_text=text,
                    token_ids=tokenizer.encode(text) + [tokenizer.eos_token_id], reward=1.0,
                    answer=str(answer_of(problem)), group_id=f"{producer}.{t}.{i}", tokenizer_id=tokenizer_id),
                    f"{producer}.{t}.success.{i}.{k}"))
    return out


def _run(mode: str | None, init, tokenizer, task, target: str, P: int, G: int, T: int, steps: int) -> dict:
    """One training run (mode None: plain TRL); its median step time after the first, and what it used."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from mrl.exchange_client import ExchangeClient
    from mrl.integrations.trl import Mutual, MutualGRPOTrainer, task_dataset, task_reward
    times, cpu = [], []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)
            cpu.append(time.process_time() - self.cpu)

    model = copy.deepcopy(init)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="mrl-bench-trl-") as tmp, ExchangeClient(target) as exchange:
        kwargs = dict(model=model, reward_funcs=task_reward(task, steps * P), args=grpo_config(
            tmp, P=P, G=G, T=T, steps=steps), train_dataset=task_dataset(task, tokenizer, steps * P),
            processing_class=tokenizer, callbacks=[StepTimer()])
        used = 0
        if mode is None:
            trainer = GRPOTrainer(**kwargs)
            trainer.train()
        else:
            run_id = f"bench-trl-{uuid.uuid4().hex[:8]}"
            exchange.publish(peer_experiences(run_id, "peer", task, tokenizer, "gpt2", steps, P, rewards=[1.0] + [0.0] * (G - 1)))
            trainer = MutualGRPOTrainer(**kwargs, mutual=Mutual(
                exchange=exchange, run_id=run_id, policy="trl", tokenizer_id="gpt2", sharing=mode, peers=["peer"],
                peer_wait_s=30))
            try:
                trainer.train()
            finally:
                trainer.close()
            used = sum(r.get("peer_experiences_used", 0) for r in trainer.mutual_log)
    return {"step_s": statistics.median(times[1:] or times), "cpu_s": statistics.median(cpu[1:] or cpu),
            "peer_experiences_used": used}


def main(quick: bool = False) -> dict:
    import torch
    from mrl_serving.processes import redis_for, spawn
    from mrl.tasks import make_task
    P, G, T, steps, repeats = (1, 4, 8, 2, 2) if quick else (2, 8, 24, 5, 3)
    version = importlib.metadata.version
    torch.set_num_threads(1)
    threads = torch.get_num_threads()
    machine = benchmarking.machine(libraries=f"torch {torch.__version__}, transformers {version('transformers')}, "
                                             f"trl {version('trl')}")
    task = make_task(TASK)
    init, tokenizer = tiny_policy()
    print(f"mrl bench trl: {machine}\n  tiny GPT-2 (2 layers × 64), cpu, {threads} thread; arithmetic L1, P={P} × "
          f"G={G}, T={T}; {steps} steps per run (the first not timed), {repeats} repeats of plain, "
          f"{', '.join(MODES)} in turn, one process", flush=True)
    ratios: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_ratios: dict[str, list[float]] = {m: [] for m in MODES}
    plain_s: list[float] = []
    mode_s: dict[str, list[float]] = {m: [] for m in MODES}
    used: dict[str, int] = {m: 0 for m in MODES}
    with tempfile.TemporaryDirectory(prefix="mrl-bench-trl-") as data, redis_for(None, data) as url, \
            spawn("exchange", url, log_level="ERROR") as exchange:
        target = f"127.0.0.1:{exchange.ready['grpc_port']}"
        for r in range(repeats):
            base = _run(None, init, tokenizer, task, target, P, G, T, steps)
            plain = base["step_s"]
            plain_s.append(plain)
            line = [f"plain {plain:.3f} s (cpu {base['cpu_s']:.3f} s)"]
            for mode in MODES:
                result = _run(mode, init, tokenizer, task, target, P, G, T, steps)
                mode_s[mode].append(result["step_s"])
                ratios[mode].append(result["step_s"] / plain)
                cpu_ratios[mode].append(result["cpu_s"] / base["cpu_s"])
                used[mode] += result["peer_experiences_used"]
                line.append(f"{mode} {result['step_s']:.3f} s (×{ratios[mode][-1]:.3f}; "
                            f"cpu ×{cpu_ratios[mode][-1]:.3f})")
            print(f"  repeat {r + 1}: " + ", ".join(line), flush=True)
    per_mode = {m: {"step_s": round(statistics.median(mode_s[m]), 4),
                    "overhead_ratio": round(statistics.median(ratios[m]), 3),
                    "overhead_ratio_range": [round(min(ratios[m]), 3), round(max(ratios[m]), 3)],
                    "cpu_overhead_ratio": round(statistics.median(cpu_ratios[m]), 3),
                    "cpu_overhead_ratio_range": [round(min(cpu_ratios[m]), 3), round(max(cpu_ratios[m]), 3)],
                    "peer_experiences_used": used[m]} for m in MODES}
    worst = max(MODES, key=lambda m: per_mode[m]["overhead_ratio"])
    ratio = per_mode[worst]["overhead_ratio"]
    for m in MODES:
        lo, hi = per_mode[m]["overhead_ratio_range"]
        print(f"  {m:<6} step ×{per_mode[m]['overhead_ratio']} of plain TRL (range {lo}–{hi} over {repeats}), "
              f"cpu ×{per_mode[m]['cpu_overhead_ratio']}, peer experiences used {used[m]}", flush=True)
    result = {"bench": "trl", "machine": machine, "quick": quick, "threads": threads, "task": "arithmetic level 1",
              "P": P, "G": G, "T": T, "steps": steps, "repeats": repeats,
              "plain_step_s": round(statistics.median(plain_s), 4), "modes": per_mode, "worst_mode": worst,
              "overhead_ratio": ratio, "overhead_ratio_range": per_mode[worst]["overhead_ratio_range"],
              "cpu_overhead_ratio": max(per_mode[m]["cpu_overhead_ratio"] for m in MODES),
              "peer_experiences_used": sum(used.values()), "target": f"<= {TARGET}", "met": ratio <= TARGET,
              "anchor": "plain TRL GRPOTrainer, same model, prompts, seed and settings, same process"}
    print(f"  overhead ratio {ratio} ({worst}; target ≤ {TARGET}): {'met' if result['met'] else 'NOT met'}; "
          f"cpu overhead ratio {result['cpu_overhead_ratio']}", flush=True)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    import sys
    main(quick="--quick" in sys.argv[1:])

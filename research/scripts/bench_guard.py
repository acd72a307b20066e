"""The no-harm guard's cost per optimizer step on gradients shaped like SmolLM2-135M's, against float64 inner products.

    .venv/bin/python research/scripts/bench_guard.py [--steps N] [--threads T]

Times Guard.combine + Guard.observe (mrl_trainer.guard) on random float32 gradients with SmolLM2-135M's
parameter shapes (134.5M values), N steps after one warm-up, in CPU and wall seconds. The anchor, in the same
process on the same gradients: the same guard with its inner products computed the way it did before
(each chunk of 2^20 elements converted to float64, then multiplied). Prints each step's figures and ends
with one JSON line: median seconds of both, and ratio = guard ÷ anchor (CPU seconds).
"""
import argparse
import contextlib
import json
import statistics
import time
from unittest import mock

import torch

from mrl_trainer import guard as guard_module
from mrl_trainer.guard import Guard, GuardConfig

LAYERS = 30
SHAPES = [(49152, 576)] + [s for _ in range(LAYERS) for s in [
    (576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536), (576,), (576,)]] + [(576,)]


def float64_dot(a, b, chunk: int = 1 << 20) -> float:
    """The anchor: Σ ⟨a_p, b_p⟩ with every chunk converted to float64 first."""
    total = 0.0
    for x, y in zip(a, b):
        x, y = x.reshape(-1), y.reshape(-1)
        for i in range(0, x.numel(), chunk):
            total += float(torch.dot(x[i:i + chunk].double(), y[i:i + chunk].double()))
    return total


def timed_steps(steps: int) -> list[tuple[float, float]]:
    """(CPU s, wall s) of combine + observe per step, after one warm-up step; the same gradients every call."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    guard, out = Guard(GuardConfig()), []
    for step in range(steps + 1):
        solo = [torch.randn(s) for s in SHAPES]
        for p in params:
            p.grad = torch.randn(p.shape)
        cpu, wall = time.process_time(), time.perf_counter()
        guard.observe([guard.combine(params, solo)])
        if step:
            out.append((time.process_time() - cpu, time.perf_counter() - wall))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trainer in `mrl up` uses 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    values = sum(torch.Size(s).numel() for s in SHAPES)
    print(f"guard on {values / 1e6:.1f}M float32 gradient values, "
          f"{args.threads} thread(s), {args.steps} steps each")
    figures = {}
    for name in ("guard", "anchor", "guard", "anchor"):      # alternated: a load change hits both
        with mock.patch.object(guard_module, "_dot", float64_dot) if name == "anchor" else contextlib.nullcontext():
            steps = timed_steps(args.steps)
        figures.setdefault(name, []).extend(steps)
        print(name, " ".join(f"{cpu:.2f}/{wall:.2f}" for cpu, wall in steps), "(CPU/wall s per step)", flush=True)
    median = {name: [statistics.median(c for c, _ in v), statistics.median(w for _, w in v)]
              for name, v in figures.items()}
    print(json.dumps({"bench": "guard", "values": values,
                      "threads": args.threads, "guard_cpu_s": round(median["guard"][0], 3),
                      "guard_wall_s": round(median["guard"][1], 3), "anchor_cpu_s": round(median["anchor"][0], 3),
                      "anchor_wall_s": round(median["anchor"][1], 3),
                      "ratio": round(median["guard"][0] / median["anchor"][0], 3)}))


if __name__ == "__main__":
    main()

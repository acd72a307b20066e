"""SGT beside a peer that solves every prompt, in its own terse form: does a receiver that learns by itself gain
from correct rescues, or lose its form? Paired runs of SmolLM2 on 2-digit addition, solo against SGT.

    .venv/bin/python research/scripts/sgt_oracle_peer.py --seeds 0,1,2 [--arms none,sgt] [--parallel 2] [--out DIR]
                                                [--set KEY=VALUE ...] [--arm-set ARM:KEY=VALUE ...]

Every run is the trainer's own loop (examples/policy-a.yaml with examples/compare-addition.yaml's settings for
policy-a: 16 steps, held-out greedy accuracy on 96 problems at steps 0, 8 and 16, lockstep prompts), with no
exchange: in the SGT arm the peer inbox is an oracle that offers, for every prompt of the step, one success as
the demo's GPT-2 policy writes it ("Answer: N" and GPT-2's end of text, in GPT-2's ids). It goes the trainer's
way from there: THL's core retokenizes it into SmolLM2's ids (mrl.peers.Retokenizer, with SmolLM2's own end
of sequence, as build_trainer sets it), SGT re-verifies it and rescues the prompts whose own group failed,
under the no-harm guard. So the SGT arm differs from solo only by rescues that are always correct and always
in the peer's form: the best case for content, the worst for form.

An arm is a sharing mode, or a mode and a label (`sgt-prompts`: mode sgt) whose settings `--arm-set` changes
(`--arm-set sgt-prompts:sharing.sgt.normalize=prompts`); `--set` changes a setting in every arm. Each run writes its metrics
to DIR/s<seed>/<arm>/metrics.jsonl; the comparison (mrl_launcher.analysis.compare: crossed bootstrap over
seeds and problems, and the t-interval over seeds) goes to DIR/compare.json and the last line printed. A run
whose metrics in DIR already hold its final evaluation is kept, not run again (runs are deterministic: one
torch thread each), so an arm can be added to a finished comparison; a run cut short is run again from the
start. Each run holds about 7 GB of memory (on 24 GB: --parallel 2); its checkpoint is deleted at its end.
"""
import argparse
import json
import os
import pathlib
import shutil
import time
from concurrent.futures import ProcessPoolExecutor

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = {"steps": 16, "eval.every": 8, "eval.problems": 96, "task.family": "arithmetic", "task.level": 2,
            "checkpoint.every": 1000, "checkpoint.resume": False, "scheduler": None, "device": "cpu",
            "sharing.coupling": "lockstep", "sharing.mode": "none"}


class OraclePeer:
    """A peer inbox whose peer solves every prompt: one success per prompt id of the step, in GPT-2's ids."""

    def __init__(self, task, gpt2):
        self.task, self.gpt2 = task, gpt2

    def collect(self, step, prompt_ids, timeout_s, stop=None):
        from mrl.peers import Arrived, _Entry
        from mrl.v1 import experience_pb2 as pb
        entries = {}
        for pid in prompt_ids:
            text = f"Answer: {self.task.find(pid).answer}"
            success = pb.VerifiedSuccess(prompt_id=pid, response_text=text, reward=1.0, tokenizer_id="gpt2",
                                         token_ids=[*map(int, self.gpt2.encode(text)), self.gpt2.eos_id])
            entries[pid] = {"oracle": _Entry(version=step, successes=[success])}
        return Arrived(entries=entries, capability={}, waited_s=0.0, complete=1.0)

    def close(self):
        pass


def run(seed: int, arm: str, out: str, overrides: dict) -> str:
    """One run; returns its metrics path."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from mrl_research.lab.exchange import InProcessAlign
    from mrl_tokenizer_align.catalog import cached_paths
    from mrl_tokenizer_align.vocab import load_vocab
    from mrl_trainer.config import load_config
    from mrl_trainer.peers import Retokenizer
    from mrl_trainer.sharing import make_sharing, mode_sections, sharing_config
    from mrl_trainer.trainer import build_trainer

    folder = pathlib.Path(out) / f"s{seed}" / arm
    metrics = folder / "metrics.jsonl"
    steps = overrides.get("steps", SETTINGS["steps"])
    if metrics.exists() and any(r.get("kind") == "eval" and r["step"] == steps
                                for r in map(json.loads, metrics.read_text().splitlines())):
        return str(metrics)
    metrics.unlink(missing_ok=True)       # a run cut short starts again from nothing
    folder.mkdir(parents=True, exist_ok=True)
    mode = arm.split("-")[0]
    config = load_config(ROOT / "examples" / "policy-a.yaml", {
        **SETTINGS, **overrides, "seed": seed, "checkpoint.dir": str(folder / "checkpoints"),
        "metrics.jsonl": str(metrics), "sharing.mode": mode})
    # built solo (no exchange: the oracle below is its peer), then given the arm's mode, its knobs as configured
    trainer = build_trainer(config.model_copy(update={"sharing": sharing_config(
        **{**mode_sections(config.sharing.model_dump(), "none"), "mode": "none"})}))
    if mode != "none":
        trainer.sharing = make_sharing(config.sharing, config.loss)
        paths = cached_paths()
        vocabs = {t: load_vocab(t, paths[t]) for t in ("gpt2", "smollm2")}
        trainer.inbox = OraclePeer(trainer.task, vocabs["gpt2"])
        trainer.retokenize = Retokenizer("smollm2", InProcessAlign(vocabs), end_id=trainer.tokenizer.eos_token_id)
    start = time.perf_counter()
    try:
        trainer.run()
    finally:
        trainer.close()
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)     # 1.5 GB each; the metrics are what counts
    print(f"s{seed} {arm}: {time.perf_counter() - start:.0f} s", flush=True)
    return str(metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="none,sgt", help="sharing modes; none is the baseline")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once, one torch thread each")
    parser.add_argument("--out", default=".mrl/sgt-oracle-peer")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--arm-set", action="append", default=[], metavar="ARM:KEY=VALUE")
    args = parser.parse_args()
    seeds, arms = [int(s) for s in args.seeds.split(",")], args.arms.split(",")
    if "none" not in arms:
        raise SystemExit("--arms must include none, the baseline")
    overrides = {arm: {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)} for arm in arms}
    for item in args.arm_set:
        arm, setting = item.split(":", 1)
        if arm not in arms:
            raise SystemExit(f"--arm-set {item}: {arm!r} is not among --arms")
        key, value = setting.split("=", 1)
        overrides[arm][key] = yaml.safe_load(value)
    os.environ.setdefault("MRL_TOKENIZER_CACHE", str(pathlib.Path("~/.cache/mrl/tokenizers").expanduser()))
    jobs = [(seed, arm) for seed in seeds for arm in arms]
    with ProcessPoolExecutor(args.parallel) as pool:
        paths = dict(zip(jobs, pool.map(run, *zip(*[(s, a, args.out, overrides[a]) for s, a in jobs]))))
    from mrl_launcher.analysis import compare
    figures = compare({f"s{seed}": {arm: [paths[seed, arm]] for arm in arms} for seed in seeds})
    (pathlib.Path(args.out) / "compare.json").write_text(json.dumps(figures, indent=1))
    policy = next(iter(figures["policies"]))
    summary = {arm: {k: v for k, v in entry.items() if k in ("final_accuracy", "final_ci", "finals", "delta_baseline",
                                                              "delta_baseline_ci", "delta_baseline_seeds_ci",
                                                              "rollouts_to_baseline")}
               for arm, entry in figures["policies"][policy].items()}
    print(json.dumps({"seeds": seeds, "set": overrides, "policy": policy, **summary}))


if __name__ == "__main__":
    main()

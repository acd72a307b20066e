"""What SGT's rescues do to a receiver by themselves: rescue-only updates of SmolLM2 on 2-digit addition.

    .venv/bin/python research/scripts/sgt_rescue_probe.py [--steps K] [--rescues R] [--seed S] [--set KEY=VALUE ...]

The case SGT meets on a step where every own group failed and a peer solved some of its prompts: the own GRPO
term is zero, so the update is λ·NLL of the rescued responses alone (the guard passes a peer term when the own
gradient is zero). Each arm starts from the same SmolLM2 (examples/policy-a.yaml on 2-digit addition, the
trainer's own code: SGT's plan, the update with the guard, AdamW) and makes K such updates, each rescuing R
prompts that SmolLM2 answers correctly by greedy decoding, with a correct response in one of these forms:

    own    SmolLM2's own greedy response (its form, ending with its own end of turn)
    peer   the form the demo's GPT-2 policy answers in, "Answer: N" and GPT-2's <|endoftext|>, retokenized
           by THL's core in process (its end becomes SmolLM2's <|endoftext|>): what SGT trained on before
           the trainer's Retokenizer put the receiver's own end in place
    peer-end  the peer's form, but ending with the receiver's own end of turn (its EOS) in place of the
           <|endoftext|> THL maps GPT-2's end to
    hinted the peer's response rewritten by the receiver: SmolLM2 samples `--hint-samples` responses (T = 1)
           to the prompt with the peer's response shown as a hint, and the first its verifier accepts is
           trained on, as a response to the prompt without the hint (STaR's rationalization, Zelikman et
           al. 2022); a prompt with no accepted rewrite is not rescued
    hinted-answer  the same, but the hint is only the answer the receiver's verifier extracted from the
           peer's response ("the answer is N"), as STaR gives it, not the peer's text: what the trainer's
           sharing.sgt.rationalize does (mrl_trainer.rationalize.hinted)

So own and peer differ only in the form of equally correct responses. After each update: greedy accuracy on
the held-out problems, the share of greedy answers cut at the token limit, and the mean answer length.
`--set` overrides a field of the trainer config (e.g. sharing.sgt.lam=0.01).
Ends with one JSON line.
"""
import argparse
import json
import os
import pathlib
import tempfile

import numpy as np
import yaml

from mrl_research.lab.exchange import InProcessAlign
from mrl_tokenizer_align.catalog import cached_paths
from mrl_tokenizer_align.vocab import load_vocab
from mrl_trainer.config import load_config
from mrl_trainer.experience import StepBatch
from mrl_trainer.peers import Retokenizer
from mrl.prompts import prompt_ids
from mrl_trainer.rationalize import hinted
from mrl_trainer.rollout.base import SamplingParams
from mrl_trainer.sharing import make_sharing, mode_sections, sharing_config
from mrl_trainer.sharing.base import PeerBatch, PeerSample
from mrl_trainer.trainer import build_trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = {"task.family": "arithmetic", "task.level": 2, "eval.problems": 96, "device": "cpu"}


def evaluate(trainer) -> dict[str, float]:
    """Greedy decoding on the held-out problems: accuracy, share cut at the token limit, mean answer tokens."""
    problems = trainer.task.batch(0, trainer.cfg.eval.problems, split="eval")
    samples = greedy(trainer, problems)
    correct = [trainer._verify(p, s.text)[0] >= 1.0 for p, s in zip(problems, samples)]
    return {"accuracy": float(np.mean(correct)), "truncated": float(np.mean([s.truncated for s in samples])),
            "tokens": float(np.mean([len(s.ids) for s in samples]))}


def greedy(trainer, problems):
    params = SamplingParams(max_new_tokens=trainer.cfg.rollout.max_new_tokens, temperature=0.0)
    with trainer.autocast():
        return [g[0] for g in trainer.engine.generate([trainer._prompt(p) for p in problems], 1, params)]


def peer_form(problem, gpt2, retokenize: Retokenizer) -> tuple[list[int], str]:
    """"Answer: N" + <|endoftext|> in GPT-2's ids, retokenized into SmolLM2's as the trainer does it."""
    text = f"Answer: {problem.answer}"
    ids, _, _ = retokenize([("gpt2", [*map(int, gpt2.encode(text)), gpt2.eos_id])])
    return ids[0], text


def rewrite(trainer, problem, peer_text: str, samples: int, seed: int, answer_only: bool = False) -> tuple[list[int], str]:
    """The receiver's own response, sampled with the peer's response (`answer_only`: the answer its verifier
    extracts from it) as a hint and accepted by its verifier against the problem as posed: ([], "") when none
    of `samples` is."""
    if answer_only:
        question = hinted(problem.question, trainer._verify(problem, peer_text)[1])
    else:
        question = f'{problem.question}\nHint: a correct response is "{peer_text}".'
    prompt = prompt_ids(trainer.tokenizer, question, trainer.cfg.system_prompt)
    params = SamplingParams(max_new_tokens=trainer.cfg.rollout.max_new_tokens, temperature=1.0, seed=seed)
    with trainer.autocast():
        group = trainer.engine.generate([prompt], samples, params)[0]
    accepted = [s for s in group if trainer._verify(problem, s.text)[0] >= 1.0]
    return (list(accepted[0].ids), accepted[0].text) if accepted else ([], "")


def arm(form: str, args, overrides: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(ROOT / "examples" / "policy-a.yaml", {
            **TASK, **overrides, "seed": args.seed, "checkpoint.dir": tmp, "checkpoint.resume": False,
            "metrics.jsonl": f"{tmp}/metrics.jsonl", "scheduler": None, "sharing.mode": "sgt"})
        # built solo (no exchange to take peers from), then given the arm's SGT, its knobs as configured
        trainer = build_trainer(config.model_copy(update={"sharing": sharing_config(
            **{**mode_sections(config.sharing.model_dump(), "none"), "mode": "none"})}))
        trainer.sharing = make_sharing(config.sharing, config.loss)
        paths = cached_paths()
        vocabs = {t: load_vocab(t, paths[t]) for t in ("gpt2", "smollm2")}
        # the trainer's Retokenizer over THL's core; peer: THL's end as mapped, as before end_id existed
        retokenize = Retokenizer("smollm2", InProcessAlign(vocabs),
                                 end_id=trainer.tokenizer.eos_token_id if form == "peer-end" else None)
        pool = trainer.task.batch(1000, args.pool)                      # train problems, none of the eval split
        solved = [(p, s) for p, s in zip(pool, greedy(trainer, pool)) if trainer._verify(p, s.text)[0] >= 1.0]
        print(f"{form}: {len(solved)} of {len(pool)} train problems solved greedily at the start", flush=True)
        rows = [{"update": 0, **evaluate(trainer)}]
        print(form, rows[-1], flush=True)
        for k in range(args.steps):
            chosen = solved[k * args.rescues:(k + 1) * args.rescues]
            if len(chosen) < args.rescues:
                break
            problems = [p for p, _ in chosen]
            samples = [[s] for _, s in chosen]
            batch = StepBatch(step=k, problems=problems, samples=samples, rewards=[[0.0] for _ in chosen],
                              answers=[[None] for _ in chosen])       # as if every own group had failed
            successes = {}
            for i, (p, s) in enumerate(chosen):
                ids, text = (s.ids, s.text) if form == "own" else peer_form(p, vocabs["gpt2"], retokenize)
                if form.startswith("hinted"):
                    ids, text = rewrite(trainer, p, text, args.hint_samples, seed=args.seed * 1000 + k,
                                        answer_only=form == "hinted-answer")
                if ids:
                    successes[i] = [PeerSample(producer="peer", prompt_index=i, ids=list(ids), text=text, reward=1.0)]
            plan = trainer.sharing.plan(batch, PeerBatch(successes=successes), capability=0.0,
                                        verify=trainer._verifier(batch))
            stats = trainer.update(batch, plan)
            if not plan.extras:
                rows.append({**rows[-1], "update": k + 1, "rescued": 0})
                print(form, "nothing rescued", flush=True)
                continue
            rows.append({"update": k + 1, "rescued": plan.stats.get("sgt_rescued"),
                         "grad_norm": stats.get("grad_norm"), "nll": stats.get("sgt_nll"), **evaluate(trainer)})
            print(form, rows[-1], flush=True)
        trainer.close()
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rescues", type=int, default=1, help="prompts rescued per update")
    parser.add_argument("--pool", type=int, default=64, help="train problems to find greedily solved ones in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hint-samples", type=int, default=8, help="hinted arm: samples per rescued prompt")
    parser.add_argument("--arms", default="own,peer,peer-end,hinted",
                        help="comma-separated, among own, peer, peer-end, hinted, hinted-answer")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    os.environ.setdefault("MRL_TOKENIZER_CACHE", str(pathlib.Path("~/.cache/mrl/tokenizers").expanduser()))
    result = {form: arm(form, args, overrides) for form in args.arms.split(",")}
    summary = {form: {"accuracy": [r["accuracy"] for r in rows], "truncated": [r["truncated"] for r in rows]}
               for form, rows in result.items()}
    print(json.dumps({"steps": args.steps, "rescues": args.rescues, "seed": args.seed,
                      "set": overrides,
                      **summary}))


if __name__ == "__main__":
    main()

"""`mrl lab pair A.yaml B.yaml`: what two policies can give each other on a task, measured before any comparison.

Mutual RL can only pay where the policies differ: SGT learns from a peer's verified success on a prompt whose own
group all failed, and the other modes reuse a peer's rollouts where they carry a signal the policy's own lack. For
two trainer configs on the same task (so the same prompt ids), on its first P training prompts x (the prompts the
runs' first steps see; with split "eval", its first P held-out ones, which tell a skill from answers a warm start
fitted on a small training split), each policy X as its run would start (checkpoint, else warm start:
grpo_signal.probe_trainer) gives

    greedy solve set    S_X = {x : X's greedy response (its max_new_tokens) is verified}
    sampled             c_X(x) = verified among G samples (its rollout settings: G, T, max_new_tokens)
    solved set          T_X = {x : c_X(x) > 0}; all-fail set F_X = {x : c_X(x) = 0}, the groups with no GRPO signal

and, for the pair,

    overlap             |S_A ∩ S_B| against chance |S_A|·|S_B| / P (independent solve sets), and the same for T
    only                |S_A − S_B|, |S_B − S_A|: what each solves greedily that the other does not
    rescue share        r(A←B) = |F_A ∩ T_B| / |F_A|: of A's all-fail groups, the share where B succeeds at least
                        once, the prompts SGT can rescue for A (and r(B←A) the other way)

On a mixture (mrl.tasks.mixture) the same figures are given per part ("per_part"). An overlap above chance means
the two find the same prompts easy (little to give); a rescue share near 0 means SGT has nothing to teach. Nothing is
trained, published or checkpointed.
"""
import tempfile

from mrl.tasks import Split
from mrl.tasks.base import check_split
from mrl_research.lab.grpo_signal import probe_trainer
from mrl_trainer.config import load_config
from mrl_trainer.errors import TrainerError

__all__ = ["solve_sets", "compare_sets", "measure_pair"]


def solve_sets(config_path: str, overrides: dict | None, prompts: int, split: Split = "train") -> dict:
    """One policy on the first `prompts` prompts of the split: {policy, task, greedy: {prompt_id: 0|1},
    sampled: {prompt_id: successes of G}, parts: {prompt_id: a mixture's part or None}, group_size, temperature,
    max_new_tokens}."""
    with tempfile.TemporaryDirectory(prefix="mrl-pair-") as scratch:
        config, trainer = probe_trainer(config_path, overrides, scratch)
        try:
            problems = trainer.task.batch(0, prompts, split)
            rollout = config.rollout
            # model_copy skips validation: temperature 0 is the engine's greedy decoding, as in evaluation
            trainer.cfg = config.model_copy(update={"rollout": rollout.model_copy(
                update={"temperature": 0.0, "group_size": 1})})
            greedy = trainer.rollout(0, problems)
            trainer.cfg = config
            sampled = trainer.rollout(0, problems)
        finally:
            trainer.close()
    return {"policy": config.policy, "task": trainer.task.name, "task_seed": config.task.seed,
            "group_size": rollout.group_size, "temperature": rollout.temperature,
            "max_new_tokens": rollout.max_new_tokens,
            "parts": {p.prompt_id: p.meta.get("part") for p in problems},
            "greedy": {p.prompt_id: int(g[0] >= 1.0) for p, g in zip(problems, greedy.rewards)},
            "sampled": {p.prompt_id: sum(r >= 1.0 for r in g) for p, g in zip(problems, sampled.rewards)}}


def _overlap(a: set, b: set, n: int) -> dict:
    return {"a": len(a), "b": len(b), "both": len(a & b), "chance": len(a) * len(b) / n,
            "only_a": len(a - b), "only_b": len(b - a)}


def compare_sets(a: dict, b: dict) -> dict:
    """The pair's figures of the module docstring from two solve_sets results over the same prompt ids."""
    if list(a["greedy"]) != list(b["greedy"]):
        raise TrainerError(f"{a['policy']} ({a['task']}, task seed {a['task_seed']}) and {b['policy']} "
                           f"({b['task']}, task seed {b['task_seed']}) do not see the same prompts: give both the "
                           "same task (family, level, seed)")
    ids = list(a["greedy"])
    n = len(ids)

    def sets(x):
        return ({i for i in ids if x["greedy"][i]}, {i for i in ids if x["sampled"][i] > 0})
    (sa, ta), (sb, tb) = sets(a), sets(b)

    def side(x, s, t, other_t):
        fail = set(ids) - t
        return {"policy": x["policy"], "greedy": len(s) / n,
                "sampled": sum(x["sampled"].values()) / (n * x["group_size"]), "all_fail": len(fail),
                "rescuable": len(fail & other_t), "rescue_share": len(fail & other_t) / len(fail) if fail else None}
    result = {"task": a["task"], "prompts": n, "a": side(a, sa, ta, tb), "b": side(b, sb, tb, ta),
              "greedy_overlap": _overlap(sa, sb, n), "solved_overlap": _overlap(ta, tb, n)}
    parts = dict.fromkeys(part for part in a.get("parts", {}).values() if part)
    if len(parts) > 1:          # a mixture: the same figures on each part's prompts
        result["per_part"] = {part: compare_sets(_only(a, part), _only(b, part)) for part in parts}
    return result


def measure_pair(config_a: str, config_b: str, *, prompts: int, split: Split = "train", overrides: dict | None = None,
                 overrides_a: dict | None = None, overrides_b: dict | None = None) -> dict:
    """Both policies' solve sets (`overrides` for both, then each one's own) and the pair's figures; the per-prompt
    sets are kept under "per_prompt" as {prompt_id: [greedy_a, successes_a, greedy_b, successes_b]}."""
    if prompts < 1:
        raise TrainerError(f"--prompts {prompts}: give at least one prompt")
    check_split(split)
    settings = [{**(overrides or {}), **(mine or {})} for mine in (overrides_a, overrides_b)]
    tasks = [load_config(path, s).task for path, s in zip((config_a, config_b), settings)]
    if tasks[0] != tasks[1]:      # before any model is built
        raise TrainerError(f"the two policies do not see the same prompts ({tasks[0].model_dump(exclude_none=True)} "
                           f"against {tasks[1].model_dump(exclude_none=True)}): give both the same task")
    a, b = (solve_sets(path, s, prompts, split) for path, s in zip((config_a, config_b), settings))
    result = compare_sets(a, b)
    result["split"] = split
    result["settings"] = {x["policy"]: {k: x[k] for k in ("group_size", "temperature", "max_new_tokens")}
                          for x in (a, b)}
    result["per_prompt"] = {i: [a["greedy"][i], a["sampled"][i], b["greedy"][i], b["sampled"][i]]
                            for i in a["greedy"]}
    return result


def _only(sets: dict, part: str) -> dict:
    ids = [i for i, p in sets["parts"].items() if p == part]
    return {**sets, "task": part, "parts": {i: part for i in ids}, "greedy": {i: sets["greedy"][i] for i in ids},
            "sampled": {i: sets["sampled"][i] for i in ids}}

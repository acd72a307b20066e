"""`mrl lab pair` on a real pair, SmolLM2-135M-Instruct (which adds 1-digit numbers) and a tiny GPT-2 of random
weights over the real GPT-2 tokenizer (which does not): the per-prompt sets come from each policy's own greedy and
sampled rollouts, the pair's figures follow from them by the module's definitions (checked by hand on a small case
too), and policies that do not see the same prompts are refused before any model is built."""
import contextlib
import io
import json

import pytest
import yaml

from helpers import tiny_config
from mrl.assets import tokenizer_cache_dir
from mrl.cli import main
from mrl_research.lab.pair import compare_sets, measure_pair
from mrl_trainer.errors import TrainerError
from mrl.tasks import TaskError, make_task


def _sets(policy, greedy, sampled, group_size=4):
    ids = [f"arithmetic-L1:train:0:{i}" for i in range(len(greedy))]
    return {"policy": policy, "task": "arithmetic-L1", "task_seed": 0, "group_size": group_size,
            "greedy": dict(zip(ids, greedy)), "sampled": dict(zip(ids, sampled))}


def test_the_pair_figures_by_hand():
    a = _sets("a", greedy=[1, 1, 0, 0, 0], sampled=[4, 2, 0, 0, 1])
    b = _sets("b", greedy=[1, 0, 1, 0, 0], sampled=[3, 0, 2, 1, 0])
    result = compare_sets(a, b)
    assert result["greedy_overlap"] == {"a": 2, "b": 2, "both": 1, "chance": 2 * 2 / 5, "only_a": 1, "only_b": 1}
    assert result["solved_overlap"] == {"a": 3, "b": 3, "both": 1, "chance": 3 * 3 / 5, "only_a": 2, "only_b": 2}
    # a fails all of prompts 2 and 3, b solves both; b fails all of 1 and 4, a solves both
    assert result["a"] == {"policy": "a", "greedy": 0.4, "sampled": 7 / 20, "all_fail": 2, "rescuable": 2,
                           "rescue_share": 1.0}
    assert result["b"]["all_fail"] == 2 and result["b"]["rescue_share"] == 1.0
    everything = _sets("c", greedy=[1] * 5, sampled=[4] * 5)
    assert compare_sets(everything, b)["a"]["rescue_share"] is None     # no all-fail group: nothing to rescue
    with pytest.raises(TrainerError, match="do not see the same prompts"):
        compare_sets(a, _sets("d", greedy=[1, 0], sampled=[1, 0]))
    assert "per_part" not in result


def test_a_mixture_is_also_measured_per_part():
    a = _sets("a", greedy=[1, 1, 0, 0, 0], sampled=[4, 2, 0, 0, 1])
    b = _sets("b", greedy=[1, 0, 1, 0, 0], sampled=[3, 0, 2, 1, 0])
    for x in (a, b):        # prompts 0, 2, 4 from one part, 1, 3 from the other
        x["parts"] = {i: ("arithmetic-L2", "linear-L1")[k % 2] for k, i in enumerate(x["greedy"])}
    result = compare_sets(a, b)
    assert list(result["per_part"]) == ["arithmetic-L2", "linear-L1"]
    add, lin = result["per_part"]["arithmetic-L2"], result["per_part"]["linear-L1"]
    assert (add["task"], add["prompts"], lin["prompts"]) == ("arithmetic-L2", 3, 2)
    # arithmetic: a's counts 4, 0, 1 and b's 3, 2, 0; linear: a's 2, 0 and b's 0, 1
    assert (add["a"]["all_fail"], add["a"]["rescuable"], add["b"]["all_fail"], add["b"]["rescuable"]) == (1, 1, 1, 1)
    assert (lin["a"]["all_fail"], lin["a"]["rescuable"], lin["b"]["all_fail"], lin["b"]["rescuable"]) == (1, 1, 1, 1)
    assert add["a"]["sampled"] == 5 / 12 and lin["b"]["greedy"] == 0.0
    assert "per_part" not in add


def _config(tmp_path, name, **model):
    path = tmp_path / f"{name}.yaml"
    settings = {"rollout.group_size": 4, "rollout.max_new_tokens": 12, **({"model": model} if model else {})}
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / name, policy=name, **settings)))
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(600)    # SmolLM2 from the model cache, 12 × (1 + 4) short responses of each policy
def test_a_policy_that_adds_and_one_that_cannot_measured_on_the_same_prompts(tmp_path):
    smollm2 = next((tokenizer_cache_dir() / "smollm2").glob("*.gguf"))
    a, b = _config(tmp_path, "a", source="gguf", path=str(smollm2)), _config(tmp_path, "b")
    result = measure_pair(a, b, prompts=12)
    task = make_task({"family": "arithmetic", "level": 1, "seed": 0})
    assert list(result["per_prompt"]) == [p.prompt_id for p in task.batch(0, 12)]
    rows = list(result["per_prompt"].values())
    assert all(g in (0, 1) and 0 <= c <= 4 for row in rows for g, c in (row[:2], row[2:]))
    assert sum(row[1] for row in rows) > 0 and result["b"]["rescuable"] > 0     # not a vacuous measure
    assert sum(row[3] for row in rows) == 0 and result["b"]["all_fail"] == 12      # random weights solve nothing
    assert result["b"]["rescue_share"] == sum(row[1] > 0 for row in rows) / 12
    for side, (g, c) in (("a", (0, 1)), ("b", (2, 3))):
        assert result[side]["greedy"] == sum(row[g] for row in rows) / 12
        assert result[side]["sampled"] == sum(row[c] for row in rows) / 48
        other = 3 if side == "a" else 1
        assert result[side]["all_fail"] == sum(row[c] == 0 for row in rows)
        assert result[side]["rescuable"] == sum(row[c] == 0 and row[other] > 0 for row in rows)
    assert result["greedy_overlap"]["both"] == sum(row[0] and row[2] for row in rows)
    assert result["settings"] == {"a": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 12},
                                  "b": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 12}}
    assert not (tmp_path / "a" / "ckpt").exists()          # nothing trained by RL, published or checkpointed
    assert result["split"] == "train"
    out = io.StringIO()                                    # the command, on the held-out prompts
    with contextlib.redirect_stdout(out):
        main(["lab", "pair", a, b, "--prompts", "12", "--split", "eval", "--out", str(tmp_path / "pair.json")])
    lines = out.getvalue().strip().splitlines()
    assert lines[0] == "arithmetic-L1, the first 12 eval prompts"
    held_out = json.loads((tmp_path / "pair.json").read_text())
    assert json.loads(lines[-1]) == {k: v for k, v in held_out.items() if k != "per_prompt"}
    assert list(held_out["per_prompt"]) == [p.prompt_id for p in task.batch(0, 12, "eval")]
    assert held_out["split"] == "eval"
    assert held_out["a"]["greedy"] == sum(row[0] for row in held_out["per_prompt"].values()) / 12


def test_policies_on_different_tasks_are_refused_before_a_model_is_built(tmp_path):
    a, b = _config(tmp_path, "a"), _config(tmp_path, "b")
    with pytest.raises(TrainerError, match="do not see the same prompts"):
        measure_pair(a, b, prompts=4, overrides_b={"task.level": 2, "model.tokenizer": "/no/such/file"})
    with pytest.raises(TrainerError, match="at least one prompt"):
        measure_pair(a, b, prompts=0)
    with pytest.raises(TaskError, match="unknown split 'test'"):
        measure_pair(a, b, prompts=4, split="test")

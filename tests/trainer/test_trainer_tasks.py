"""Verifiable tasks (mrl.tasks): determinism, disjoint splits, exact and safe verifiers,
JSONL loading checked by math-verify, and clear errors for bad specs and files."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from fractions import Fraction
from typing import get_args

import pytest

import mrl_trainer
from mrl.tasks import TASK_FAMILIES, Family, Problem, Split, TaskError, TaskSpec, make_task
from mrl.tasks.base import NumericTask, ProceduralTask, final_number, split_of

PROCEDURAL = [f for f, cls in TASK_FAMILIES.items() if issubclass(cls, ProceduralTask)]
NUMERIC = [f for f, cls in TASK_FAMILIES.items() if issubclass(cls, NumericTask)]
GARBAGE = ["", "   ", "Answer:", "Answer: banana", "\\boxed{", "\\boxed{}", "}{}{", "Answer: -", "−", "NaN inf",
           "1e999999", "\x00\xff\ud7ff", "Answer: " + "(" * 500, "9" * 10_000, "x" * 100_000,
           "Answer: __import__('os').system('true')", "Answer: $9^{9^{9^{9}}}$"]


def _dump(problems: list[Problem]) -> list:
    return [[p.prompt_id, p.question, p.answer, p.meta] for p in problems]


def _accepted(problem: Problem) -> list[str]:
    """The reference answer written in every way a verifier must accept."""
    a = problem.answer
    forms = [f"Answer: {a}", f"Let me think.\nAnswer: {a}.\n", f"**Answer:** {a}", f"\\boxed{{{a}}}",
             f"The result is $\\boxed{{{a}}}$.", f"answer: \\boxed{{{a}}}"]
    if "target" in problem.meta:
        t = problem.meta["target"]
        return forms + [f"Answer: {a} = {t}", f"Try this:\n{a} = {t}\nDone.", f"Answer: {a.replace('*', '×')}"]
    forms += [f"So the result is {a}", f"It equals {a}.", f"Answer: x = {a}", f"Answer: {Fraction(a)}.0"]
    if abs(int(a)) >= 1000:
        forms.append(f"Answer: {int(a):,}")
    return forms


def _wrong(problem: Problem) -> str:
    if "target" in problem.meta:
        return f"Answer: {problem.meta['numbers'][0]}"   # a given number is never the target
    return f"Answer: {int(problem.answer) + 1}"


# --- the registry and make_task ------------------------------------------------------------------
def test_registry_covers_the_family_literal():
    assert set(TASK_FAMILIES) == set(get_args(Family))


def test_make_task_rejects_an_unknown_family_naming_the_valid_ones():
    with pytest.raises(TaskError) as info:
        make_task({"family": "chess"})
    assert all(repr(f) in str(info.value) for f in get_args(Family))


@pytest.mark.parametrize("family", PROCEDURAL)
def test_make_task_rejects_levels_out_of_range(family):
    with pytest.raises(TaskError, match="greater than or equal to 1"):
        make_task({"family": family, "level": 0})
    top = TASK_FAMILIES[family].max_level
    make_task({"family": family, "level": top})
    with pytest.raises(TaskError, match=f"valid levels are 1..{top}"):
        make_task({"family": family, "level": top + 1})


@pytest.mark.parametrize("spec, message", [
    pytest.param({"family": "jsonl"}, "needs path", id="jsonl-without-path"),
    pytest.param({"family": "arithmetic", "path": "x.jsonl"}, "only for family 'jsonl'", id="path-on-procedural"),
    pytest.param({"family": "arithmetic", "levle": 2}, "levle", id="unknown-field"),
    pytest.param({"family": "arithmetic", "answer_format": "xml"}, "'answer' or 'boxed'", id="bad-answer-format"),
])
def test_make_task_rejects_bad_specs(spec, message):
    with pytest.raises(TaskError, match=message):
        make_task(spec)


def test_make_task_accepts_a_spec_object():
    assert make_task(TaskSpec(family="arithmetic", level=2)).name == "arithmetic-L2"


# --- determinism and splits --------------------------------------------------------------------
@pytest.mark.parametrize("family", PROCEDURAL)
def test_problems_are_a_pure_function_of_name_seed_split_index(family):
    a, b = make_task({"family": family, "level": 2, "seed": 7}), make_task({"family": family, "level": 2, "seed": 7})
    assert _dump(a.batch(3, 5)) == _dump(b.batch(3, 5)) == _dump([b.problem(i) for i in range(15, 20)])
    assert a.problem(15).prompt_id == f"{family}-L2:train:7:15"
    assert a.problem(0, "eval").prompt_id == f"{family}-L2:eval:7:0"
    other_seed = make_task({"family": family, "level": 2, "seed": 8})
    assert _dump(a.batch(0, 20)) != _dump(other_seed.batch(0, 20))
    assert a.size() is None


def test_problems_do_not_depend_on_the_process_hash_seed():
    script = ("import json; from mrl.tasks import make_task, TASK_FAMILIES\n"
              "from mrl.tasks.base import ProceduralTask\n"
              "print(json.dumps({f: [[p.prompt_id, p.question, p.answer, p.meta] for p in "
              "make_task({'family': f, 'level': 2, 'seed': 3}).batch(0, 20) + "
              "make_task({'family': f, 'level': 2, 'seed': 3}).batch(0, 5, 'eval')] "
              "for f, c in TASK_FAMILIES.items() if issubclass(c, ProceduralTask)}))")
    env = dict(os.environ, PYTHONHASHSEED="12345",
               PYTHONPATH=os.pathsep.join([str(pathlib.Path(mrl_trainer.__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    here = {f: _dump(make_task({"family": f, "level": 2, "seed": 3}).batch(0, 20)
                     + make_task({"family": f, "level": 2, "seed": 3}).batch(0, 5, "eval")) for f in PROCEDURAL}
    assert json.loads(out.stdout) == here


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("family", PROCEDURAL)
def test_train_and_eval_questions_are_disjoint(family, level):
    task = make_task({"family": family, "level": level})
    train = {p.question for p in task.batch(0, 300)}
    held_out = {p.question for p in task.batch(0, 60, "eval")}
    assert train.isdisjoint(held_out)
    assert all(split_of(q.removesuffix(task.pose(""))) == "eval" for q in held_out)


@pytest.mark.parametrize("family", PROCEDURAL)
def test_levels_change_difficulty(family):
    def mean_question_length(level):
        return sum(len(p.question) for p in make_task({"family": family, "level": level}).batch(0, 50)) / 50
    assert mean_question_length(1) < mean_question_length(2) < mean_question_length(3)


def test_arithmetic_levels_are_digits_and_low_levels_are_addition():
    for level in (1, 2, 3):
        metas = [p.meta for p in make_task({"family": "arithmetic", "level": level}).batch(0, 100)]
        assert all(len(str(m[k])) == level for m in metas for k in "ab" if level > 1)
        assert all(m["a"] < 10 ** level for m in metas)
        if level <= 2:
            assert {m["op"] for m in metas} == {"+"}


def test_countdown_levels_add_numbers_and_every_target_is_reachable():
    for level in (1, 2, 3):
        for p in make_task({"family": "countdown", "level": level}).batch(0, 30):
            assert len(p.meta["numbers"]) == level + 2 and p.meta["target"] not in p.meta["numbers"]


@pytest.mark.parametrize("bad", [
    pytest.param(lambda t: t.problem(0, "test"), id="unknown-split"),
    pytest.param(lambda t: t.problem(-1), id="negative-index"),
    pytest.param(lambda t: t.batch(-1, 4), id="negative-step"),
    pytest.param(lambda t: t.batch(0, 0), id="empty-batch"),
])
def test_bad_positions_raise_task_error(bad):
    with pytest.raises(TaskError):
        bad(make_task({"family": "arithmetic"}))


# --- verifiers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("answer_format", ["answer", "boxed"])
@pytest.mark.parametrize("level", [1, 2, 4])
@pytest.mark.parametrize("family", PROCEDURAL)
def test_reference_answers_score_one_in_every_accepted_form(family, level, answer_format):
    task = make_task({"family": family, "level": min(level, TASK_FAMILIES[family].max_level),
                      "answer_format": answer_format})
    for problem in task.batch(0, 10) + task.batch(0, 3, "eval"):
        assert ("\\boxed{}" in problem.question) == (answer_format == "boxed")
        for response in _accepted(problem):
            assert task.reward(problem, response) == 1.0, response
        assert task.reward(problem, _wrong(problem)) == 0.0


@pytest.mark.parametrize("family", PROCEDURAL)
def test_garbage_scores_zero_without_raising(family):
    task = make_task({"family": family, "level": 2})
    problem = task.problem(0)
    for response in GARBAGE:
        start = time.perf_counter()
        assert task.reward(problem, response) == 0.0, response[:50]
        task.extract(problem, response)
        assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("response, number", [
    ("Answer: 57", 57), ("Answer: 1,234.", 1234), ("23 + 34 = 57", 57), ("so x = -7", -7),
    ("Answer: x = −7", -7), ("Answer: 23 + 34 = 57 (checked)", 57), ("\\boxed{57}", 57),
    ("12-15", 15), ("Answer: 57\nbecause 23 and 34", 57), ("Answer: 0.5", Fraction(1, 2)),
    ("**Answer:** \\boxed{-3}", -3), ("no digits", None), ("9" * 200, None),
])
def test_final_number_reads_the_final_answer(response, number):
    assert final_number(response) == number


@pytest.mark.parametrize("family", NUMERIC)
def test_extract_returns_the_number_read(family):
    task = make_task({"family": family})
    problem = task.problem(0)
    assert task.extract(problem, f"Answer: {problem.answer}") == problem.answer
    assert task.extract(problem, "nothing") is None


COUNTDOWN = Problem("countdown-L2:train:0:0", "q", "3 * 8", {"numbers": [3, 8, 2, 2, 6, 4], "target": 24})


@pytest.mark.parametrize("response, reward", [
    ("Answer: 3 * 8", 1.0), ("Answer: (3)*(8)", 1.0), ("Answer: -3 * -8", 1.0), ("\\boxed{3 \\times 8}", 1.0),
    ("Answer: 6 / (2 / 8)", 1.0), ("Answer: 6 * 4", 1.0), ("Answer: 3 × 8 = 24", 1.0),
    ("Answer: 24", 0.0), ("Answer: 3 * 8 * 1", 0.0), ("Answer: 3 * 8 + 2 - 2 + 2 - 2", 0.0),
    ("Answer: 3 * 8 + 6 / (2 - 2)", 0.0), ("Answer: 2**999999", 0.0), ("Answer: 3.0 * 8", 0.0),
    ("Answer: 3 // 1 * 8", 0.0), ("Answer: 0x3 * 8", 0.0), ("Answer: 3 * 8 if 1 else 0", 0.0),
    ("Answer: __import__('os').system('true')", 0.0), ("Answer: (lambda: 24)()", 0.0),
    ("Answer: 99999999999999999999 - 99999999999999999975", 0.0),
    ("Answer: " + "(" * 150 + "3 * 8" + ")" * 150, 0.0), ("Answer: [3] * 8", 0.0), ("Answer: True * 24", 0.0),
])
def test_countdown_verifier_is_exact_and_safe(response, reward):
    task = make_task({"family": "countdown", "level": 2})
    assert task.reward(COUNTDOWN, response) == reward
    if reward:
        assert task.extract(COUNTDOWN, response) is not None


def test_a_broken_problem_or_response_type_raises_task_error_naming_the_prompt():
    task = make_task({"family": "arithmetic"})
    broken = Problem("arithmetic-L1:train:0:0", "q", "not a number", {})
    with pytest.raises(TaskError, match="arithmetic-L1:train:0:0"):
        task.reward(broken, "Answer: 3")
    with pytest.raises(TaskError, match="not a str"):
        task.reward(task.problem(0), None)
    with pytest.raises(TaskError, match="countdown-L2:train:0:0"):
        make_task({"family": "countdown", "level": 2}).reward(
            Problem("countdown-L2:train:0:0", "q", "1 + 2", {}), "Answer: 1 + 2")


# --- JSONL datasets -----------------------------------------------------------------------------
def _write(path: pathlib.Path, rows: list) -> pathlib.Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _by_line(task) -> dict[int, Problem]:
    return {p.meta["line"]: p for split in get_args(Split) if task.size(split)
            for p in task.batch(0, task.size(split), split)}


@pytest.fixture
def gsm8k(tmp_path) -> pathlib.Path:
    rows = [{"question": f"Tom has {i} apples and buys {i + 1} more. How many apples?",
             "answer": f"He has {i} + {i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1} apples.\n#### {2 * i + 1}"}
            for i in range(30)]
    rows[0]["answer"] = "Big numbers.\n#### 1,000"
    return _write(tmp_path / "gsm8k_tiny.jsonl", rows)


def test_jsonl_gsm8k_loads_splits_and_orders_deterministically(gsm8k):
    task = make_task({"family": "jsonl", "path": str(gsm8k), "seed": 1})
    assert task.name == "gsm8k_tiny"
    assert task.size("train") + task.size("eval") == 30 and task.size("eval") > 0
    train, held_out = task.batch(0, task.size("train")), task.batch(0, task.size("eval"), "eval")
    assert {p.meta["line"] for p in train}.isdisjoint(p.meta["line"] for p in held_out)
    assert all(split_of(p.question.removesuffix(task.pose(""))) == "eval" for p in held_out)
    assert train[0].prompt_id == "gsm8k_tiny:train:1:0"
    wrapped = task.problem(task.size("train") + 2)
    assert (wrapped.question, wrapped.answer) == (train[2].question, train[2].answer)
    again = make_task({"family": "jsonl", "path": str(gsm8k), "seed": 1})
    assert _dump(again.batch(0, 10)) == _dump(task.batch(0, 10))
    assert _dump(make_task({"family": "jsonl", "path": str(gsm8k), "seed": 2}).batch(0, 10)) != _dump(train[:10])


def test_jsonl_gsm8k_answers_are_checked_by_value(gsm8k):
    task = make_task({"family": "jsonl", "path": str(gsm8k)})
    rows = _by_line(task)
    assert rows[1].answer == "1,000" and rows[2].answer == "3"
    for response in ["Answer: 1000", "Answer: 1,000 apples.", "so the total is \\boxed{1000}",
                     "The final answer is 1000", "He has 999 + 1 = 1000"]:
        assert task.reward(rows[1], response) == 1.0, response
    for response in ["Answer: 1001", "Answer: 3", "I don't know", *GARBAGE]:
        start = time.perf_counter()
        assert task.reward(rows[1], response) == 0.0, response[:50]
        assert time.perf_counter() - start < 2.0, response[:50]
    assert task.reward(rows[2], "He has 1 + 2 = 3 apples. Answer: $3$") == 1.0
    assert task.extract(rows[2], "Answer: 3") == "3"


def test_jsonl_math_answers_are_equivalent_under_math_verify(tmp_path):
    path = _write(tmp_path / "math_tiny.jsonl", [
        {"problem": "What is 1/2 as a fraction?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Simplify sqrt(8)/4.", "solution": "We get \\boxed{\\dfrac{\\sqrt{2}}{2}}."},
        {"problem": "Which day follows Sunday?", "solution": "\\boxed{\\text{Monday}}"},
        {"problem": "Solve x + 1 = 4.", "answer": 3},
        {"problem": "What is 2 to the 10th?", "answer": "1024"},
        {"problem": "Simplify sqrt(18).", "solution": "\\boxed{3\\sqrt{2}}"},
    ])
    task = make_task({"family": "jsonl", "path": str(path), "answer_format": "boxed"})
    rows = _by_line(task)
    assert rows[1].answer == "\\frac{1}{2}" and "\\boxed{}" in rows[1].question
    for response in ["Answer: 0.5", "\\boxed{\\frac12}", "The answer is $\\frac{2}{4}$.", "Answer: 1/2"]:
        assert task.reward(rows[1], response) == 1.0, response
    assert task.reward(rows[1], "Answer: 0.51") == 0.0
    assert task.reward(rows[2], "\\boxed{\\frac{1}{\\sqrt{2}}}") == 1.0
    assert task.reward(rows[2], "\\boxed{\\sqrt{2}}") == 0.0
    assert task.reward(rows[3], "\\boxed{\\text{Monday}}") == 1.0
    assert task.reward(rows[4], "x = 3") == 1.0
    assert task.reward(rows[4], "Answer: 3\\sqrt{2}") == 0.0        # LaTeX in an answer line is read whole
    assert task.reward(rows[5], "Answer: 2^{10}") == 1.0
    assert task.reward(rows[6], "Answer: 3\\sqrt{2}") == 1.0


def test_jsonl_verifies_off_the_main_thread(gsm8k):
    task = make_task({"family": "jsonl", "path": str(gsm8k)})
    problem = _by_line(task)[2]
    results = {}

    def run():
        results["right"] = task.reward(problem, "Answer: 3")
        start = time.perf_counter()
        results["tower"] = [task.reward(problem, response) for response in
                            ["Answer: $9^{9^{9^{9}}}$", "so it is $9^{9^{9^{9}}}$", "Answer: (10^{100})!"]]
        results["tower_s"] = time.perf_counter() - start
    worker = threading.Thread(target=run)
    worker.start()
    worker.join(30)
    assert results["right"] == 1.0 and results["tower"] == [0.0] * 3 and results["tower_s"] < 1.0


@pytest.mark.parametrize("lines, message", [
    pytest.param([], "has no rows", id="empty"),
    pytest.param(["", "   "], "has no rows", id="blank-lines"),
    pytest.param([{"question": "q", "answer": "1"}, "{not json"], r"bad\.jsonl:2: invalid JSON", id="invalid-json"),
    pytest.param([[1, 2]], "expected a JSON object", id="not-an-object"),
    pytest.param([{"answer": "1"}], "no question", id="no-question"),
    pytest.param([{"question": "  ", "answer": "1"}], "no question", id="empty-question"),
    pytest.param([{"question": "q"}], "no reference answer", id="no-answer"),
    pytest.param([{"question": "q", "solution": "no box"}], r"\\boxed", id="solution-without-boxed"),
    pytest.param([{"question": "q", "answer": "#### "}], "reference answer is empty", id="empty-answer"),
    pytest.param([{"question": "q", "answer": [1]}], "must be a string or a number", id="answer-not-scalar"),
])
def test_bad_jsonl_files_raise_task_error_naming_the_problem(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in lines))
    with pytest.raises(TaskError, match=message):
        make_task({"family": "jsonl", "path": str(path)})


@pytest.mark.parametrize("name, message", [("missing.jsonl", "does not exist"), (".", "cannot be read")])
def test_missing_or_unreadable_jsonl_files_raise_task_error(tmp_path, name, message):
    with pytest.raises(TaskError, match=message):
        make_task({"family": "jsonl", "path": str(tmp_path / name)})


def test_jsonl_with_an_empty_split_says_so(tmp_path):
    path = _write(tmp_path / "one.jsonl", [{"question": "What is 1 + 1?", "answer": "2"}])
    task = make_task({"family": "jsonl", "path": str(path)})
    empty = "eval" if task.size("train") else "train"
    with pytest.raises(TaskError, match=f"no {empty} rows"):
        task.problem(0, empty)


def test_find_maps_a_training_prompt_id_to_the_problem_and_nothing_else():
    task = make_task({"family": "linear", "level": 1, "seed": 3})
    problem = task.problem(17)
    assert task.find(problem.prompt_id) == problem
    other_seed = make_task({"family": "linear", "level": 1, "seed": 4}).problem(17).prompt_id
    held_out = task.problem(17, "eval").prompt_id
    for prompt_id in (other_seed, held_out, problem.prompt_id + "x", problem.prompt_id.rsplit(":", 1)[0] + ":",
                      problem.prompt_id.rsplit(":", 1)[0] + ":-1", problem.prompt_id.rsplit(":", 1)[0] + ":１７",
                      problem.prompt_id.rsplit(":", 1)[0] + ":017",
                      "linear-L1:train:3", ""):
        assert task.find(prompt_id) is None, prompt_id


MIXTURE = {"family": "mixture", "seed": 3, "parts": [{"family": "arithmetic", "level": 2}, {"family": "linear"}]}


def test_a_mixture_interleaves_its_parts_under_its_own_ids_with_their_problems_and_verifiers():
    task = make_task(MIXTURE)
    parts = [make_task({"family": "arithmetic", "level": 2, "seed": 3}), make_task({"family": "linear", "seed": 3})]
    assert task.name == "mixture-arithmetic-L2-linear-L1" and task.size() is None
    for split in get_args(Split):
        for i, problem in enumerate(task.batch(0, 8, split)):
            inner = parts[i % 2].problem(i // 2, split)
            assert problem.prompt_id == f"mixture-arithmetic-L2-linear-L1:{split}:3:{i}"
            assert (problem.question, problem.answer) == (inner.question, inner.answer)
            assert problem.meta == {**inner.meta, "part": parts[i % 2].name}
            assert task.reward(problem, f"Answer: {problem.answer}") == 1.0
            assert task.reward(problem, f"Answer: {int(problem.answer) + 1}") == 0.0
            assert task.extract(problem, f"so x = {problem.answer}.") == problem.answer
            for garbage in GARBAGE:              # the part's verifier, whatever it reads
                assert task.reward(problem, garbage) == parts[i % 2].reward(inner, garbage)
        if split == "train":
            assert task.find(problem.prompt_id) == problem
            assert task.find(inner.prompt_id) is None           # a part's own id is not one of the mixture's
    assert _dump(task.batch(2, 4)) == _dump(make_task(MIXTURE).batch(2, 4))
    with pytest.raises(TaskError, match="names no part"):
        task.reward(Problem("x", "q", "1", {"part": "countdown-L1"}), "Answer: 1")


@pytest.mark.parametrize("spec, message", [
    ({"family": "mixture"}, "needs parts"),
    ({"family": "mixture", "parts": [{"family": "linear"}]}, "needs parts: two or more"),
    ({**MIXTURE, "level": 2}, "no level of its own"),
    ({"family": "mixture", "parts": [{"family": "linear"}, MIXTURE]}, "'mixture' cannot be one"),
    ({"family": "mixture", "parts": [{"family": "linear"}, {"family": "jsonl", "path": "x.jsonl"}]}, "'jsonl' cannot"),
    ({"family": "mixture", "parts": [{"family": "linear", "seed": 4}, {"family": "arithmetic"}]}, "take its seed"),
    ({"family": "linear", "parts": [{"family": "linear"}, {"family": "arithmetic"}]}, "only for family 'mixture'"),
    ({"family": "mixture", "parts": [{"family": "linear"}, {"family": "linear"}]}, "names a task twice"),
    ({"family": "mixture", "parts": [{"family": "linear", "level": 99}, {"family": "arithmetic"}]}, "out of range"),
])
def test_bad_mixtures_are_refused_naming_the_problem(spec, message):
    with pytest.raises(TaskError, match=message):
        make_task(spec)

"""mrl_launcher.experiment: how runs are scheduled (the runs themselves: tests/e2e/test_mutual.py)."""
import pathlib
import threading
import time

import pytest
import yaml

from mrl_launcher import experiment
from mrl_launcher.errors import LauncherError, RunFailed
from mrl_launcher.topology import validate_trainers
from mrl_trainer.sharing import SHARING_MODES


def test_default_parallel_gives_each_trainer_a_core(monkeypatch):
    monkeypatch.setattr(experiment.os, "cpu_count", lambda: 8)
    assert experiment.default_parallel(trainers=2, jobs=15) == 4
    assert experiment.default_parallel(trainers=2, jobs=3) == 3
    monkeypatch.setattr(experiment.os, "cpu_count", lambda: 2)
    assert experiment.default_parallel(trainers=3, jobs=15) == 1


def test_the_first_failure_stops_the_other_runs_and_is_raised(monkeypatch, tmp_path):
    """Three at a time; s0/prp fails at once: the runs going are told to stop, none starts after it."""
    started, lock = [], threading.Lock()

    def run_one(config, path, seed, mode, out, overrides, stop, cpus):
        if stop.is_set():
            raise RunFailed(f"stopped before mode {mode}, seed s{seed}")
        with lock:
            started.append((seed, mode))
        if (seed, mode) == (0, "prp"):
            raise RunFailed("mode prp, seed s0: trainers failed with exit codes {'a': 1}")
        while not stop.wait(0.01):      # a run in progress ends when asked to stop
            pass
        raise RunFailed(f"stopped during mode {mode}, seed s{seed}")

    monkeypatch.setattr(experiment, "_run_one", run_one)
    jobs = [(seed, mode) for seed in (0, 1, 2) for mode in ("none", "prp")]
    start = time.monotonic()
    with pytest.raises(RunFailed, match="mode prp, seed s0: trainers failed"):
        experiment._run_all({}, tmp_path / "t.yaml", jobs, tmp_path, None, threading.Event(), parallel=3)
    assert time.monotonic() - start < 5
    assert set(started) <= {(0, "none"), (0, "prp"), (1, "none")}


def test_results_come_back_by_seed_in_mode_order(monkeypatch, tmp_path):
    def run_one(config, path, seed, mode, out, overrides, stop, cpus):
        time.sleep(0.05 if mode == "none" else 0.0)    # finish out of order
        return [f"{seed}-{mode}-{cpus}.jsonl"]

    monkeypatch.setattr(experiment, "_run_one", run_one)
    monkeypatch.setattr(experiment.os, "cpu_count", lambda: 4)
    jobs = [(seed, mode) for seed in (0, 1) for mode in ("none", "sgt")]
    runs = experiment._run_all({}, tmp_path / "t.yaml", jobs, tmp_path, None, threading.Event(), parallel=2)
    assert runs == {"s0": {"none": ["0-none-2.jsonl"], "sgt": ["0-sgt-2.jsonl"]},
                    "s1": {"none": ["1-none-2.jsonl"], "sgt": ["1-sgt-2.jsonl"]}}
    assert list(runs["s0"]) == ["none", "sgt"]


EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(p for p in EXAMPLES.glob("*.yaml") if "trainers" in yaml.safe_load(p.read_text())),
                         ids=lambda p: p.name)
@pytest.mark.parametrize("mode", SHARING_MODES)
def test_example_topologies_start_valid_trainers_in_every_mode(path, mode):
    """Each shipped topology's trainers (their files, their `set`) validate as a comparison would start them."""
    metrics = validate_trainers(yaml.safe_load(path.read_text()), path.parent, {"sharing.mode": mode, "seed": 0})
    assert len(metrics) >= 1


def test_seeds_that_are_not_integers_are_a_usage_error(capsys):
    from mrl.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["experiment", "compare", "examples/compare.yaml", "--seeds", "0,one"])
    assert exit_.value.code == 2
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_at_step_is_one_step_or_one_per_named_policy(capsys):
    from mrl_launcher.arguments import at_step
    assert at_step("16") == 16
    assert at_step("policy-a=16,policy-b=96") == {"policy-a": 16, "policy-b": 96}
    from mrl.cli import main
    for bad in ("sixteen", "policy-a=16,policy-a=8", "=16", "policy-a=x", "policy-a=16,"):
        with pytest.raises(SystemExit) as exit_:
            main(["experiment", "compare", "examples/compare.yaml", "--at-step", bad])
        assert exit_.value.code == 2
        assert "expected a step (16) or policy=step pairs" in capsys.readouterr().err


def _fake_runs(monkeypatch) -> dict:
    """run_topology writes one metrics file and records what it was given; compare lists the runs' files."""
    started = {}

    def run_topology(run, base, stop, overrides, cpus):
        started[run["run_id"]] = (run["data_dir"], overrides)
        metrics = pathlib.Path(run["data_dir"]) / "policy-a" / "metrics.jsonl"
        metrics.parent.mkdir(parents=True)
        metrics.write_text("{}\n")
        return {"policy-a": {"exit_code": 0, "metrics": metrics}}

    monkeypatch.setattr(experiment, "run_topology", run_topology)
    monkeypatch.setattr(experiment, "compare", lambda runs, baseline, at_step: {
        "baseline": baseline, "at_step": at_step, "arms": {s: dict(a) for s, a in runs.items()}})
    monkeypatch.setattr(experiment, "write_compare_page", lambda result, out: out / "index.html")
    return started


def test_an_arm_may_be_a_variant_of_a_mode(monkeypatch, tmp_path):
    """`sgt:rationalize=8`: its settings go over --set's; its folder and run id are its slug, its name the spec."""
    from mrl_launcher.variants import variant_settings, variant_slug
    assert variant_settings("sgt:rationalize=8:normalize=prompts:guard.max_ratio=4:coupling=async-unguarded") == {
        "sharing.mode": "sgt", "sharing.sgt.rationalize": 8, "sharing.sgt.normalize": "prompts",
        "sharing.guard.max_ratio": 4, "sharing.coupling": "async", "sharing.guard.enabled": False}
    assert variant_slug("sgt:rationalize=8") == "sgt-rationalize-8"
    started = _fake_runs(monkeypatch)
    result = experiment.run_compare(EXAMPLES / "compare-addition.yaml", ["none", "sgt:rationalize=8"], [3],
                                    tmp_path / "out", {"sharing.sgt.rationalize": 2, "steps": 4}, parallel=1)
    assert list(result["arms"]["s3"]) == ["none", "sgt:rationalize=8"]
    data_dir, overrides = started["compare-addition-sgt-rationalize-8-s3"]
    assert data_dir == str(tmp_path / "out" / "s3" / "sgt-rationalize-8")
    assert overrides == {"sharing.sgt.rationalize": 8, "steps": 4, "sharing.mode": "sgt", "seed": 3}
    assert started["compare-addition-none-s3"][1]["sharing.mode"] == "none"


@pytest.mark.parametrize("modes, match", [
    (["none", "sgt:rationalize=-1"], r"(?s)arm 'sgt:rationalize=-1': .*rationalize.*greater than or equal to 0"),    # before any run starts
    (["none", "sgt:lam"], "mode:field=value"),
    (["none", "bogus:lam=1"], "unknown sharing mode 'bogus'"),
    (["sgt"], "must include the baseline 'none'"),
    (["none", "sgt:lam=0.2", "sgt:lam= 0.2"], "name one twice")])
def test_a_bad_arm_is_refused_before_any_run(monkeypatch, tmp_path, modes, match):
    monkeypatch.setattr(experiment, "run_topology", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(LauncherError, match=match):
        experiment.run_compare(EXAMPLES / "compare-addition.yaml", modes, [0], tmp_path / "out", parallel=1)
    assert not (tmp_path / "out").exists()


def test_keep_adds_to_a_comparison_and_reruns_only_what_did_not_finish(monkeypatch, tmp_path):
    started, out, topology = _fake_runs(monkeypatch), tmp_path / "out", EXAMPLES / "compare-addition.yaml"
    first = experiment.run_compare(topology, ["none", "sgt"], [0], out, {"steps": 4}, parallel=1)
    with pytest.raises(LauncherError, match="is not empty.*--keep"):
        experiment.run_compare(topology, ["none", "sgt"], [0, 1], out, {"steps": 4}, parallel=1)
    (out / "s0" / "sgt" / experiment.FINISHED).unlink()           # as if s0/sgt had been stopped
    started.clear()
    second = experiment.run_compare(topology, ["none", "sgt", "sgt:rationalize=8"], [0, 1], out, {"steps": 4},
                                    parallel=1, keep=True)
    assert sorted(started) == ["compare-addition-none-s1", "compare-addition-sgt-rationalize-8-s0",
                               "compare-addition-sgt-rationalize-8-s1", "compare-addition-sgt-s0",
                               "compare-addition-sgt-s1"]
    assert second["arms"]["s0"]["none"] == first["arms"]["s0"]["none"]     # kept: the same files
    assert all(pathlib.Path(f).is_file() for arms in second["arms"].values() for files in arms.values() for f in files)
    started.clear()
    with pytest.raises(LauncherError, match="s0/none finished with other settings"):
        experiment.run_compare(topology, ["none"], [0], out, {"steps": 5}, parallel=1, keep=True)
    assert not started


def test_another_arm_may_be_the_baseline(monkeypatch, tmp_path):
    """--baseline xgrpo pairs every arm with xgrpo (async against lockstep, say); solo need not run then, and the
    baseline must be one of the arms."""
    _fake_runs(monkeypatch)
    topology = EXAMPLES / "compare-addition.yaml"
    result = experiment.run_compare(topology, ["xgrpo", "xgrpo:coupling=async"], [0], tmp_path / "out",
                                    {"steps": 4}, parallel=1, baseline="xgrpo", at_step=2)
    assert result["baseline"] == "xgrpo" and list(result["arms"]["s0"]) == ["xgrpo", "xgrpo:coupling=async"]
    assert result["at_step"] == 2
    with pytest.raises(LauncherError, match="must include the baseline 'sgt'"):
        experiment.run_compare(topology, ["none", "xgrpo"], [0], tmp_path / "other", parallel=1, baseline="sgt")


def test_a_long_arm_name_still_gives_each_run_a_valid_distinct_run_id(monkeypatch, tmp_path):
    """run ids are names (at most 64 characters): <run_id>-<arm>-<seed> beyond that keeps its start and a hash of
    the whole, so two long arms differing only at the end still get two run ids."""
    from mrl.experience import validate_name
    started = _fake_runs(monkeypatch)
    arms = ["none", "xgrpo:coupling=async:max_staleness=8", "xgrpo:coupling=async:max_staleness=9"]
    experiment.run_compare(EXAMPLES / "compare-addition-digits-async.yaml", arms, [0], tmp_path / "out", parallel=1)
    assert len(started) == 3 and "compare-addition-digits-async-none-s0" in started
    for run_id in started:
        validate_name("run_id", run_id)

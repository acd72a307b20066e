"""mrl_launcher.report: the run report and the comparison of sharing modes, on hand-written metrics files."""
import json

import pytest

from mrl_launcher.analysis import compare, load_run
from mrl_launcher.errors import LauncherError
from mrl_launcher.figures import CURVES, figure_series, read_reference
from mrl_launcher.report import write_compare_page, write_compare_report, write_report

G = 16  # rollouts per step


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _metrics(path, policy, sharing, evals, extra=lambda step: {}, steps=6, eval_every=2):
    """A trainer's metrics.jsonl: an eval record at step 0 and every `eval_every` steps (accuracies from
    `evals`, in order), a train record per step with `extra(step)` merged in."""
    records = []
    accuracies = iter(evals)
    for step in range(steps + 1):
        if step % eval_every == 0:
            records.append({"step": step, "policy": policy, "kind": "eval", "eval_accuracy": next(accuracies),
                            "rollouts_total": step * G})
        if step < steps:
            records.append({"step": step, "policy": policy, "reward_mean": 0.1 * step, "accuracy": 0.1 * step,
                            "capability": 0.05 * step, "rollouts_total": (step + 1) * G, "loss": 0.01,
                            "sharing": sharing, **extra(step)})
    return _write(path, records)


def _prp_sgt(step):
    """PRP + SGT keys, some steps missing some keys (a peer batch late, say)."""
    out = {"peer_wait_s": 0.2, "peer_samples": 8, "peers_complete": 1.0, "thl_one_to_one": 0.9,
           "thl_lossless": 0.97, "prp_rho_mean": 1.02, "prp_log_rho_var": 0.05, "prp_truncated": 0.1,
           "sgt_rescued": step % 3, "sgt_accepted": 2, "sgt_rejected": 1}
    if step == 3:
        for key in ("thl_one_to_one", "thl_lossless", "prp_rho_mean", "sgt_rejected"):
            del out[key]
        out["peers_complete"] = 0.5
    return out


@pytest.fixture
def run(tmp_path):
    """Two policies under PRP+SGT-ish keys, no HACPO/XGRPO keys; one name needs escaping."""
    a = _metrics(tmp_path / "a" / "metrics.jsonl", "qwen-0.5b", "prp", [0.2, 0.3, 0.4, 0.5], _prp_sgt)
    b = _metrics(tmp_path / "b" / "metrics.jsonl", "llama<3>&co", "prp", [0.1, 0.1, 0.25, 0.3], _prp_sgt)
    return [a, b]


def test_write_report_files_summary_and_escaping(run, tmp_path):
    out = tmp_path / "report"
    index = write_report(run, out, title="run <1>")
    assert index == out / "index.html"
    for name in ("curves.png", "thl.png", "ratios.png", "sgt.png", "exchange.png", "budget.png"):
        assert (out / name).stat().st_size > 1000, name
        assert f'src="{name}"' in index.read_text()
    page = index.read_text()
    assert "qwen-0.5b" in page
    assert "llama&lt;3&gt;&amp;co" in page and "llama<3>" not in page
    assert "run &lt;1&gt;" in page and "<h1>run <1>" not in page
    assert "<script" not in page and "http" not in page and "<link" not in page    # self-contained
    for column in ("SGT rescues (cum.)", "SGT rejections (cum.)", "mean THL 1:1 share", "peer samples used"):
        assert f"<th>{column}</th>" in page
    # qwen's row: prp, 6 steps, 96 rollouts, eval 0.2 -> 0.5, rescues 0+1+2+0+1+2, rejections 5 of 6 steps,
    # mean 1:1 share 0.9 over the 5 steps that have it, 6 * 8 peer samples
    row = "<tr><td>qwen-0.5b</td><td>prp</td><td>6</td><td>96</td><td>0.200</td><td>0.500</td>"
    assert row + "<td>6</td><td>5</td><td>0.900</td><td>48</td></tr>" in page


def test_a_solo_reference_joins_the_accuracy_curves_and_the_summary_labelled_as_a_comparisons(run, tmp_path):
    """A topology's solo_reference: the `none` arm of an earlier comparison's compare.json, dashed beside each
    policy's held-out accuracy (report and live page: one figure_series) and its final in the summary."""
    runs = _runs(tmp_path)
    runs["none"][0] = _metrics(tmp_path / "ref" / "none.jsonl", "qwen-0.5b", "none", [0.2, 0.25, 0.3, 0.35])
    write_compare_report({"s0": runs}, tmp_path / "cmp")
    reference = read_reference(tmp_path / "cmp" / "compare.json")
    assert reference.seeds == 1 and reference.final("qwen-0.5b") == pytest.approx(0.35)
    assert reference.final("llama<3>&co") is None and reference.curves["qwen-0.5b"][0] == [0, 32, 64, 96]
    curves = figure_series(CURVES, list(load_run(run, "test").values()), reference=reference)
    accuracy = dict(curves)[CURVES.panels[0]]
    assert set(accuracy) >= {"qwen-0.5b", "qwen-0.5b (solo, comparison, 1 seeds)"}
    assert dict(curves)[CURVES.panels[1]].keys() == {"qwen-0.5b", "llama<3>&co"}     # reward: runs only
    page = write_report(run, tmp_path / "report", reference=reference).read_text()
    assert "<th>solo reference, final (1 seeds of a comparison)</th>" in page and "<td>0.350</td>" in page
    assert "not a run of this topology" in page and str(tmp_path / "cmp" / "compare.json") in page
    (tmp_path / "bad.json").write_text("{}")
    for path, match in ((tmp_path / "nothing.json", "is not a readable compare.json.*FileNotFoundError"),
                        (tmp_path / "bad.json", "is not a readable compare.json.*KeyError")):
        with pytest.raises(LauncherError, match=match):
            read_reference(path)
    with pytest.raises(LauncherError, match="has no 'hacpo' arm for any policy"):
        read_reference(tmp_path / "cmp" / "compare.json", mode="hacpo")


def test_absent_keys_omit_panels_and_columns(tmp_path):
    plain = [_metrics(tmp_path / "a.jsonl", "p1", "none", [0.2, 0.3, 0.4, 0.4]),
             _metrics(tmp_path / "b.jsonl", "p2", "none", [0.1, 0.2, 0.2], steps=4)]
    out = tmp_path / "report"
    (out).mkdir()
    (out / "sgt.png").write_bytes(b"stale")   # from an earlier report into the same folder
    page = write_report(plain, out).read_text()
    assert {p.name for p in out.iterdir()} == {"index.html", "curves.png", "budget.png"}
    for absent in ("thl.png", "ratios.png", "sgt.png", "exchange.png", "SGT", "THL", "peer samples used"):
        assert absent not in page
    assert "<td>p2</td><td>none</td><td>4</td><td>64</td><td>0.100</td><td>0.200</td></tr>" in page


def test_only_present_keys_get_subplots(tmp_path):
    """HACPO keys on one policy only: ratios.png is drawn, thl/sgt are not."""
    hacpo = lambda step: {"hacpo_ratio_mean": 1.0 + 0.01 * step, "hacpo_clipped": 0.02}  # noqa: E731
    paths = [_metrics(tmp_path / "a.jsonl", "p1", "hacpo", [0.2, 0.3, 0.4, 0.4], hacpo),
             _metrics(tmp_path / "b.jsonl", "p2", "hacpo", [0.2, 0.2, 0.3, 0.5])]
    out = tmp_path / "r"
    page = write_report(paths, out).read_text()
    assert (out / "ratios.png").is_file() and not (out / "thl.png").exists() and not (out / "sgt.png").exists()
    assert 'src="ratios.png"' in page and "THL 1:1" not in page


def _runs(tmp_path):
    d = tmp_path
    return {
        # baseline finals: qwen 0.5 (first reached at step 6: 96 rollouts), llama 0.3 (step 4: 64 rollouts)
        "none": [_metrics(d / "none_a.jsonl", "qwen", "none", [0.2, 0.3, 0.4, 0.5]),
                 _metrics(d / "none_b.jsonl", "llama", "none", [0.1, 0.2, 0.3, 0.3])],
        # prp: qwen reaches 0.5 at step 4 (64), llama reaches 0.3 at step 2 (32)
        "prp": [_metrics(d / "prp_a.jsonl", "qwen", "prp", [0.2, 0.4, 0.5, 0.6]),
                _metrics(d / "prp_b.jsonl", "llama", "prp", [0.1, 0.35, 0.2, 0.4])],
        # sgt: qwen never reaches 0.5; llama runs 8 steps and reaches 0.3 at step 8 (128)
        "sgt": [_metrics(d / "sgt_a.jsonl", "qwen", "sgt", [0.2, 0.3, 0.45, 0.45]),
                _metrics(d / "sgt_b.jsonl", "llama", "sgt", [0.1, 0.1, 0.2, 0.25, 0.3], steps=8)],
    }


def test_compare_numbers(tmp_path):
    result = compare({"s0": _runs(tmp_path)})
    assert (result["baseline"], result["seeds"]) == ("none", ["s0"])
    assert result["interval"] == {"qwen": "seeds", "llama": "seeds"}     # no per-problem outcomes recorded
    qwen, llama = result["policies"]["qwen"], result["policies"]["llama"]
    assert set(qwen) == set(llama) == {"none", "prp", "sgt"}
    assert (qwen["none"]["final_accuracy"], qwen["none"]["rollouts_total"],
            qwen["none"]["rollouts_to_baseline"], qwen["none"]["ratio_to_baseline"]) == (0.5, 96, 96, 1.0)
    assert qwen["none"]["final_ci"] == [0.5, 0.5] and "delta_baseline" not in qwen["none"]  # one seed, one value
    assert qwen["none"]["curve"] == {"rollouts": [0, 32, 64, 96], "mean": [0.2, 0.3, 0.4, 0.5],
                                     "lo": [0.2, 0.3, 0.4, 0.5], "hi": [0.2, 0.3, 0.4, 0.5]}
    assert (qwen["prp"]["final_accuracy"], qwen["prp"]["rollouts_to_baseline"]) == (0.6, 64)
    assert qwen["prp"]["delta_baseline"] == pytest.approx(0.1)
    assert qwen["prp"]["ratio_to_baseline"] == pytest.approx(64 / 96)
    assert (qwen["sgt"]["rollouts_to_baseline"], qwen["sgt"]["ratio_to_baseline"]) == (None, None)
    assert qwen["sgt"]["final_accuracy"] == 0.45
    assert (llama["none"]["rollouts_to_baseline"], llama["none"]["target_accuracy"]) == (64, 0.3)
    assert (llama["prp"]["rollouts_to_baseline"], llama["prp"]["ratio_to_baseline"]) == (32, 0.5)
    assert (llama["sgt"]["rollouts_total"], llama["sgt"]["rollouts_to_baseline"]) == (128, 128)
    assert llama["sgt"]["ratio_to_baseline"] == 2.0
    assert json.loads(json.dumps(result)) == result                          # JSON-able as is


def test_compare_other_baseline_and_missing_policy(tmp_path):
    runs = _runs(tmp_path)
    runs["xgrpo"] = [_metrics(tmp_path / "x.jsonl", "phi", "xgrpo", [0.1, 0.2, 0.3, 0.4])]
    result = compare({"s0": runs}, baseline="prp")
    # against prp's finals (qwen 0.6 at 96, llama 0.4 at 96): none never gets there
    assert result["policies"]["qwen"]["none"]["rollouts_to_baseline"] is None
    assert result["policies"]["llama"]["prp"]["rollouts_to_baseline"] == 96
    # phi is in no baseline run: no target, so nothing is "reached"
    assert result["policies"]["phi"] == {"xgrpo": result["policies"]["phi"]["xgrpo"]}
    assert result["policies"]["phi"]["xgrpo"]["target_accuracy"] is None
    assert result["policies"]["phi"]["xgrpo"]["rollouts_to_baseline"] is None


def test_compare_at_a_step_reads_every_run_as_it_stood_there(tmp_path):
    """llama's sgt run went on to step 8, the others stopped at 6: by default its final is step 8's and it is not
    paired with solo; at step 6 it is read at its eval of step 6, with step 6's rollouts, and paired."""
    runs = _runs(tmp_path)
    assert "delta_baseline" not in compare({"s0": runs})["policies"]["llama"]["sgt"]
    result = compare({"s0": runs}, at_step=6)
    sgt = result["policies"]["llama"]["sgt"]
    assert result["at_step"] == 6 and (sgt["final_accuracy"], sgt["steps"], sgt["rollouts_total"]) == (0.25, 6, 96)
    assert sgt["delta_baseline"] == pytest.approx(-0.05) and sgt["curve"]["rollouts"] == [0, 32, 64, 96]
    assert result["policies"]["qwen"]["prp"]["final_accuracy"] == 0.6          # its last eval is step 6's anyway
    assert compare({"s0": runs}, at_step=4)["policies"]["qwen"]["prp"]["final_accuracy"] == 0.5
    with pytest.raises(LauncherError, match=r"evaluated at steps \[0, 2, 4, 6\], not at step 5"):
        compare({"s0": runs}, at_step=5)


def test_compare_at_a_step_of_each_policy_cuts_only_the_policies_named(tmp_path):
    """{policy: step}: llama read at its eval of step 8 (its sgt run's last; the others end at 6, so llama's
    solo and prp runs have no step 8 and the error names it), qwen at step 4; a policy not named keeps its last
    eval, and one in no run is an error."""
    runs = _runs(tmp_path)
    result = compare({"s0": runs}, at_step={"qwen": 4})
    assert result["at_step"] == {"qwen": 4}
    page = write_compare_page(result, tmp_path / "page").read_text()
    assert "its eval of step 4 (qwen) (the other policies at their last)." in page
    assert '"at_step": {\n    "qwen": 4' in (tmp_path / "page" / "compare.json").read_text()
    assert result["policies"]["qwen"]["prp"]["final_accuracy"] == 0.5                # step 4's, not 6's
    assert result["policies"]["llama"]["sgt"]["final_accuracy"] == 0.3               # its last eval, step 8's
    with pytest.raises(LauncherError, match=r"policy 'llama' evaluated at steps \[0, 2, 4, 6\], not at step 8"):
        compare({"s0": runs}, at_step={"llama": 8})
    with pytest.raises(LauncherError, match=r"--at-step names policy 'phi', which is in no run \(policies: llama, "
                                            r"qwen\)"):
        compare({"s0": runs}, at_step={"phi": 4})


def _scored(path, policy, sharing, correct_counts, problems=40, ids=None, every=2, first=0):
    """Eval records with per-problem outcomes: problems 0..c-1 correct at each eval point, at steps first,
    first + every, …"""
    ids = ids or [f"task:eval:0:{i}" for i in range(problems)]
    records = []
    for k, c in enumerate(correct_counts):
        step = first + every * k
        records.append({"step": step, "policy": policy, "kind": "eval", "eval_accuracy": c / problems,
                        "eval_prompt_ids": ids, "eval_correct": [int(i < c) for i in range(problems)],
                        "rollouts_total": step * G})
        records.append({"step": step, "policy": policy, "reward_mean": 0.1, "rollouts_total": (step + 1) * G,
                        "sharing": sharing})
    return _write(path, records)


def test_compare_over_seeds_pairs_modes_by_seed_and_problem(tmp_path):
    """Three seeds; prp solves 4 problems more than solo in every seed: the paired difference is 0.1 with
    an interval above 0, though the seeds' accuracies spread widely (0.2 … 0.6 solo)."""
    seeds = {}
    for s, solo in enumerate([8, 16, 24]):
        d = tmp_path / f"s{s}"
        seeds[f"s{s}"] = {"none": [_scored(d / "none.jsonl", "qwen", "none", [4, solo])],
                          "prp": [_scored(d / "prp.jsonl", "qwen", "prp", [4, solo + 4])]}
    result = compare(seeds)
    assert result["seeds"] == ["s0", "s1", "s2"] and result["interval"] == {"qwen": "seeds × eval problems"}
    none, prp = result["policies"]["qwen"]["none"], result["policies"]["qwen"]["prp"]
    assert none["finals"] == [0.2, 0.4, 0.6] and none["final_accuracy"] == pytest.approx(0.4)
    assert none["eval_problems"] == 40 and none["curve"]["rollouts"] == [0, 32]
    assert prp["final_accuracy"] == pytest.approx(0.5) and prp["delta_baseline"] == pytest.approx(0.1)
    lo, hi = prp["delta_baseline_ci"]
    assert 0 < lo < 0.1 < hi                      # paired: a consistent gain shows despite the seed spread
    assert prp["delta_baseline_seeds_ci"] == pytest.approx([0.1, 0.1])     # +4 of 40 in every seed
    assert prp["final_ci"][0] < 0.3 and prp["final_ci"][1] > 0.7 - 0.05   # unpaired, the spread dominates
    assert prp["rollouts_to_baseline"] == 32 and prp["ratio_to_baseline"] == 1.0
    assert none["curve"]["mean"][0] == pytest.approx(0.1) and none["curve"]["lo"][0] < 0.1 < none["curve"]["hi"][0]


def test_compare_gain_is_each_modes_last_eval_against_its_own_start(tmp_path):
    """gain: the last eval minus the first, paired per seed and problem: whether a mode learned at all. Solo goes
    from 4 to 10, 12 and 14 of 40 in seeds 0, 1, 2 (gains 0.15, 0.2, 0.25: both intervals above 0); prp from 4 to 4,
    4 and 6 (0, 0, +0.05: the t-interval over seeds reaches below 0)."""
    seeds = {}
    for s, (solo, prp) in enumerate([(10, 4), (12, 4), (14, 6)]):
        d = tmp_path / f"s{s}"
        seeds[f"s{s}"] = {"none": [_scored(d / "none.jsonl", "qwen", "none", [4, solo])],
                          "prp": [_scored(d / "prp.jsonl", "qwen", "prp", [4, prp])]}
    result = compare(seeds)["policies"]["qwen"]
    none, prp = result["none"], result["prp"]
    assert none["gain"] == pytest.approx(0.2) and prp["gain"] == pytest.approx(0.05 / 3)
    assert 0 < none["gain_ci"][0] < 0.2 < none["gain_ci"][1] and none["gain_seeds_ci"][0] > 0
    assert prp["gain_seeds_ci"][0] < 0 < prp["gain_seeds_ci"][1]
    one = compare({"s0": {"none": [_scored(tmp_path / "one.jsonl", "qwen", "none", [4])]}})["policies"]["qwen"]
    assert one["none"]["gain"] == 0.0                      # a single eval: no change from the start


def test_compare_late_endpoint_averages_the_second_half_of_the_evals(tmp_path):
    """The pre-registered late endpoint: per seed and problem, the mean over the evals at steps ≥ half the last
    eval's step; its paired difference to the baseline averages out a last eval's swing. Solo swings from 16 to 8
    of 40 at its last two evals, prp holds 14: the final difference is +0.15, the late one +0.05."""
    seeds = {}
    for s in range(3):
        d = tmp_path / f"s{s}"
        seeds[f"s{s}"] = {"none": [_scored(d / "none.jsonl", "qwen", "none", [4, 6 + s, 16, 8])],
                          "prp": [_scored(d / "prp.jsonl", "qwen", "prp", [4, 30, 14, 14])]}
    result = compare(seeds)
    none, prp = result["policies"]["qwen"]["none"], result["policies"]["qwen"]["prp"]
    assert none["late_steps"] == prp["late_steps"] == [4, 6]            # steps 0, 2, 4, 6: the half from 3 on
    assert none["late_accuracy"] == pytest.approx(12 / 40) and prp["late_accuracy"] == pytest.approx(14 / 40)
    assert none["late_finals"] == pytest.approx([0.3, 0.3, 0.3])
    assert prp["delta_baseline"] == pytest.approx(0.15) and prp["delta_baseline_late"] == pytest.approx(0.05)
    lo, hi = prp["delta_baseline_late_ci"]
    assert lo <= 0.05 <= hi and prp["delta_baseline_late_seeds_ci"] == pytest.approx([0.05, 0.05])
    assert prp["late_ci"][0] <= prp["late_accuracy"] <= prp["late_ci"][1]
    assert "delta_baseline_late" not in none
    seeds = {"s0": {"none": [_scored(tmp_path / "a.jsonl", "qwen", "none", [4, 8, 8])],       # steps 0, 2, 4
                    "prp": [_scored(tmp_path / "b.jsonl", "qwen", "prp", [4, 8, 8, 8])]}}    # steps 0 … 6
    result = compare(seeds)["policies"]["qwen"]
    assert result["none"]["late_steps"] == [2, 4] and result["prp"]["late_steps"] == [4, 6]    # half: included
    assert "delta_baseline_late" not in result["prp"]                                          # not paired
    seeds = {"s0": {"none": [_scored(tmp_path / "c.jsonl", "qwen", "none", [4, 8, 8, 8])],    # steps 0, 2, 4, 6
                    "prp": [_scored(tmp_path / "d.jsonl", "qwen", "prp", [4, 8, 8], every=3)]}}  # 0, 3, 6
    prp = compare(seeds)["policies"]["qwen"]["prp"]
    assert prp["late_steps"] == [3, 6] and "delta_baseline" in prp and "delta_baseline_late" not in prp
    late = compare({"s0": {"none": [_scored(tmp_path / "e.jsonl", "qwen", "none", [4, 8, 12, 16], every=10,
                                            first=10)]}})["policies"]["qwen"]["none"]
    assert late["late_steps"] == [20, 30, 40] and late["late_accuracy"] == pytest.approx(0.3)   # by step, not count


def test_compare_refuses_unpaired_runs(tmp_path):
    other = [f"task:eval:1:{i}" for i in range(40)]
    seeds = {"s0": {"none": [_scored(tmp_path / "a.jsonl", "qwen", "none", [4, 8])],
                    "prp": [_scored(tmp_path / "b.jsonl", "qwen", "prp", [4, 8], ids=other)]}}
    with pytest.raises(LauncherError, match="not paired|same eval problems"):
        compare(seeds)
    seeds["s1"] = {"none": seeds["s0"]["none"]}
    with pytest.raises(LauncherError, match="every seed must run the same modes"):
        compare(seeds)
    del seeds["s1"]
    seeds["s0"]["prp"] = [_scored(tmp_path / "c.jsonl", "qwen", "prp", [4, 8])]
    seeds["s1"] = {"none": [_scored(tmp_path / "d.jsonl", "qwen", "none", [4, 8, 8])],
                   "prp": [_scored(tmp_path / "e.jsonl", "qwen", "prp", [4, 8])]}
    with pytest.raises(LauncherError, match="same budget"):        # another seed evaluated at other steps
        compare(seeds)


def test_write_compare_report(tmp_path):
    runs = _runs(tmp_path)
    runs["prp"][0] = _metrics(tmp_path / "prp_c.jsonl", "q<w>en", "prp", [0.2, 0.4, 0.5, 0.6])
    runs["none"][0] = _metrics(tmp_path / "none_c.jsonl", "q<w>en", "none", [0.2, 0.3, 0.4, 0.5])
    runs["sgt"][0] = _metrics(tmp_path / "sgt_c.jsonl", "q<w>en", "sgt", [0.2, 0.3, 0.45, 0.45])
    out = tmp_path / "cmp"
    page = write_compare_report({"s0": runs}, out).read_text()
    assert json.loads((out / "compare.json").read_text()) == compare({"s0": runs})
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 2 and all(f'src="{name}"' in page for name in pngs)
    assert "q&lt;w&gt;en" in page and "q<w>en" not in page and "llama" in page
    assert "<tr><td>q&lt;w&gt;en</td><td>prp</td><td>6</td><td>96</td><td>0.600 [0.600, 0.600]</td>" \
           "<td>+0.100 [+0.100, +0.100]</td><td>+0.100</td><td>4, 6</td><td>0.550 [0.550, 0.550]</td>" \
           "<td>+0.100 [+0.100, +0.100]</td><td>+0.100</td><td>64</td><td>0.667</td>" \
           "<td>+0.400 [+0.400, +0.400]</td><td>+0.400</td></tr>" in page          # gain: 0.2 → 0.6
    assert "<td>sgt</td><td>6</td><td>96</td><td>0.450 [0.450, 0.450]</td><td>-0.050 [-0.050, -0.050]</td>" \
           "<td>-0.050</td><td>4, 6</td><td>0.450 [0.450, 0.450]</td><td>+0.000 [+0.000, +0.000]</td>" \
           "<td>+0.000</td><td>—</td><td>—</td><td>+0.250 [+0.250, +0.250]</td><td>+0.250</td></tr>" in page
    # late: the evals of steps 4 and 6
    assert "<td>llama</td><td>sgt</td><td>8</td><td>128</td><td>0.300 [0.300, 0.300]</td><td>—</td>" in page


def test_errors(tmp_path):
    good = _metrics(tmp_path / "good.jsonl", "p1", "none", [0.1, 0.2, 0.3], steps=4)
    with pytest.raises(LauncherError, match="does not exist"):
        write_report([tmp_path / "missing.jsonl"], tmp_path / "r")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(LauncherError, match="is empty"):
        write_report([good, empty], tmp_path / "r")
    no_eval = _write(tmp_path / "noeval.jsonl", [{"step": 0, "policy": "p2", "reward_mean": 0.1, "rollouts_total": 8}])
    with pytest.raises(LauncherError, match="no eval records.*eval.every"):
        write_report([no_eval], tmp_path / "r")
    with pytest.raises(LauncherError, match="no eval records"):
        compare({"s0": {"none": [good], "prp": [no_eval]}})
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    with pytest.raises(LauncherError, match="not a trainer metrics file"):
        write_report([garbage], tmp_path / "r")
    with pytest.raises(LauncherError, match="policy 'p1' is in both"):
        write_report([good, good], tmp_path / "r")
    with pytest.raises(LauncherError, match="baseline mode 'none' is not among the runs"):
        compare({"s0": {"prp": [good]}})
    with pytest.raises(LauncherError, match="baseline mode 'sgt'"):
        write_compare_report({"s0": {"none": [good]}}, tmp_path / "c", baseline="sgt")
    assert not (tmp_path / "c").exists()
    with pytest.raises(LauncherError, match="no metrics files"):
        write_report([], tmp_path / "r")

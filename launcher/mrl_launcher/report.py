"""HTML reports of a multi-policy run, and of the comparison of sharing modes (analysis + figures).

`write_report(metrics, out_dir, flow=…)` writes out_dir/index.html with a summary table (one row per
policy: sharing mode, steps, rollouts consumed, first and final eval accuracy, the statistics the
sharing modes declare for the summary, peer samples used) and one PNG per figure of the run
(figures.run_figures, the figures the live page draws too), each only when some record has its keys:

    curves.png    held-out accuracy and training reward against rollouts consumed
    flow.png      the exchange's snapshots (`flow`, mrl_launcher.live): published, taken per pair, counters
    thl.png       THL residual of retokenized peer responses
    ratios.png    the sharing modes' ratio statistics (PRP's ρ, HACPO's s, ω and bound)
    sgt.png       SGT, cumulative over steps: prompts rescued, successes accepted and rejected
    exchange.png  seconds waited for peers, peer samples used, peers complete, XGRPO's pool size
    coordination.png, guard.png   the async coupling's choices and drops; the no-harm guard's trust
    budget.png    rollouts generated and peer samples used (cumulative), over steps

The statistics of thl, ratios, sgt and exchange, their labels and the summary's columns are what the
registered sharing modes (and the trainer's coordination with peers) declare: mrl_trainer.sharing.

With a solo reference (figures.read_reference: the solo arm of an earlier comparison), curves.png draws each
policy's reference curve dashed beside its own, and the summary gives the reference's final accuracy, labelled
as the comparison's.

`write_compare_report(seeds, out_dir)` writes compare.json (analysis.compare, over seeds) and index.html
with one accuracy-vs-rollouts PNG per policy (per mode the mean curve with its 95% band, the target as a
dashed line, a star where each mode reaches it) and the comparison table (final accuracy and the paired
difference to the baseline, with intervals).
"""
import html
import json
import pathlib
import re

from mrl_launcher.analysis import PolicyRun, compare, load_run
from mrl_launcher.figures import CUMULATIVE, Reference, compare_plot, draw, figure_series, run_figures
from mrl_trainer.sharing import STAT_SOURCES

__all__ = ["write_report", "write_compare_report", "write_compare_page"]

Path = pathlib.Path

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block}
.muted{color:#666;font-size:90%}"""


# --- HTML ---------------------------------------------------------------------------------------
def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure_html(name: str, heading: str, text: str) -> str:
    return (f"<h2>{html.escape(heading)}</h2><p class=\"muted\">{html.escape(text)}</p>"
            f"<img src=\"{html.escape(name, quote=True)}\" alt=\"{html.escape(heading, quote=True)}\">")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def _over_steps(values: list[float], total: bool) -> float:
    return sum(values) if total else sum(values) / len(values)


def _summary_rows(runs: list[PolicyRun], reference: Reference | None) -> tuple[list[str], list[list]]:
    header = ["policy", "sharing", "steps", "rollouts consumed", "first eval accuracy", "final eval accuracy"]
    if reference is not None:
        header.append(f"solo reference, final ({reference.seeds} seeds of a comparison)")
    # the statistics the modes declare for the summary (the total over steps if cumulative, else the mean),
    # then the peer samples used in all (as budget.png); each only when some record has it
    columns = {key: (name, key in CUMULATIVE) for source in STAT_SOURCES for key, name in source.summary.items()}
    columns["peer_samples"] = ("peer samples used", True)
    columns = {key: column for key, column in columns.items() if any(run.has(key) for run in runs)}
    header += [name for name, _ in columns.values()]
    rows = []
    for run in runs:
        row = [run.policy, run.sharing, len(run.train), run.rollouts_total,
               float(run.evals[0]["eval_accuracy"]), float(run.evals[-1]["eval_accuracy"])]
        if reference is not None:
            row.append(reference.final(run.policy))
        row += [_over_steps(run.values(key), total) if run.has(key) else None
                for key, (_, total) in columns.items()]
        rows.append(row)
    return header, rows


def write_report(metrics_paths: list[str | Path], out_dir: str | Path, title: str = "mrl run",
                 flow: list[dict] = (), reference: Reference | None = None) -> Path:
    """index.html and its PNGs in out_dir for one run (one metrics file per policy; `flow`: the exchange's
    snapshots, live.read_flow; `reference`: a comparison's solo arm); returns index.html's path."""
    runs = list(load_run(list(metrics_paths), "report").values())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for figure in run_figures():
        path = out_dir / f"{figure.name}.png"
        series = figure_series(figure, runs, flow, reference)
        if series:
            draw(figure, series, path)
            figures.append(_figure_html(path.name, figure.heading, figure.text))
        elif path.exists():
            path.unlink()  # a stale figure from an earlier report into the same folder
    header, rows = _summary_rows(runs, reference)
    sources = "".join(f"<li>{html.escape(run.policy)}: <code>{html.escape(str(run.path))}</code></li>" for run in runs)
    note = ("" if reference is None else
            f"<p class=\"muted\">Solo reference: each policy alone (solo GRPO), the mean over {reference.seeds} seeds "
            f"of the comparison <code>{html.escape(reference.path)}</code>, not a run of this topology; dashed in "
            "curves.png.</p>")
    body = ("<h2>Summary</h2>" + _table(header, rows) + note
            + f"<p class=\"muted\">metrics files:</p><ul class=\"muted\">{sources}</ul>"
            + "".join(figures))
    index = out_dir / "index.html"
    index.write_text(_page(title, body), encoding="utf-8")
    return index


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] or "policy"


def _interval(mean, ci) -> str:
    if mean is None:
        return "—"
    return f"{mean:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci[0] is not None else f"{mean:+.3f}"


def _accuracy(mean, ci) -> str:
    return f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def write_compare_report(seeds: dict[str, dict[str, list[str | Path]]], out_dir: str | Path,
                         baseline: str = "none") -> Path:
    """index.html (per policy: mean accuracy per mode with 95% bands against rollouts; the table) and
    compare.json (analysis.compare)."""
    return write_compare_page(compare(seeds, baseline), out_dir)


def _read_at(result: dict) -> str:
    """The compare page's sentence on which eval each run is read at (analysis.compare's `at_step`)."""
    at_step = result.get("at_step")
    if at_step is None:
        return ""
    if not isinstance(at_step, dict):
        return f"Every run is read as it stood at its eval of step {at_step}. "
    steps = ", ".join(f"{step} ({policy})" for policy, step in at_step.items())
    others = " (the other policies at their last)" if set(result["policies"]) - set(at_step) else ""
    return html.escape(f"Each run is read as it stood at its eval of step {steps}{others}. ")


def write_compare_page(result: dict, out_dir: str | Path) -> Path:
    """write_compare_report's files from a comparison analysis.compare has made already."""
    baseline = result["baseline"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    header = ["policy", "mode", "steps", "rollouts consumed", "final accuracy [95%]", f"Δ vs {baseline} [95%]",
              "Δ [95% t, seeds only]", "late steps", "late accuracy [95%]", "late Δ [95%]", "late Δ [95% t]",
              "rollouts to baseline", "ratio to baseline", "gain from start [95%]", "gain [95% t]"]
    rows = [[policy, mode, s["steps"], s["rollouts_total"],
             _accuracy(s["final_accuracy"], s["final_ci"]),
             _interval(s.get("delta_baseline"), s.get("delta_baseline_ci")),
             _interval(s.get("delta_baseline"), s.get("delta_baseline_seeds_ci")),
             ", ".join(str(step) for step in s["late_steps"]),
             _accuracy(s["late_accuracy"], s["late_ci"]),
             _interval(s.get("delta_baseline_late"), s.get("delta_baseline_late_ci")),
             _interval(s.get("delta_baseline_late"), s.get("delta_baseline_late_seeds_ci")),
             s["rollouts_to_baseline"], s["ratio_to_baseline"],
             _interval(s.get("gain"), s.get("gain_ci")), _interval(s.get("gain"), s.get("gain_seeds_ci"))]
            for policy, entry in result["policies"].items() for mode, s in entry.items()]
    figures = []
    for i, (policy, entry) in enumerate(result["policies"].items()):
        name = f"compare_{i}_{_safe(policy)}.png"
        compare_plot(policy, entry, out_dir / name)
        figures.append(_figure_html(name, f"{policy}: held-out accuracy by sharing mode",
                                    f"Mean over {len(result['seeds'])} seed(s) and the eval problems; bands: "
                                    f"95% bootstrap over {result['interval'][policy]}. Dashed: the baseline's final "
                                    "accuracy; a star where a mode's mean first reaches it."))
    at = _read_at(result)
    body = (f"<p>{len(result['seeds'])} seed(s): {html.escape(', '.join(result['seeds']))}; baseline mode: "
            f"<b>{html.escape(baseline)}</b>. {at}Δ = the paired difference of final held-out accuracy to the "
            "baseline (same seed, same eval problem), with its 95% bootstrap interval, and the t-interval of the "
            "per-seed differences (wider with few seeds, whose spread resampling understates). late = the mean "
            "over the evals at steps ≥ half the last eval's, per seed and problem (the pre-registered endpoint for "
            "runs whose single evals swing; late steps: those evals), and late Δ its paired difference. "
            "rollouts to baseline = the rollouts at a mode's first eval point whose mean accuracy ≥ the "
            "baseline's final (— if never); "
            "ratio = that over the baseline's own. gain = the last eval's accuracy minus the first's (the start), "
            "paired per seed and problem: whether the mode learned at all. <a href=\"compare.json\">compare.json</a></p>"
            + "<h2>Comparison</h2>" + _table(header, rows) + "".join(figures))
    index = out_dir / "index.html"
    index.write_text(_page(f"mrl sharing modes vs {baseline}", body), encoding="utf-8")
    return index

"""Figures of a run: one set of declarations, drawn as PNGs by the report (matplotlib, here) and live in the
browser by the live page (uPlot, mrl_launcher.live), both from the same series (figure_series).

    Panel, Figure               a figure's declaration: which records' field, against what, summed or smoothed
    run_figures()               the figures of a run, in report order: curves, flow, the panels the sharing modes
                                declare (PANELS: thl, ratios, sgt, exchange, coordination, guard), budget
    figure_series(fig, runs, flow, reference)   per panel that has data, {line label: (xs, ys)}: one line per
                                policy, or for the flow panels one per series of the exchange's snapshots
                                (mrl_launcher.live); with a solo reference, its lines join the held-out accuracy
    read_reference(path)        a comparison's solo arm (compare.json) as each policy's reference curve
    draw(fig, series, out)      one PNG, a subplot per panel
    plot_curves(paths, out)     `mrl trainer plot`: the curves figure of metrics files
    figure_stats(figure)        the statistics a panels figure draws, as the sharing modes declare them
    compare_plot(policy, ...)   one policy's held-out accuracy against rollouts, one line per sharing mode
"""
import dataclasses
import json
import math
import pathlib
from typing import Literal

from mrl_launcher.analysis import PolicyRun, as_run, num, read_policy_records
from mrl_launcher.errors import LauncherError
from mrl_trainer.sharing import STAT_SOURCES, stat_labels

__all__ = ["Panel", "Figure", "PANELS", "CURVES", "BUDGET", "FLOW", "run_figures", "figure_series", "draw",
           "plot_curves", "figure_stats", "stat_title", "compare_plot", "read_reference", "Reference", "LABELS",
           "CUMULATIVE", "X_LABELS", "REFERENCE"]

Path = pathlib.Path

LABELS = stat_labels()                                                       # statistic → label
CUMULATIVE = frozenset().union(*(source.cumulative for source in STAT_SOURCES))   # drawn summed over steps
X_LABELS = {"step": "step", "rollouts_total": "rollouts consumed", "minutes": "minutes since the first snapshot"}


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot: `key` of the `source` records against `x`. train/eval: one line per policy, its records'
    numbers; flow: one line per label of the mapping `key` holds in each exchange snapshot."""
    key: str
    title: str
    source: Literal["train", "eval", "flow"] = "train"
    x: Literal["step", "rollouts_total", "minutes"] = "step"
    cumulative: bool = False     # y_i = Σ_{j ≤ i} value_j
    smooth: int = 1              # y_i = the mean of the last `smooth` values up to i


@dataclasses.dataclass(frozen=True)
class Figure:
    name: str                    # the report's PNG name without .png; the live page's figure id
    heading: str
    text: str
    panels: tuple[Panel, ...]


PANELS = {  # figure → heading; its statistics are the ones the sharing modes declare (figure_stats)
    "thl": "THL residual",
    "ratios": "Ratio statistics",
    "sgt": "SGT rescues and rejections",
    "exchange": "Exchange",
    "coordination": "Asynchronous coordination",
    "guard": "No-harm guard",
}

CURVES = Figure("curves", "Held-out accuracy and training reward",
                "Left: greedy accuracy on the held-out split (eval records) against rollouts consumed. Right: the "
                "training batch's mean reward, 5-step moving average. One line per policy.",
                (Panel("eval_accuracy", "greedy accuracy (held-out)", "eval", "rollouts_total"),
                 Panel("reward_mean", "batch mean reward (5-step avg)", "train", "rollouts_total", smooth=5)))
BUDGET = Figure("budget", "Rollouts spent", "Rollouts each policy generated and the peer samples it used in all, "
                "over steps.", (Panel("rollouts_total", "rollouts generated"),
                                Panel("peer_samples", "peer samples used (cumulative)", cumulative=True)))
FLOW = Figure("flow", "Experience between policies",
              "From the exchange's admin API, sampled while the run runs: the experiences each policy published, "
              "per kind; those each policy took from each peer, per kind; what the exchange dropped as stale and "
              "delivered again.",
              (Panel("published", "published (producer, kind)", "flow", "minutes"),
               Panel("taken", "taken (producer → subscriber, kind)", "flow", "minutes"),
               Panel("counters", "stale drops, redeliveries (exchange)", "flow", "minutes")))


def figure_stats(figure: str) -> tuple[str, ...]:
    """The statistics drawn in a report figure ("thl", "ratios", "sgt", "exchange", "guard"), in registry order: what the
    sharing modes and the trainer's coordination with peers declare in their `figures`."""
    return tuple(dict.fromkeys(key for source in STAT_SOURCES for key in source.figures.get(figure, ())))


def stat_title(key: str) -> str:
    """A statistic's label, marked "(cumulative)" when it is drawn summed over steps."""
    return LABELS.get(key, key) + (" (cumulative)" if key in CUMULATIVE else "")


def run_figures() -> tuple[Figure, ...]:
    """Every figure of a run, in report order; a figure is drawn only where some panel of it has data."""
    declared = tuple(Figure(name, heading, "Over steps, one line per policy.",
                            tuple(Panel(key, stat_title(key), cumulative=key in CUMULATIVE)
                                  for key in figure_stats(name)))
                     for name, heading in PANELS.items())
    return (CURVES, FLOW, *declared, BUDGET)


REFERENCE = "solo, comparison"     # in the label of a reference line (drawn dashed)


@dataclasses.dataclass(frozen=True)
class Reference:
    """Each policy's held-out accuracy under solo GRPO in an earlier comparison: not a run of this topology."""
    path: str
    seeds: int
    curves: dict[str, tuple[list, list]]     # policy → (rollouts consumed, mean accuracy over the seeds)

    def lines(self) -> dict[str, tuple[list, list]]:
        return {f"{policy} ({REFERENCE}, {self.seeds} seeds)": xy for policy, xy in self.curves.items()}

    def final(self, policy: str) -> float | None:
        curve = self.curves.get(policy)
        return curve[1][-1] if curve else None


def read_reference(path: str | Path, mode: str = "none") -> Reference:
    """The `mode` arm (default solo GRPO) of a comparison's compare.json (`mrl experiment compare`): each policy's
    mean held-out accuracy curve against its rollouts. LauncherError, naming the file, if it is not one."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        curves = {policy: (list(entry[mode]["curve"]["rollouts"]), list(entry[mode]["curve"]["mean"]))
                  for policy, entry in result["policies"].items() if mode in entry}
        seeds = len(result["seeds"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LauncherError(f"solo reference {str(path)!r} is not a readable compare.json of `mrl experiment "
                            f"compare` ({type(exc).__name__}: {exc})") from None
    if not curves:
        raise LauncherError(f"solo reference {str(path)!r} has no {mode!r} arm for any policy")
    return Reference(str(path), seeds, curves)


def _shape(values: list[float], panel: Panel) -> list[float]:
    if panel.cumulative:
        values = [sum(values[:i + 1]) for i in range(len(values))]
    k = panel.smooth
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def _run_lines(panel: Panel, runs: list[PolicyRun]) -> dict[str, tuple[list, list]]:
    lines = {}
    for run in runs:
        records = run.evals if panel.source == "eval" else run.train
        points = [(r[panel.x], r[panel.key]) for r in records if num(r.get(panel.key)) and num(r.get(panel.x))]
        if points:
            lines[run.policy] = ([x for x, _ in points], _shape([y for _, y in points], panel))
    return lines


def _flow_lines(panel: Panel, flow: list[dict]) -> dict[str, tuple[list, list]]:
    lines: dict[str, tuple[list, list]] = {}
    for snapshot in flow:
        for label, value in (snapshot.get(panel.key) or {}).items():
            xs, ys = lines.setdefault(label, ([], []))
            xs.append((snapshot["time"] - flow[0]["time"]) / 60)
            ys.append(value)
    return lines


def figure_series(figure: Figure, runs: list[PolicyRun], flow: list[dict] = (),
                  reference: Reference | None = None) -> list[tuple[Panel, dict]]:
    """(panel, {line label: (xs, ys)}) of each panel of `figure` that has data, in declaration order; the
    reference's lines join the held-out accuracy against rollouts."""
    drawn = []
    for panel in figure.panels:
        lines = _flow_lines(panel, list(flow)) if panel.source == "flow" else _run_lines(panel, runs)
        if reference is not None and (panel.key, panel.x) == ("eval_accuracy", "rollouts_total"):
            lines.update(reference.lines())
        if lines:
            drawn.append((panel, lines))
    return drawn


def _label(text: str) -> str:
    """A policy name as a matplotlib label: a `$` would start mathtext."""
    return text.replace("$", r"\$")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw(figure: Figure, series: list[tuple[Panel, dict]], out: Path) -> Path:
    """`figure` as a PNG: one subplot per panel of `series` (figure_series), one line per label."""
    plt = _pyplot()
    ncols = min(3, len(series))
    nrows = math.ceil(len(series) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols + 1, 3.6 * nrows), squeeze=False)
    for ax, (panel, lines) in zip(axes.flat, series):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="." if len(xs) <= 40 else None, label=_label(label),
                    linestyle="--" if REFERENCE in label else "-")
        ax.set(xlabel=X_LABELS[panel.x], title=panel.title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(series):]:
        ax.set_visible(False)
    fig.suptitle(figure.heading)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def compare_plot(policy: str, entry: dict, out: Path) -> Path:
    """One policy: per mode its mean accuracy curve (analysis.compare's `curve`) with the 95% band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    target = None
    for mode, stats in entry.items():
        curve = stats["curve"]
        line, = ax.plot(curve["rollouts"], curve["mean"], marker="o", markersize=3, label=_label(mode))
        ax.fill_between(curve["rollouts"], curve["lo"], curve["hi"], color=line.get_color(), alpha=0.15)
        target = stats["target_accuracy"]
        if stats["rollouts_to_baseline"] is not None:
            ax.plot([stats["rollouts_to_baseline"]], [target], marker="*", markersize=13, color=line.get_color())
    if target is not None:
        ax.axhline(target, linestyle="--", color="grey", linewidth=1, label="baseline final accuracy")
    ax.set(xlabel="rollouts consumed", ylabel="greedy accuracy (held-out)", title=_label(policy))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_curves(paths: list[str], out: str) -> pathlib.Path:
    """The curves figure (CURVES) of these metrics files, one line per file (policy)."""
    runs = [as_run(path, read_policy_records(path)) for path in paths]
    return draw(CURVES, figure_series(CURVES, runs), Path(out))

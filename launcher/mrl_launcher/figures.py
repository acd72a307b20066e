"""Figures (PNG) of trainers' runs, drawn with matplotlib from analysis.PolicyRun records.

    plot_curves(paths, out)     `mrl trainer plot`: held-out greedy accuracy (eval records) and the
                                training batch's mean reward (5-step moving average) against rollouts
                                consumed, one line per metrics file (policy)
    panels(runs, keys, out)     one subplot per metric some record has, over steps, one line per policy
    figure_stats(figure)        the statistics a report figure draws, as the sharing modes declare them
    budget(runs, out)           rollouts generated and peer samples used, per policy
    compare_plot(policy, ...)   one policy's held-out accuracy against rollouts, one line per sharing mode
"""
import math
import pathlib

from mrl_launcher.analysis import PolicyRun, num, read_policy_records
from mrl_trainer.sharing import STAT_SOURCES, stat_labels

__all__ = ["plot_curves", "panels", "figure_stats", "stat_title", "budget", "compare_plot", "LABELS", "CUMULATIVE"]

Path = pathlib.Path

LABELS = stat_labels()                                                       # statistic → label
CUMULATIVE = frozenset().union(*(source.cumulative for source in STAT_SOURCES))   # drawn summed over steps


def figure_stats(figure: str) -> tuple[str, ...]:
    """The statistics drawn in a report figure ("thl", "ratios", "sgt", "exchange", "guard"), in registry order: what the
    sharing modes and the trainer's coordination with peers declare in their `figures`."""
    return tuple(dict.fromkeys(key for source in STAT_SOURCES for key in source.figures.get(figure, ())))


def stat_title(key: str) -> str:
    """A statistic's label, marked "(cumulative)" when it is drawn summed over steps."""
    return LABELS.get(key, key) + (" (cumulative)" if key in CUMULATIVE else "")


def _label(text: str) -> str:
    """A policy name as a matplotlib label: a `$` would start mathtext."""
    return text.replace("$", r"\$")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def panels(runs: list[PolicyRun], keys: tuple[str, ...], out: Path, title: str) -> Path | None:
    """One subplot per key some record has (value over steps, one line per policy; a cumulative statistic
    summed over steps); None if none has."""
    present = [k for k in keys if any(run.has(k) for run in runs)]
    if not present:
        return None
    plt = _pyplot()
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        for run in runs:
            points = [(r["step"], r[key]) for r in run.train if num(r.get(key))]
            if not points:
                continue
            steps = [s for s, _ in points]
            values = [v for _, v in points]
            if key in CUMULATIVE:
                values = [sum(values[:i + 1]) for i in range(len(values))]
            ax.plot(steps, values, marker="." if len(points) <= 40 else None, label=_label(run.policy))
        ax.set(xlabel="step", title=stat_title(key))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def budget(runs: list[PolicyRun], out: Path) -> Path:
    plt = _pyplot()
    peers = any(run.has("peer_samples") for run in runs)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(runs) + 2), 3.6))
    xs = list(range(len(runs)))
    width = 0.4 if peers else 0.6
    own = [run.rollouts_total or 0 for run in runs]
    ax.bar([x - width / 2 if peers else x for x in xs], own, width, label="rollouts generated")
    if peers:
        ax.bar([x + width / 2 for x in xs], [sum(run.values("peer_samples")) for run in runs], width,
               label="peer samples used")
    ax.set_xticks(xs, [_label(run.policy) for run in runs])
    ax.set(ylabel="samples", title="rollouts spent per policy")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
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


def _moving_average(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def plot_curves(paths: list[str], out: str, title: str = "held-out accuracy") -> pathlib.Path:
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for path in paths:
        records = read_policy_records(path)
        evals = [r for r in records if r.get("kind") == "eval"]
        train = [r for r in records if r.get("kind", "train") == "train"]
        label = records[0]["policy"]
        left.plot([r["rollouts_total"] for r in evals], [r["eval_accuracy"] for r in evals], marker="o", label=label)
        right.plot([r["rollouts_total"] for r in train], _moving_average([r["reward_mean"] for r in train]),
                   label=label)
    left.set(xlabel="rollouts consumed", ylabel="greedy accuracy (held-out)", title=title)
    right.set(xlabel="rollouts consumed", ylabel="batch mean reward (5-step avg)", title="training reward")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out_path = pathlib.Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path

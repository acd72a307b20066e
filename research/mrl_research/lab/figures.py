"""The bandit's page: the trade-off figure, success curves with 95% bands, and a table (matplotlib, Agg).

    tradeoff.png   per sweep point: x = gradient variance tr Cov[ĝ] (log), y = Δ success over solo, one
                   marker per mode with its 95% intervals (both axes)
    tradeoff_rel.png  the same against the relative variance tr Cov[ĝ] / ‖E ĝ‖² (scale-free)
    curves.png     per sweep point: team greedy success against own rollouts per policy, mean and 95% band
    report.md      the command, the per-point tables and the two figures
"""
import json
import math
import pathlib

__all__ = ["COLORS", "point_title", "write_page", "table"]

COLORS = {"none": "#444444", "prp": "#d62728", "xgrpo": "#1f77b4", "sgt": "#2ca02c", "hacpo": "#9467bd"}


def point_title(point: dict) -> str:
    return (f"gap {point['gap']:g}, overlap {point['overlap']:g}, staleness {point['staleness']}, "
            f"{point['tokenizers']}, G {point['group_size']}, interference {point.get('interference', 0):g}, "
            f"speed {point.get('speed', 1)}")


def _grid(n: int):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return plt, fig, list(axes.flat[:n])


def _err(mean, ci):
    if mean is None or ci is None or ci[0] is None:
        return None
    return [[max(mean - ci[0], 0.0)], [max(ci[1] - mean, 0.0)]]


def tradeoff(points: list[dict], path: pathlib.Path, key: str = "grad_var") -> None:
    """x = `key` ("grad_var": tr Cov[ĝ]; "grad_rel_var": tr Cov[ĝ] / ‖E ĝ‖²), y = Δ success vs solo."""
    plt, fig, axes = _grid(len(points))
    for ax, p in zip(axes, points):
        for mode, e in p["modes"].items():
            if e.get(key) is None or e.get("delta_solo") is None:
                continue
            ax.errorbar(e[key], e["delta_solo"], xerr=_err(e[key], e.get(f"{key}_ci")),
                        yerr=_err(e["delta_solo"], e.get("delta_solo_ci")), fmt="o", color=COLORS.get(mode),
                        capsize=3, label=mode)
            ax.annotate(mode, (e[key], e["delta_solo"]), textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.axhline(0.0, color="#999999", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("gradient variance tr Cov[ĝ]" if key == "grad_var" else
                      "relative gradient variance tr Cov[ĝ] / ‖E ĝ‖²")
        ax.set_ylabel("Δ final success vs solo")
        ax.set_title(point_title(p["point"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves(points: list[dict], path: pathlib.Path) -> None:
    plt, fig, axes = _grid(len(points))
    for ax, p in zip(axes, points):
        for mode, e in p["modes"].items():
            c = e["curve"]
            ax.plot(c["rollouts"], c["mean"], color=COLORS.get(mode), label=mode, lw=1.5)
            if c["lo"][0] is not None:
                ax.fill_between(c["rollouts"], c["lo"], c["hi"], color=COLORS.get(mode), alpha=0.15, lw=0)
        ax.set_xlabel("own rollouts per policy")
        ax.set_ylabel("greedy success (mean of the 2 policies)")
        ax.set_title(point_title(p["point"]), fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _num(x, fmt="{:.3f}"):
    return "–" if x is None else fmt.format(x)


def table(p: dict) -> str:
    """One point's per-mode table (markdown)."""
    lines = ["| mode | final success [95% CI] | Δ vs solo [95% CI] | rollouts to solo | grad var tr Cov[ĝ] "
             "| rel. var | PRP var log ρ | SGT rescues | XGRPO |Δbaseline| | HACPO ω | HACPO clipped | THL 1:1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, e in p["modes"].items():
        s = e["stats"]
        ci = e["final_ci"]
        d = e.get("delta_solo")
        dci = e.get("delta_solo_ci") or [None, None]
        lines.append(
            f"| {mode} | {_num(e['final_mean'])} [{_num(ci[0])}, {_num(ci[1])}] "
            f"| {_num(d, '{:+.3f}')} [{_num(dci[0], '{:+.3f}')}, {_num(dci[1], '{:+.3f}')}] "
            f"| {_num(e.get('rollouts_to_solo'), '{:d}')} | {_num(e.get('grad_var'), '{:.2e}')} "
            f"| {_num(e.get('grad_rel_var'), '{:.2f}')} | {_num(s.get('prp_log_rho_var'), '{:.2f}')} "
            f"| {_num(s.get('sgt_rescued'), '{:.1f}')} | {_num(s.get('xgrpo_baseline_shift_abs'))} "
            f"| {_num(s.get('hacpo_omega_mean'), '{:.2f}')} | {_num(s.get('hacpo_clipped'), '{:.2f}')} "
            f"| {_num(s.get('thl_one_to_one'), '{:.2f}')} |")
    return "\n".join(lines)


def write_page(result: dict, out: str | pathlib.Path, command: str) -> pathlib.Path:
    """bandit.json, tradeoff.png, tradeoff_rel.png, curves.png and report.md under `out`; the report's path."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bandit.json").write_text(json.dumps(result))
    tradeoff(result["points"], out / "tradeoff.png")
    tradeoff(result["points"], out / "tradeoff_rel.png", "grad_rel_var")
    curves(result["points"], out / "curves.png")
    parts = [f"# Contextual bandit: sharing modes\n\n```bash\n{command}\n```\n",
             f"{result.get('seeds')} seeds, {result.get('seconds', 0):.0f} s. Success: greedy, on the training "
             "contexts, mean of the two policies; x-axis: own rollouts per policy.\n",
             "![trade-off](tradeoff.png)\n", "![trade-off, relative variance](tradeoff_rel.png)\n",
             "![success curves](curves.png)\n"]
    for p in result["points"]:
        tuned = (f"\n\nlr {p['lr']:g}, solo's best on seeds {p['lr_tuning']['seeds'][0]}–{p['lr_tuning']['seeds'][1]} "
                 "(solo's final success by rate: "
                 + ", ".join(f"{lr} → {v:.3f}" for lr, v in p["lr_tuning"]["solo_final"].items()) + ")"
                 if "lr" in p else "")
        parts.append(f"## {point_title(p['point'])}{tuned}\n\n{table(p)}\n")
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path

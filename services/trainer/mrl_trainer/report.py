"""HTML reports of a multi-policy run, and the comparison of sharing modes, from trainers' metrics.jsonl.

`write_report(paths, out_dir)` reads one metrics file per policy (`metrics.read_metrics`) and
writes `out_dir/index.html` with these PNGs beside it (matplotlib, Agg):

    curves.png    held-out greedy accuracy against rollouts consumed (the eval records), and the
                  training batch's mean reward (5-step moving average); one line per policy.
                  Drawn by `plot.plot_curves`, the figure of `mrl trainer plot`.
    thl.png       the THL residual over steps: the mean share of 1:1 chunks of the retokenized
                  peer responses (`thl_one_to_one`), the share aligned losslessly (`thl_lossless`)
                  and tokens per chunk (`thl_tokens_per_chunk`); one line per policy.
    ratios.png    importance-ratio statistics over steps: PRP's mean rho, variance of log rho and
                  the fraction truncated at c (`prp_rho_mean`, `prp_log_rho_var`, `prp_truncated`);
                  HACPO's mean ratio, fraction clipped, mean omega and lower bound
                  (`hacpo_ratio_mean`, `hacpo_clipped`, `hacpo_omega_mean`, `hacpo_lower_bound`).
    sgt.png       SGT, cumulative over steps: prompts rescued (`sgt_rescued`), peer successes
                  accepted (`sgt_accepted`) and rejected by this policy's re-verification
                  (`sgt_rejected`).
    exchange.png  the exchange per step: seconds waited for peers (`peer_wait_s`), peer samples
                  used (`peer_samples`), the fraction of peers whose step batch arrived in time
                  (`peers_complete`) and rewards in XGRPO's pooled baseline (`xgrpo_pooled`).
    budget.png    rollouts spent per policy (the final `rollouts_total`) and, beside it, the
                  peer samples it used in all (the sum of `peer_samples`).

Every figure but curves.png and budget.png draws one subplot per key; a key absent from every
record (or null everywhere) leaves its subplot out, and a figure with no key present is not
written. The summary table (one row per policy: sharing mode, steps, rollouts consumed, first
and final eval accuracy, cumulative SGT rescues and rejections, mean THL 1:1 share, peer samples)
likewise leaves out a column whose key no record has.

`compare(runs, baseline="none")` compares sharing modes: `runs` maps a mode to its run's metrics
files (one per policy; the policy is named in the records). For each policy and mode it gives
the final eval accuracy, the rollouts consumed at the end and

    rollouts_to_baseline  the rollouts_total of the mode's first eval record (in step order)
                          whose eval_accuracy >= the baseline mode's final eval accuracy for that
                          policy (within 1e-9); None if no eval record of the mode reaches it.
    ratio_to_baseline     rollouts_to_baseline / the baseline's own rollouts_to_baseline (the
                          rollouts at which the baseline first reached its own final accuracy);
                          below 1 means the mode needed fewer rollouts. None when either is None
                          or the baseline's is 0 (it was already there at the first eval).

A policy absent from the baseline run has no target (all rollouts_to_baseline None); a mode whose
run lacks a policy is left out of that policy's entry. `write_compare_report(runs, out_dir)`
writes index.html with one accuracy-vs-rollouts PNG per policy (one line per mode, the target as
a dashed line, a star where each mode reaches it), the comparison table and compare.json.

Errors (`TrainerError`, with what to do): a missing, empty or unreadable metrics file, a file
with no eval records, one policy in two files of a run, and a baseline mode absent from runs.
"""
import dataclasses
import html
import json
import math
import pathlib
import re

from mrl_trainer.errors import TrainerError
from mrl_trainer.metrics import read_metrics
from mrl_trainer.plot import plot_curves

__all__ = ["write_report", "compare", "write_compare_report", "main"]

Path = pathlib.Path
TOLERANCE = 1e-9

THL_KEYS = ("thl_one_to_one", "thl_lossless", "thl_tokens_per_chunk")
RATIO_KEYS = ("prp_rho_mean", "prp_log_rho_var", "prp_truncated", "hacpo_ratio_mean", "hacpo_clipped",
              "hacpo_omega_mean", "hacpo_lower_bound")
SGT_KEYS = ("sgt_rescued", "sgt_accepted", "sgt_rejected")
EXCHANGE_KEYS = ("peer_wait_s", "peer_samples", "peers_complete", "xgrpo_pooled")

LABELS = {
    "thl_one_to_one": "share of 1:1 chunks", "thl_lossless": "share lossless",
    "thl_tokens_per_chunk": "tokens per chunk",
    "prp_rho_mean": "PRP mean ρ", "prp_log_rho_var": "PRP var log ρ", "prp_truncated": "PRP fraction truncated at c",
    "hacpo_ratio_mean": "HACPO mean ratio", "hacpo_clipped": "HACPO fraction clipped",
    "hacpo_omega_mean": "HACPO mean ω", "hacpo_lower_bound": "HACPO lower bound",
    "sgt_rescued": "SGT prompts rescued (cumulative)", "sgt_accepted": "SGT peer successes accepted (cumulative)",
    "sgt_rejected": "SGT peer successes rejected (cumulative)",
    "peer_wait_s": "seconds waited for peers", "peer_samples": "peer samples used",
    "peers_complete": "fraction of peers in time", "xgrpo_pooled": "rewards in XGRPO pooled baseline",
}

FIGURES = {  # file -> (heading, what it shows)
    "curves.png": ("Held-out accuracy and training reward",
                   "Left: greedy accuracy on the held-out split (eval records) against rollouts consumed. "
                   "Right: the training batch's mean reward, 5-step moving average. One line per policy."),
    "thl.png": ("THL residual",
                "Per step: mean share of 1:1 chunks of the retokenized peer responses, share aligned "
                "losslessly, tokens per chunk. One line per policy."),
    "ratios.png": ("Ratio statistics",
                   "Per step: PRP's mean ρ, variance of log ρ and fraction truncated at c; HACPO's mean "
                   "ratio, fraction clipped, mean ω and lower bound."),
    "sgt.png": ("SGT rescues and rejections",
                "Cumulative over steps: prompts rescued with peer successes, peer successes accepted, and "
                "peer successes rejected by this policy's re-verification."),
    "exchange.png": ("Exchange",
                     "Per step: seconds waited for peers, peer samples used, fraction of peers whose step "
                     "batch arrived in time, rewards in XGRPO's pooled baseline."),
    "budget.png": ("Rollouts spent",
                   "Rollouts each policy generated (final rollouts_total) and the peer samples it used in all."),
}

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block}
.muted{color:#666;font-size:90%}"""


@dataclasses.dataclass
class PolicyRun:
    """One policy's metrics file: its train records and eval records (with a numeric accuracy), step order."""
    policy: str
    path: Path
    train: list[dict]
    evals: list[dict]

    @property
    def rollouts_total(self) -> int | None:
        values = [r["rollouts_total"] for r in self.train + self.evals if _num(r.get("rollouts_total"))]
        return max(values) if values else None

    @property
    def sharing(self) -> str | None:
        modes = list(dict.fromkeys(str(r["sharing"]) for r in self.train if r.get("sharing") is not None))
        return ", ".join(modes) if modes else None

    def has(self, key: str) -> bool:
        return any(_num(r.get(key)) for r in self.train)

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.train if _num(r.get(key))]


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label(text: str) -> str:
    """A policy name as a matplotlib label: a `$` would start mathtext."""
    return text.replace("$", r"\$")


def load_policy(path: str | Path) -> PolicyRun:
    """Read one trainer's metrics.jsonl, checking it can be reported on."""
    path = Path(path)
    if not path.is_file():
        raise TrainerError(f"metrics file {str(path)!r} does not exist: pass the metrics.jsonl a trainer wrote "
                           "(metrics.jsonl in its config, by default <checkpoint.dir>/metrics.jsonl)")
    try:
        records = read_metrics(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainerError(f"{path} is not a trainer metrics file (every line must be a JSON object with "
                           f"'step' and 'policy'): {exc}") from exc
    if not records:
        raise TrainerError(f"{path} is empty: the trainer has not logged a step yet; report once it has")
    policies = list(dict.fromkeys(str(r.get("policy")) for r in records))
    if len(policies) > 1:
        raise TrainerError(f"{path} holds records of several policies ({', '.join(policies)}): "
                           "pass one metrics file per policy")
    evals = [r for r in records if r.get("kind") == "eval" and _num(r.get("eval_accuracy"))]
    if not evals:
        raise TrainerError(f"{path} has no eval records (policy {policies[0]}): run the trainer with "
                           "eval.every > 0 so it logs held-out accuracy")
    train = [r for r in records if r.get("kind", "train") == "train"]
    return PolicyRun(policies[0], path, train, evals)


def _load_run(paths: list[str | Path], what: str) -> dict[str, PolicyRun]:
    if not paths:
        raise TrainerError(f"{what}: no metrics files given: pass one metrics.jsonl per policy")
    runs: dict[str, PolicyRun] = {}
    for path in paths:
        run = load_policy(path)
        if run.policy in runs:
            raise TrainerError(f"{what}: policy {run.policy!r} is in both {runs[run.policy].path} and {run.path}: "
                               "pass one metrics file per policy")
        runs[run.policy] = run
    return runs


# --- figures ------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _panels(runs: list[PolicyRun], keys: tuple[str, ...], out: Path, title: str,
            cumulative: bool = False) -> Path | None:
    """One subplot per key some record has (value over steps, one line per policy); None if none has."""
    present = [k for k in keys if any(run.has(k) for run in runs)]
    if not present:
        return None
    plt = _pyplot()
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        for run in runs:
            points = [(r["step"], r[key]) for r in run.train if _num(r.get(key))]
            if not points:
                continue
            steps = [s for s, _ in points]
            values = [v for _, v in points]
            if cumulative:
                values = [sum(values[:i + 1]) for i in range(len(values))]
            ax.plot(steps, values, marker="." if len(points) <= 40 else None, label=_label(run.policy))
        ax.set(xlabel="step", title=LABELS.get(key, key))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(present):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _budget(runs: list[PolicyRun], out: Path) -> Path:
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


def _figure_html(name: str, heading: str | None = None, text: str | None = None) -> str:
    default_heading, default_text = FIGURES.get(name, (name, ""))
    heading, text = heading or default_heading, text if text is not None else default_text
    return (f"<h2>{html.escape(heading)}</h2><p class=\"muted\">{html.escape(text)}</p>"
            f"<img src=\"{html.escape(name, quote=True)}\" alt=\"{html.escape(heading, quote=True)}\">")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def _summary_rows(runs: list[PolicyRun]) -> tuple[list[str], list[list]]:
    header = ["policy", "sharing", "steps", "rollouts consumed", "first eval accuracy", "final eval accuracy"]
    optional = [("sgt_rescued", "SGT rescues (cum.)", lambda r: sum(r.values("sgt_rescued"))),
                ("sgt_rejected", "SGT rejections (cum.)", lambda r: sum(r.values("sgt_rejected"))),
                ("thl_one_to_one", "mean THL 1:1 share",
                 lambda r: sum(r.values("thl_one_to_one")) / len(r.values("thl_one_to_one"))),
                ("peer_samples", "peer samples used", lambda r: sum(r.values("peer_samples")))]
    optional = [o for o in optional if any(run.has(o[0]) for run in runs)]
    header += [name for _, name, _ in optional]
    rows = []
    for run in runs:
        row = [run.policy, run.sharing, len(run.train), run.rollouts_total,
               float(run.evals[0]["eval_accuracy"]), float(run.evals[-1]["eval_accuracy"])]
        row += [value(run) if run.has(key) else None for key, _, value in optional]
        rows.append(row)
    return header, rows


def write_report(metrics_paths: list[str | Path], out_dir: str | Path, title: str = "mrl run") -> Path:
    """index.html and its PNGs in out_dir for one run (one metrics file per policy); returns index.html's path."""
    runs = list(_load_run(list(metrics_paths), "report").values())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [plot_curves([str(run.path) for run in runs], str(out_dir / "curves.png")).name]
    for name, keys, heading, cumulative in (("thl.png", THL_KEYS, "THL residual", False),
                                            ("ratios.png", RATIO_KEYS, "ratio statistics", False),
                                            ("sgt.png", SGT_KEYS, "SGT (cumulative)", True),
                                            ("exchange.png", EXCHANGE_KEYS, "exchange", False)):
        path = out_dir / name
        if _panels(runs, keys, path, heading, cumulative=cumulative):
            figures.append(name)
        elif path.exists():
            path.unlink()  # a stale figure from an earlier report into the same folder
    figures.append(_budget(runs, out_dir / "budget.png").name)
    header, rows = _summary_rows(runs)
    sources = "".join(f"<li>{html.escape(run.policy)}: <code>{html.escape(str(run.path))}</code></li>" for run in runs)
    body = ("<h2>Summary</h2>" + _table(header, rows)
            + f"<p class=\"muted\">metrics files:</p><ul class=\"muted\">{sources}</ul>"
            + "".join(_figure_html(name) for name in figures))
    index = out_dir / "index.html"
    index.write_text(_page(title, body), encoding="utf-8")
    return index


# --- comparing sharing modes --------------------------------------------------------------------
def _rollouts_to(run: PolicyRun, target: float | None) -> int | None:
    if target is None:
        return None
    for r in run.evals:
        if r["eval_accuracy"] >= target - TOLERANCE:
            return r.get("rollouts_total")
    return None


def _compare_loaded(loaded: dict[str, dict[str, PolicyRun]], baseline: str) -> dict:
    policies = list(dict.fromkeys(p for mode in [baseline, *loaded] for p in loaded[mode]))
    out: dict = {"baseline": baseline, "policies": {}}
    for policy in policies:
        base = loaded[baseline].get(policy)
        target = float(base.evals[-1]["eval_accuracy"]) if base else None
        base_to = _rollouts_to(base, target) if base else None
        entry = {}
        for mode, runs in loaded.items():
            run = runs.get(policy)
            if run is None:
                continue
            to = _rollouts_to(run, target)
            entry[mode] = {
                "sharing": run.sharing,
                "steps": len(run.train),
                "first_eval_accuracy": float(run.evals[0]["eval_accuracy"]),
                "final_eval_accuracy": float(run.evals[-1]["eval_accuracy"]),
                "rollouts_total": run.rollouts_total,
                "target_accuracy": target,
                "rollouts_to_baseline": to,
                "ratio_to_baseline": to / base_to if to is not None and base_to else None,
            }
        out["policies"][policy] = entry
    return out


def _load_runs(runs: dict[str, list[str | Path]], baseline: str) -> dict[str, dict[str, PolicyRun]]:
    if baseline not in runs:
        given = ", ".join(map(repr, runs)) or "none given"
        raise TrainerError(f"baseline mode {baseline!r} is not among the runs ({given}): "
                           f"add the {baseline!r} run's metrics files or pass baseline= one of them")
    return {mode: _load_run(list(paths), f"mode {mode!r}") for mode, paths in runs.items()}


def compare(runs: dict[str, list[str | Path]], baseline: str = "none") -> dict:
    """Per policy and sharing mode: final eval accuracy, rollouts consumed, rollouts to the baseline's
    final accuracy and its ratio to the baseline's own (see the module docstring). JSON-able."""
    return _compare_loaded(_load_runs(runs, baseline), baseline)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:60] or "policy"


def _compare_plot(policy: str, loaded: dict[str, dict[str, PolicyRun]], entry: dict, out: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    target = None
    for mode, stats in entry.items():
        run = loaded[mode][policy]
        line, = ax.plot([r.get("rollouts_total") for r in run.evals], [r["eval_accuracy"] for r in run.evals],
                        marker="o", markersize=3, label=_label(mode))
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


def write_compare_report(runs: dict[str, list[str | Path]], out_dir: str | Path, baseline: str = "none") -> Path:
    """index.html (one accuracy-vs-rollouts PNG per policy, one line per mode; the table) and compare.json."""
    loaded = _load_runs(runs, baseline)
    result = _compare_loaded(loaded, baseline)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    header = ["policy", "mode", "steps", "rollouts consumed", "final eval accuracy", "target accuracy",
              "rollouts to baseline", "ratio to baseline"]
    rows = [[policy, mode, s["steps"], s["rollouts_total"], s["final_eval_accuracy"], s["target_accuracy"],
             s["rollouts_to_baseline"], s["ratio_to_baseline"]]
            for policy, entry in result["policies"].items() for mode, s in entry.items()]
    figures = []
    for i, (policy, entry) in enumerate(result["policies"].items()):
        name = f"compare_{i}_{_safe(policy)}.png"
        _compare_plot(policy, loaded, entry, out_dir / name)
        figures.append(_figure_html(name, f"{policy}: held-out accuracy by sharing mode",
                                    "One line per mode; dashed: the baseline's final accuracy; "
                                    "a star where a mode first reaches it."))
    body = (f"<p>baseline mode: <b>{html.escape(baseline)}</b>. rollouts to baseline = rollouts_total of a mode's "
            "first eval record with eval accuracy ≥ the baseline's final eval accuracy for that policy "
            "(— if never reached); ratio = that over the baseline's own. "
            "<a href=\"compare.json\">compare.json</a></p>"
            + "<h2>Comparison</h2>" + _table(header, rows) + "".join(figures))
    index = out_dir / "index.html"
    index.write_text(_page(f"mrl sharing modes vs {baseline}", body), encoding="utf-8")
    return index


def main(paths: list[str], out_dir: str, title: str = "mrl run") -> None:
    """For a CLI: `write_report`, printing index.html's path, a TrainerError as a one-line exit."""
    try:
        print(write_report(paths, out_dir, title))
    except TrainerError as exc:
        raise SystemExit(f"mrl trainer report: error: {exc}") from None

"""`mrl trainer plot METRICS... --out curve.png`: learning curves from trainers' metrics.jsonl.

Two panels against rollouts consumed: held-out greedy accuracy (the eval records) and the
training batch's mean reward (a 5-step moving average), one line per metrics file (policy).
"""
import pathlib

from mrl_trainer.errors import TrainerError
from mrl_trainer.metrics import read_metrics

__all__ = ["plot_curves", "main"]


def _moving_average(values: list[float], k: int = 5) -> list[float]:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def plot_curves(paths: list[str], out: str, title: str = "held-out accuracy") -> pathlib.Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for path in paths:
        if not pathlib.Path(path).is_file():
            raise TrainerError(f"metrics file {path!r} does not exist")
        records = read_metrics(path)
        evals = [r for r in records if r.get("kind") == "eval"]
        train = [r for r in records if r.get("kind", "train") == "train"]
        if not records:
            raise TrainerError(f"{path} holds no metrics records")
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


def main(paths: list[str], out: str) -> None:
    try:
        print(plot_curves(paths, out))
    except TrainerError as exc:
        raise SystemExit(f"mrl trainer plot: error: {exc}") from None

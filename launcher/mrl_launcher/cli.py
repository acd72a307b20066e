"""The launcher's `mrl` commands (entry points `mrl.commands`; see mrl.cli)."""
from mrl_launcher.arguments import at_step, ints

__all__ = ["up", "demo", "watch", "compare", "plot", "report"]


class _RegisteredModes:
    """The registered sharing modes as help text: read (importing torch) only when the help is shown."""

    def __str__(self) -> str:
        from mrl_trainer.sharing import SHARING_MODES
        return ", ".join(SHARING_MODES)


def _report_to(parser, default: str) -> None:
    parser.add_argument("--report-to", default=default, metavar="TRACKERS",
                        help="comma-separated trackers every trainer logs to (tensorboard, wandb, mlflow, trackio; "
                             "tracking.report_to), under data_dir/tracking; 'none' for none (default: "
                             + (default or "each trainer's own tracking.report_to") + ")")


def _tracking_overrides(value: str) -> dict:
    """--report-to as trainer overrides: {} where it leaves each trainer's own (""), else tracking.report_to."""
    if value == "":
        return {}
    return {"tracking.report_to": [] if value == "none" else [name.strip() for name in value.split(",")]}


def up(parser):
    """run a topology locally as processes: Redis, the services, N trainers (Ctrl-C stops them in order)"""
    parser.add_argument("config", help="YAML topology, e.g. examples/local.yaml")
    _report_to(parser, "")

    def run(args) -> None:
        from mrl_launcher.topology import up as run_up
        run_up(args.config, _tracking_overrides(args.report_to))
    return run


def watch(parser):
    """serve the live page of a run folder (a topology's data_dir), finished or under way; Ctrl-C stops it"""
    parser.add_argument("run_dir", help="the run's data_dir, holding <policy>/metrics.jsonl")
    parser.add_argument("--port", type=int, default=0, help="the page's port (default: any free port)")
    parser.add_argument("--exchange-admin", help="http://host:port of the run's exchange admin API, to record "
                                                 "its snapshots while it runs (a remote run)")
    parser.add_argument("--run-id", help="with --exchange-admin: the run whose topics to read")

    def run(args) -> None:
        import os

        from mrl_launcher.live import watch as serve
        serve(args.run_dir, args.port, args.exchange_admin, args.run_id, os.environ.get("MRL_TOKEN"))
    return run


def _exchange_demo():
    """The exchange demo's main, which the research package declares (entry point `mrl.demos` "exchange"): found
    by name, so that nothing here imports research code."""
    from importlib.metadata import entry_points
    from mrl_launcher.errors import LauncherError
    found = entry_points(group="mrl.demos", name="exchange")
    if not found:
        raise LauncherError("mrl demo --exchange needs the research package: pip install -e research")
    return next(iter(found)).load()


def demo(parser):
    """mutual RL of two heterogeneous policies on CPU (examples/mutual.yaml), with a report"""
    parser.add_argument("topology", nargs="?", default="examples/mutual.yaml")
    parser.add_argument("--exchange", action="store_true", help="instead: the exchange alone, with a summary")
    parser.add_argument("--steps", type=int, default=20, help="--exchange: steps per producer")
    parser.add_argument("--group-size", type=int, default=8, help="--exchange: samples per group")
    _report_to(parser, "tensorboard")

    def run(args) -> None:
        if args.exchange:
            _exchange_demo()(steps=args.steps, group_size=args.group_size)
        else:
            from mrl_launcher.topology import up as run_up
            run_up(args.topology, _tracking_overrides(args.report_to))
    return run


def compare(parser):
    """run each sharing mode on a topology's trainers and compare them (HTML, compare.json)"""
    from mrl_trainer.cli import add_overrides
    parser.add_argument("config", help="YAML topology with trainers, e.g. examples/mutual.yaml")
    modes = parser.add_argument("--modes", help="comma-separated sharing modes among %(registered)s, or variants "
                                                "of one (mode:field=value[:…][-unguarded], as in mrl lab bandit: "
                                                "sgt:rationalize=8); must include the baseline (default: every mode)")
    modes.registered = _RegisteredModes()     # argparse expands %(registered)s from the action's attributes
    parser.add_argument("--seeds", type=ints, help="comma-separated seeds for every trainer (default: each config's own)")
    parser.add_argument("--parallel", type=int, help="runs at once (default: cores // trainers, at least 1)")
    parser.add_argument("--out", default=".mrl/compare", help="where runs and reports are written")
    parser.add_argument("--baseline", default="none",
                        help="the arm every other is paired with (default: none, solo GRPO); e.g. xgrpo, to set "
                             "xgrpo:coupling=async against lockstep XGRPO")
    parser.add_argument("--at-step", type=at_step, metavar="N|POLICY=N,…",
                        help="compare every run as it stood at its eval of step N (default: each run's last eval), "
                             "e.g. a fast asynchronous policy given more steps than its peer, at the peer's budget; "
                             "or each named policy at its own step (policy-a=16,policy-b=96), the others at their "
                             "last eval")
    parser.add_argument("--keep", action="store_true",
                        help="keep the runs in --out that finished with the same settings (to add seeds or arms, "
                             "or complete a stopped comparison)")
    add_overrides(parser, "a field of every trainer")

    def run(args) -> None:
        import json

        from mrl_launcher.experiment import run_compare
        from mrl_trainer.app import parse_overrides
        from mrl_trainer.sharing import SHARING_MODES
        modes = args.modes.split(",") if args.modes else list(SHARING_MODES)
        print(json.dumps(run_compare(args.config, modes, args.seeds, args.out, parse_overrides(args.overrides),
                                     args.parallel, args.keep, args.baseline, args.at_step)),
              flush=True)
    return run


def plot(parser):
    """accuracy curves (PNG) from trainers' metrics.jsonl files"""
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files (one curve per policy)")
    parser.add_argument("--out", required=True, help="the PNG to write")

    def run(args) -> None:
        from mrl_launcher.figures import plot_curves
        print(plot_curves(args.metrics, args.out))
    return run


def report(parser):
    """an HTML report (PNG plots) of a multi-policy run from its metrics.jsonl files"""
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files (one per policy)")
    parser.add_argument("--out", required=True, help="the folder to write index.html and PNGs into")

    def run(args) -> None:
        from mrl_launcher.report import write_report
        print(write_report(args.metrics, args.out))
    return run

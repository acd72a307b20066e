"""The `mrl` command line.

    mrl exchange serve            run the Shared Experience Exchange (gRPC + REST admin)
    mrl align serve               run the tokenizer alignment service, THL (gRPC + REST twin)
    mrl scheduler serve           run the GPU lease scheduler, MWRA (gRPC + REST admin)
    mrl trainer run CONFIG        train one policy (rollout → reward → publish → update → checkpoint)
    mrl trainer plot METRICS...   accuracy curves (PNG) from trainers' metrics.jsonl files
    mrl trainer report METRICS... an HTML report (PNG plots) of a multi-policy run
    mrl up CONFIG                 run a topology locally as processes: Redis, services, N trainers
    mrl demo                      mutual RL of two heterogeneous policies on CPU, with a report
    mrl demo --exchange           the exchange alone: two producers, two subscribers, a summary
    mrl experiment compare TOPO   the same pair under none, PRP, XGRPO, SGT and HACPO, compared
    mrl bench exchange            publish → deliver → ack throughput and latency vs raw redis-py
    mrl bench align               alignment throughput vs raw encoding on both sides
    mrl bench scheduler           simulated workers through the lease scheduler vs a naive FIFO
    mrl token new --name N ...    a new bearer token and the auth-file entry holding its hash

Services are separate packages (mrl-exchange, ...): a command whose package is not
installed says which one to install.
"""
import argparse
import importlib
import sys

import yaml

from mrl.auth import hash_token, new_token

__all__ = ["main"]


def _load(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            raise SystemExit(f"this command needs the {package} package: pip install -e services/{package}") from exc
        raise


_BENCHES = {"exchange": ("mrl_exchange.bench", "exchange"), "align": ("mrl_tokenizer_align.bench", "tokenizer_align"),
            "scheduler": ("mrl_scheduler.bench", "scheduler"), "trainer": ("mrl_trainer.bench", "trainer")}


def _token_new(args) -> None:
    token = new_token()
    principal = {"name": args.name, "role": args.role, "runs": args.runs or ["*"], "token_sha256": hash_token(token)}
    if args.role == "policy":
        principal["policy"] = args.policy or args.name
    print(f"# token for {args.name} (give it to the principal; it is not stored anywhere):\n# {token}")
    print(yaml.safe_dump({"principals": [principal]}, sort_keys=False), end="")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mrl", description="Mutual reinforcement learning platform")
    sub = parser.add_subparsers(dest="command", required=True)

    exchange = sub.add_parser("exchange", help="the Shared Experience Exchange (SEE)")
    exchange_sub = exchange.add_subparsers(dest="action", required=True)
    exchange_sub.add_parser("serve", help="serve gRPC and the REST admin (settings: MRL_* env or MRL_CONFIG)")

    align = sub.add_parser("align", help="the Tokenizer Heterogeneity Layer (THL)")
    align_sub = align.add_subparsers(dest="action", required=True)
    align_sub.add_parser("serve", help="serve gRPC TokenizerAlign and its REST twin")

    scheduler = sub.add_parser("scheduler", help="the GPU lease scheduler (MWRA)")
    scheduler_sub = scheduler.add_subparsers(dest="action", required=True)
    scheduler_sub.add_parser("serve", help="serve gRPC Scheduler and the REST admin (settings: MRL_* env or "
                                           "MRL_CONFIG)")

    trainer = sub.add_parser("trainer", help="one policy's GRPO-family trainer")
    trainer_sub = trainer.add_subparsers(dest="action", required=True)
    trainer_run = trainer_sub.add_parser("run", help="train one policy from its YAML config")
    trainer_run.add_argument("config", help="YAML trainer config, e.g. examples/smollm2-arithmetic.yaml")
    trainer_run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                             help="override a config field (dotted key, YAML value), e.g. --set steps=20")
    trainer_plot = trainer_sub.add_parser("plot", help="plot accuracy curves from metrics.jsonl files")
    trainer_plot.add_argument("metrics", nargs="+", help="metrics.jsonl files (one curve per policy)")
    trainer_plot.add_argument("--out", required=True, help="the PNG to write")
    trainer_report = trainer_sub.add_parser("report", help="an HTML report of a run from its metrics.jsonl files")
    trainer_report.add_argument("metrics", nargs="+", help="metrics.jsonl files (one per policy)")
    trainer_report.add_argument("--out", required=True, help="the folder to write index.html and PNGs into")

    experiment = sub.add_parser("experiment", help="compare sharing modes on the same pair of policies")
    experiment_sub = experiment.add_subparsers(dest="action", required=True)
    compare = experiment_sub.add_parser("compare", help="run each sharing mode on a topology's trainers")
    compare.add_argument("config", help="YAML topology with trainers, e.g. examples/mutual.yaml")
    compare.add_argument("--modes", default="none,prp,xgrpo,sgt,hacpo", help="comma-separated; must include none")
    compare.add_argument("--seeds", help="comma-separated seeds for every trainer (default: each config's own)")
    compare.add_argument("--out", default=".mrl/compare", help="where runs and reports are written")
    compare.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a field of every trainer, e.g. --set steps=8")

    up = sub.add_parser("up", help="run a topology locally as processes")
    up.add_argument("config", help="YAML topology, e.g. examples/local.yaml")

    demo = sub.add_parser("demo", help="mutual RL of two policies on CPU (examples/mutual.yaml), with a report")
    demo.add_argument("topology", nargs="?", default="examples/mutual.yaml")
    demo.add_argument("--exchange", action="store_true", help="instead: the exchange alone, with a summary")
    demo.add_argument("--steps", type=int, default=20, help="--exchange: steps per producer")
    demo.add_argument("--group-size", type=int, default=8, help="--exchange: samples per group")

    bench = sub.add_parser("bench", help="run a benchmark; ends with one JSON line")
    bench.add_argument("name", choices=list(_BENCHES))
    bench.add_argument("--quick", action="store_true", help="a small run, for smoke tests")

    token = sub.add_parser("token", help="bearer tokens")
    token_sub = token.add_subparsers(dest="action", required=True)
    new = token_sub.add_parser("new", help="print a new token and its auth-file entry")
    new.add_argument("--name", required=True)
    new.add_argument("--role", choices=["policy", "admin"], default="policy")
    new.add_argument("--policy", help="policy id it acts as (default: --name)")
    new.add_argument("--runs", nargs="*", help="runs it belongs to (default: all)")

    args = parser.parse_args(argv)
    if args.command == "exchange":
        _load("mrl_exchange.app", "exchange").serve()
    elif args.command == "align":
        _load("mrl_tokenizer_align.app", "tokenizer_align").serve()
    elif args.command == "scheduler":
        _load("mrl_scheduler.app", "scheduler").serve()
    elif args.command == "trainer" and args.action == "run":
        _load("mrl_trainer.app", "trainer").main(args.config, args.overrides)
    elif args.command == "trainer" and args.action == "plot":
        _load("mrl_trainer.plot", "trainer").main(args.metrics, args.out)
    elif args.command == "trainer":
        _load("mrl_trainer.report", "trainer").main(args.metrics, args.out)
    elif args.command == "experiment":
        overrides = _load("mrl_trainer.app", "trainer").parse_overrides(args.overrides)
        _load("mrl_trainer.experiment", "trainer").main(args.config, args.modes.split(","),
                                                        args.seeds and [int(s) for s in args.seeds.split(",")],
                                                        args.out, overrides)
    elif args.command == "up":
        from mrl.topology import up
        up(args.config)
    elif args.command == "demo" and args.exchange:
        _load("mrl_exchange.demo", "exchange").main(steps=args.steps, group_size=args.group_size)
    elif args.command == "demo":
        from mrl.topology import up
        up(args.topology)
    elif args.command == "bench":
        module, package = _BENCHES[args.name]
        _load(module, package).main(quick=args.quick)
    elif args.command == "token":
        _token_new(args)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The research `mrl` commands (entry points `mrl.commands`; see mrl.cli): `mrl bench NAME [--quick]`.

    bench_exchange = bench_command("mrl_research.bench.exchange", "publish → deliver ...",   # mrl bench exchange
                                   replicas={"type": int, "default": 1, "help": "..."})      #   [--replicas N]

The module named is imported only when the command runs, so `mrl --help` stays fast. `mrl lab ...` is in
mrl_research.lab.cli.
"""
import importlib

__all__ = ["bench_command", "bench_exchange", "bench_align", "bench_scheduler", "bench_trainer", "bench_guard",
           "bench_trl", "bench_mutual"]


def bench_command(module: str, help: str, **options):
    """A command that runs `<module>.main(quick=..., **options)`, a benchmark that ends with one JSON line;
    `options` maps a keyword of main to the argparse arguments of its `--option`."""
    def register(parser):
        parser.add_argument("--quick", action="store_true", help="a small run, for smoke tests")
        for name, kwargs in options.items():
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, **kwargs)
        return lambda args: importlib.import_module(module).main(
            quick=args.quick, **{name: getattr(args, name) for name in options})
    register.__doc__ = help
    return register


bench_exchange = bench_command(
    "mrl_research.bench.exchange", "publish → deliver → ack throughput and latency vs raw redis-py; ends with one "
                                   "JSON line",
    replicas={"type": int, "default": 1, "metavar": "R",
              "help": "also measure R exchange replicas on the same Redis (workers spread over them) next to one "
                      "replica, in the same run (1-8)"})
bench_align = bench_command("mrl_research.bench.align", "alignment throughput vs raw encoding on both sides; ends "
                                                        "with one JSON line")
bench_scheduler = bench_command("mrl_research.bench.scheduler", "simulated workers through the lease scheduler vs a "
                                                                "naive FIFO; ends with one JSON line")
bench_trainer = bench_command("mrl_research.bench.trainer", "one GRPO step of this trainer vs TRL's GRPOTrainer "
                                                            "(time, memory, loss); ends with one JSON line")
bench_guard = bench_command("mrl_research.bench.guard", "the no-harm guard's combination per optimizer step on the "
                                                        "demo pair's parameters vs the optimizer's step (time, "
                                                        "memory); ends with one JSON line")
bench_trl = bench_command("mrl_research.bench.trl", "TRL's GRPOTrainer joining a run (mrl.integrations.trl) vs plain "
                                                    "TRL, a peer publishing: step-time overhead; ends with one JSON line")
bench_mutual = bench_command(
    "mrl_research.bench.mutual", "two co-trained policies of different speed (the demo's), alone vs lockstep vs "
                                 "async for the same wall time: steps per minute; ends with one JSON line",
    seconds=dict(type=float, help="training seconds per arm, from the latest first-step start (default 300; "
                                  "--quick 10)"),
    arms=dict(default="alone,lockstep,async", help="comma-separated arms among alone, lockstep, async; alone is the "
                                                    "ratios' reference (default: all three)"),
    topology=dict(default="examples/mutual.yaml", help="the topology of the co-trained policies (default: the demo's)"),
    frozen=dict(action="store_true", help="every trainer at lr 0: each step does all its work and the policies do not "
                                          "change, so the arms differ only in what coupling and sharing cost, not in "
                                          "what the policies learn (such as longer answers)"))

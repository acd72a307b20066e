"""The trainer's `mrl` commands (entry points `mrl.commands`; see mrl.cli)."""
from mrl_serving.commands import bench_command

__all__ = ["run", "warm_start", "bench", "bench_guard", "bench_hacpo", "add_overrides"]


def add_overrides(parser, what: str = "a config field") -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override {what} (dotted key, YAML value), e.g. --set steps=20")


def run(parser):
    """train one policy from its YAML config (rollout → reward → publish → update → checkpoint)"""
    parser.add_argument("config", help="YAML trainer config, e.g. examples/smollm2-arithmetic.yaml")
    add_overrides(parser)

    def go(args) -> None:
        from mrl_trainer.app import parse_overrides
        from mrl_trainer.app import run as run_trainer
        run_trainer(args.config, parse_overrides(args.overrides))
    return go


def warm_start(parser):
    """do a trainer config's supervised warm start into the model cache and exit (a launcher runs it for every
    policy before the first RL step)"""
    parser.add_argument("config", help="YAML trainer config with a warm_start section")
    add_overrides(parser)

    def go(args) -> None:
        from mrl_trainer.app import parse_overrides
        from mrl_trainer.app import warm_start as prepare
        prepare(args.config, parse_overrides(args.overrides))
    return go


bench = bench_command("mrl_trainer.bench", "one GRPO step of this trainer vs TRL's GRPOTrainer (time, memory, "
                                           "loss); ends with one JSON line")
bench_guard = bench_command("mrl_trainer.guard_bench", "the no-harm guard's combination per optimizer step on the "
                                                      "demo pair's parameters vs the optimizer's step (time, "
                                                      "memory); ends with one JSON line")
bench_hacpo = bench_command("mrl_trainer.hacpo_bench", "a HACPO update on SmolLM2's shapes with its clipped peer "
                                                      "samples screened out of autograd vs the plain update "
                                                      "(time, memory); ends with one JSON line")

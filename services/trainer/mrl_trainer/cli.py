"""The trainer's `mrl` commands (entry points `mrl.commands`; see mrl.cli); its benches are in mrl_research."""

__all__ = ["run", "warm_start", "add_overrides"]


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


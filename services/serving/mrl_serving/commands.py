"""The `mrl` commands every service declares alike (entry points `mrl.commands`; see mrl.cli).

    serve = serve_command("mrl_exchange.app", "serve the exchange ...")     # mrl exchange serve
    bench = bench_command("mrl_exchange.bench", "publish → deliver ...",    # mrl bench exchange [--quick]
                          replicas={"type": int, "default": 1, "help": "..."})  #   [--replicas N]

The module named is imported only when the command runs, so `mrl --help` stays fast.
"""
import importlib

__all__ = ["serve_command", "bench_command"]


def serve_command(app: str, help: str):
    """A command that runs `<app>.serve()` until SIGINT/SIGTERM (settings: MRL_* env or MRL_CONFIG)."""
    def register(parser):
        return lambda args: importlib.import_module(app).serve()
    register.__doc__ = help
    return register


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

"""The `mrl` commands every service declares alike (entry points `mrl.commands`; see mrl.cli).

    serve = serve_command("mrl_exchange.app", "serve the exchange ...")     # mrl exchange serve
    bench = bench_command("mrl_exchange.bench", "publish → deliver ...")    # mrl bench exchange [--quick]

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


def bench_command(module: str, help: str):
    """A command that runs `<module>.main(quick=...)`, a benchmark that ends with one JSON line."""
    def register(parser):
        parser.add_argument("--quick", action="store_true", help="a small run, for smoke tests")
        return lambda args: importlib.import_module(module).main(quick=args.quick)
    register.__doc__ = help
    return register

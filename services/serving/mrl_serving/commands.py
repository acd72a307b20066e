"""The `mrl` command every service declares alike (entry points `mrl.commands`; see mrl.cli).

    serve = serve_command("mrl_exchange.app", "serve the exchange ...")     # mrl exchange serve

The module named is imported only when the command runs, so `mrl --help` stays fast. (The benches' commands are
in mrl_research.cli.)
"""
import importlib

__all__ = ["serve_command"]


def serve_command(app: str, help: str):
    """A command that runs `<app>.serve()` until SIGINT/SIGTERM (settings: MRL_* env or MRL_CONFIG)."""
    def register(parser):
        return lambda args: importlib.import_module(app).serve()
    register.__doc__ = help
    return register

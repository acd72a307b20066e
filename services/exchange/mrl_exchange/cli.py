"""The exchange's `mrl` commands (entry points `mrl.commands`; see mrl.cli); its bench is in mrl_research."""
from mrl_serving.commands import serve_command

__all__ = ["serve"]

serve = serve_command("mrl_exchange.app", "serve the Shared Experience Exchange: gRPC and the REST admin "
                                          "(settings: MRL_* env or MRL_CONFIG)")

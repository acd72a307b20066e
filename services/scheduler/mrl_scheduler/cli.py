"""The scheduler's `mrl` commands (entry points `mrl.commands`; see mrl.cli); its bench is in mrl_research."""
from mrl_serving.commands import serve_command

__all__ = ["serve"]

serve = serve_command("mrl_scheduler.app", "serve the GPU lease scheduler, MWRA: gRPC and the REST admin "
                                           "(settings: MRL_* env or MRL_CONFIG)")

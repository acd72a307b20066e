"""The scheduler's `mrl` commands (entry points `mrl.commands`; see mrl.cli)."""
from mrl_serving.commands import bench_command, serve_command

__all__ = ["serve", "bench"]

serve = serve_command("mrl_scheduler.app", "serve the GPU lease scheduler, MWRA: gRPC and the REST admin "
                                           "(settings: MRL_* env or MRL_CONFIG)")
bench = bench_command("mrl_scheduler.bench", "simulated workers through the lease scheduler vs a naive FIFO; ends "
                                             "with one JSON line")

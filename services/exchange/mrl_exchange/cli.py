"""The exchange's `mrl` commands (entry points `mrl.commands`; see mrl.cli)."""
from mrl_serving.commands import bench_command, serve_command

__all__ = ["serve", "bench"]

serve = serve_command("mrl_exchange.app", "serve the Shared Experience Exchange: gRPC and the REST admin "
                                          "(settings: MRL_* env or MRL_CONFIG)")
bench = bench_command("mrl_exchange.bench", "publish → deliver → ack throughput and latency vs raw redis-py; "
                                            "ends with one JSON line",
                      replicas={"type": int, "default": 1, "metavar": "R",
                                "help": "also measure R exchange replicas on the same Redis (workers spread over "
                                        "them) next to one replica, in the same run (1-8)"})

"""The alignment service's `mrl` commands (entry points `mrl.commands`; see mrl.cli)."""
from mrl_serving.commands import bench_command, serve_command

__all__ = ["serve", "bench"]

serve = serve_command("mrl_tokenizer_align.app", "serve the tokenizer alignment service, THL: gRPC TokenizerAlign "
                                                 "and its REST twin")
bench = bench_command("mrl_tokenizer_align.bench", "alignment throughput vs raw encoding on both sides; ends with "
                                                   "one JSON line")

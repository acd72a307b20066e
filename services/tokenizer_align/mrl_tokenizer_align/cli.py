"""The alignment service's `mrl` commands (entry points `mrl.commands`; see mrl.cli); its bench is in mrl_research."""
from mrl_serving.commands import serve_command

__all__ = ["serve"]

serve = serve_command("mrl_tokenizer_align.app", "serve the tokenizer alignment service, THL: gRPC TokenizerAlign "
                                                 "and its REST twin")

"""Where this machine keeps the real assets no hub can give us (docs/deployment.md, "Models and tokenizers").

    tokenizer_cache_dir()   $MRL_TOKENIZER_CACHE or ~/.cache/mrl/tokenizers (`make tokenizers` fills it)
    model_cache_dir()       $MRL_MODEL_CACHE or ~/.cache/mrl/models (GGUF files converted to safetensors)

`expand(path)` expands ~ and environment variables in a configured path, with
$MRL_TOKENIZER_CACHE standing for the tokenizer cache when it is not set.
"""
import os
import pathlib

__all__ = ["tokenizer_cache_dir", "model_cache_dir", "expand"]


def tokenizer_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("MRL_TOKENIZER_CACHE", "~/.cache/mrl/tokenizers")).expanduser()


def model_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("MRL_MODEL_CACHE", "~/.cache/mrl/models")).expanduser()


def expand(path: str) -> str:
    text = path.replace("${MRL_TOKENIZER_CACHE}", str(tokenizer_cache_dir()))
    return os.path.expanduser(os.path.expandvars(text))

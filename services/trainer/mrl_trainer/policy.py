"""Policy loading: a causal LM and its tokenizer, from one of three sources.

    source   what `path` names                         notes
    hf       a local Hugging Face folder               config.json, weights, tokenizer files
    gguf     a .gguf file (e.g. SmolLM2-135M-Instruct)  dequantised once into a cached safetensors
                                                        folder (MRL_MODEL_CACHE, ~/.cache/mrl/models)
    config   nothing: `architecture` builds a fresh    over a real tokenizer: a .tiktoken file (GPT-2)
             model (e.g. GPT-2) with random weights     or a HF tokenizer folder

Chat templates are respected: a model's own template formats its prompts; a tokenizer without
one (GPT-2, a base model such as Gemma-3-270M) gets `chat_template` from the spec, by default
mrl.prompts' plain "User: ...\\nAssistant:" form (after the BOS where the tokenizer's encoding
begins with one). prompt_ids (mrl.prompts) poses a question.
No model hub is reached (docs/deployment.md, "Models and tokenizers"): every path is local.
"""
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Literal

import torch
from pydantic import Field, model_validator

from mrl.assets import expand, model_cache_dir
from mrl.prompts import ensure_template
from mrl_trainer.errors import TrainerError
from mrl_trainer.section import Section

__all__ = ["ModelSpec", "load_policy", "gguf_folder"]

class ModelSpec(Section):
    """Where a policy's weights and tokenizer come from."""

    source: Literal["hf", "gguf", "config"] = Field(description="hf folder, gguf file, or built from `architecture`.")
    path: str | None = Field(None, description="hf: the folder; gguf: the .gguf file.")
    tokenizer: str | None = Field(None, description="config: a .tiktoken file (with its .json sidecar) or a HF "
                                                    "tokenizer folder. Default for hf/gguf: the model's own.")
    architecture: dict | None = Field(None, description="config: a transformers config as a mapping, with "
                                                        "`model_type` (e.g. gpt2, llama) and its sizes.")
    chat_template: str | None = Field(None, description="Jinja chat template when the tokenizer has none "
                                                        "(default mrl.prompts.default_template).")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="The weights' (and so the optimizer state's) dtype. auto: float32; on a GPU the "
                            "forward passes still run in bfloat16 under `autocast`. bfloat16 weights round away "
                            "RL-sized steps (see mrl_trainer.policy.forward_dtype).")
    autocast: Literal["auto", "bfloat16", "off"] = Field(
        "auto", description="Forward passes (rollout, update, evaluation) under torch.autocast in this dtype. "
                            "auto: bfloat16 on a GPU that supports it (mixed precision), off on the CPU.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: "
                                                            "less memory, about 30% more compute.")

    @model_validator(mode="after")
    def _source_fields(self):
        if self.source in ("hf", "gguf") and not self.path:
            raise ValueError(f"model.source={self.source!r} needs model.path (a local "
                             f"{'folder' if self.source == 'hf' else '.gguf file'})")
        if self.source == "config" and (not self.architecture or "model_type" not in self.architecture):
            raise ValueError("model.source='config' needs model.architecture with a model_type, "
                             "e.g. {model_type: gpt2, n_layer: 4, n_embd: 256, n_head: 4}")
        if self.source == "config" and not self.tokenizer:
            raise ValueError("model.source='config' needs model.tokenizer (a .tiktoken file or a tokenizer folder)")
        return self


def _existing(path: str, what: str) -> pathlib.Path:
    p = pathlib.Path(expand(path))
    if not p.exists():
        raise TrainerError(f"{what} {str(p)!r} does not exist (no model hub is reached: give a local path)")
    return p


def gguf_folder(path: str) -> pathlib.Path:
    """The safetensors folder a GGUF file converts into, converting it once (atomically) if needed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = _existing(path, "GGUF file")
    digest = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}".encode()).hexdigest()
    folder = model_cache_dir() / f"{gguf.stem}-{digest[:12]}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        # transformers reads a GGUF from a folder; a folder holding only that file keeps
        # unrelated siblings (other models' config.json) out of the way.
        alone = pathlib.Path(tmp) / "gguf"
        alone.mkdir()
        os.symlink(gguf.resolve(), alone / gguf.name)
        out = pathlib.Path(tmp) / "out"
        try:
            model = AutoModelForCausalLM.from_pretrained(str(alone), gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(alone), gguf_file=gguf.name)
        except Exception as exc:
            raise TrainerError(f"cannot read {gguf} as a GGUF causal LM: {exc}") from exc
        # The dequantised weights are plain float32, but the model remembers it came from a GGUF
        # and refuses save_pretrained: copy them into a fresh model of the same config.
        model.config.__dict__.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        try:
            out.rename(folder)
        except OSError:  # another process converted it first
            if not (folder / "config.json").exists():
                raise
    return folder


def _tiktoken_tokenizer(path: pathlib.Path):
    """A fast HF tokenizer from a .tiktoken rank file and its sidecar {pattern, special_tokens}."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    sidecar = path.with_name(path.name + ".json")
    if not sidecar.exists():
        raise TrainerError(f"{path} needs its sidecar {sidecar.name} (pattern and special tokens): "
                           f"run `make tokenizers`")
    meta = json.loads(sidecar.read_text())
    specials = meta["special_tokens"]
    backend = TikTokenConverter(vocab_file=str(path), pattern=meta["pattern"],
                                extra_special_tokens=specials).converted()
    eos = min(specials, key=specials.get)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos, pad_token=eos)


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer
    p = _existing(path, "tokenizer")
    if p.name.endswith(".tiktoken"):
        return _tiktoken_tokenizer(p)
    return AutoTokenizer.from_pretrained(str(p))


def _dtype(spec: ModelSpec) -> torch.dtype:
    return torch.float32 if spec.dtype == "auto" else getattr(torch, spec.dtype)


def forward_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype | None:
    """The dtype the forward passes autocast to (None: none), as mixed-precision training does.

    Weights and optimizer state stay in `spec.dtype` (float32 by default) and only the forward's matrix
    products run in bfloat16. bfloat16 weights would keep 8 significant bits: an AdamW step of about lr
    (2e-5 here) on a weight of 0.05 is below half a unit in its last place (0.05 · 2⁻⁹ ≈ 1e-4) and is
    rounded away, so a policy with bfloat16 weights barely moves at RL learning rates.
    """
    if spec.autocast == "off" or (spec.autocast == "auto" and device.type != "cuda"):
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        if spec.autocast == "bfloat16":
            raise TrainerError("model.autocast='bfloat16': this GPU does not support bfloat16; set it to off")
        return None
    return torch.bfloat16


def load_policy(spec: ModelSpec, device: str | torch.device = "cpu", seed: int = 0):
    """(model, tokenizer) on `device`; the model in train mode, the tokenizer padded on the left."""
    from transformers import AutoConfig, AutoModelForCausalLM
    device = torch.device(device)
    dtype = _dtype(spec)
    if spec.source == "config":
        tokenizer = _load_tokenizer(spec.tokenizer)
        arch = dict(spec.architecture)
        model_type = arch.pop("model_type")
        arch.setdefault("vocab_size", len(tokenizer))
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            arch.setdefault(key, tokenizer.eos_token_id)
        try:
            config = AutoConfig.for_model(model_type, **arch)
        except (ValueError, TypeError) as exc:
            raise TrainerError(f"model.architecture is not a valid {model_type!r} config: {exc}") from exc
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        folder = gguf_folder(spec.path) if spec.source == "gguf" else _existing(spec.path, "model folder")
        tokenizer = _load_tokenizer(spec.tokenizer or str(folder))
        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        except (OSError, ValueError) as exc:
            raise TrainerError(f"cannot load a causal LM from {folder}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    ensure_template(tokenizer, spec.chat_template)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    # Dropout off (as TRL's disable_dropout): the PPO ratio must compare the same function of θ
    # in rollout and update, and a random mask would make π_θ/π_old noisy even at θ = θ_old.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if spec.gradient_checkpointing:
        model.activation_checkpointing_enable()
        model.config.use_cache = False
    return model.to(device).train(), tokenizer

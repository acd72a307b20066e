"""One policy's trainer configuration (YAML → pydantic), each field documented once.

    run_id, policy      which run and which policy this trainer is
    model               ModelSpec: hf folder, gguf file, or built from a config
    task                TaskSpec: the verifiable task family (train split; eval split held out)
    rollout             group size G, prompts per step, sampling
    loss                GRPO / GSPO / Dr.GRPO / DAPO knobs (docs/algorithms.md)
    sharing             the sharing mode (none, prp, xgrpo, sgt, hacpo), its peers and their wait
    warm_start          an optional short supervised pass before RL (a policy built from scratch)
    eval, checkpoint, metrics, exchange, scheduler
    tracking            the experiment trackers every metric also goes to (mrl_trainer.tracking)

`load_config(path)` reads a YAML file; relative paths in it are relative to that file. Its connection settings
(the services' targets and tokens) follow mrl.precedence: `--set` > the environment (MRL_TOKEN, MRL_*_TARGET) > the
file > the default, and `config.source(key)` names where each came from, for the errors.
"""
import os
import pathlib
from typing import Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from mrl.assets import expand
from mrl.errors import InvalidArgument
from mrl.experience import validate_name
from mrl.precedence import ENVIRONMENT, resolve
from mrl_trainer.errors import TrainerError
from mrl.algorithms import Aggregation, ImportanceLevel
from mrl_trainer.policy import ModelSpec
from mrl_trainer.section import Section
from mrl_trainer.sft import WarmStartConfig
from mrl_trainer.sharing import SharingConfig, mode_sections, sharing_config
from mrl.tasks import TaskSpec
from mrl_trainer.tracking import TrackingConfig

__all__ = ["TrainerConfig", "RolloutConfig", "LossConfig", "EvalConfig", "CheckpointConfig", "MetricsConfig",
           "ExchangeConfig", "SchedulerConfig", "TrackingConfig", "load_config", "apply_overrides"]


class RolloutConfig(Section):
    engine: Literal["hf", "sglang"] = Field("hf", description="hf: transformers generate (CPU/GPU); "
                                                              "sglang: sglang.Engine (GPU, `pip install mrl-trainer[sglang]`).")
    group_size: int = Field(8, ge=2, description="G: samples per prompt; advantages are relative within a group.")
    prompts_per_step: int = Field(4, ge=1, description="Prompts per optimizer step (batch = prompts × G).")
    max_new_tokens: int = Field(64, ge=1, le=32768)
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; log-probs use logits / temperature.")
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch: int = Field(64, ge=1, description="Most sequences generated at once (memory bound).")


class LossConfig(Section):
    level: ImportanceLevel = Field("token", description="token: GRPO's per-token ratio; sequence: GSPO.")
    aggregation: Aggregation = Field("token-mean", description="token-mean (DAPO), seq-mean-token-mean (GRPO), "
                                                               "seq-mean-token-sum-norm (Dr.GRPO).")
    scale_rewards: bool = Field(True, description="Divide advantages by the group's std (False: Dr.GRPO).")
    eps_low: float = Field(0.2, gt=0, lt=1, description="Clip 1 - eps_low (GSPO: 3e-4).")
    eps_high: float = Field(0.28, gt=0, description="Clip 1 + eps_high; > eps_low is DAPO's clip-higher "
                                                    "(0.28 in DAPO; GSPO: 4e-4).")
    beta: float = Field(0.0, ge=0, description="Weight of the k3 KL to the initial (reference) policy; "
                                               "0 keeps no reference model.")
    lr: float = Field(1e-6, ge=0, description="AdamW's learning rate; 0 keeps the weights as they are (every "
                                              "step computes its update and changes nothing: a benchmark's fixed "
                                              "work per step).")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    updates_per_step: int = Field(1, ge=1, description="μ: optimizer updates on each batch (1: on-policy, "
                                                       "π_old = π_θ detached, no extra forward).")
    mini_batches: int = Field(1, ge=1, description="k: optimizer steps per pass over a step's batch (its prompts "
                                                   "split into k mini-batches; μ·k steps in all, counted by HACPO's "
                                                   "stepwise clip). 1: one full-batch step per pass.")
    micro_batch_tokens: int = Field(8192, ge=1, description="Memory budget: most (padded) tokens in one forward/"
                                                            "backward; the batch is split, gradients accumulated.")


class EvalConfig(Section):
    every: int = Field(10, ge=0, description="Evaluate every this many steps (0: never), and at the start and end.")
    problems: int = Field(64, ge=1, description="Held-out problems (the task's eval split), greedy decoding.")


class CheckpointConfig(Section):
    dir: str = Field(".mrl/checkpoints/policy", description="Where step-N/ folders and `latest` are written.")
    every: int = Field(10, ge=1, description="Checkpoint every this many steps (and at the end).")
    keep: int = Field(2, ge=1, description="How many checkpoints are kept.")
    resume: bool = Field(True, description="Resume from the latest checkpoint in `dir` when there is one.")


class MetricsConfig(Section):
    jsonl: str | None = Field(None, description="Per-step metrics file (default: <checkpoint.dir>/metrics.jsonl).")
    prometheus_port: int | None = Field(None, ge=0, le=65535, description="Serve /metrics on this port (0: any).")
    progress: bool = Field(True, description="Show a progress bar.")


class ExchangeConfig(Section):
    target: str = Field("127.0.0.1:50051", description="host:port of the exchange (SEE); the default is where "
                                                      "`mrl up examples/local.yaml` serves it.")
    token: str | None = Field(None, description="Bearer token (or env MRL_TOKEN).")
    tokenizer_id: str = Field(description="THL name of this policy's tokenizer (e.g. smollm2, gpt2).")
    max_unpublished_steps: int = Field(10, ge=0, description="Stop the run after this many consecutive steps whose "
                                       "experience the exchange did not take (it waits in the outbox; each such "
                                       "step logs a warning and counts in `unpublished_steps`), rather than train "
                                       "solo unseen; 0: never stop.")


class SchedulerConfig(Section):
    target: str = Field(description="host:port of the lease scheduler (MWRA); rollout and update each run in a lease.")
    token: str | None = Field(None, description="Bearer token (or env MRL_TOKEN).")
    devices: int = Field(1, ge=1, description="Devices per lease (all at once: gang). Under torchrun: the "
                                              "number of ranks, whatever this says.")
    ttl_s: float = Field(30.0, gt=0, le=3600, description="Lease TTL; renewed every TTL/3 while held.")
    step_cost: float = Field(0.0, ge=0, description="Declared cost per step: the fair-share weight unless the "
                                                   "scheduler's MRL_WEIGHTS names this policy.")
    device_ids: list[str] | None = Field(None, min_length=1, description="Pin every lease to these devices (ids as "
                                         "the scheduler's inventory lists them, e.g. node-0/gpu-2), one per device "
                                         "of the lease: in a single process `devices` of them; under torchrun one "
                                         "per rank, in rank order, rank r's naming the GPU that rank runs on "
                                         "(cuda:LOCAL_RANK). None: any free devices.")


class TrainerConfig(Section):
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)
    run_id: str = Field("default", description="The run all co-trained policies share.")
    policy: str = Field(description="This policy's id (names its streams and consumer group).")
    seed: int = Field(0, description="Seeds weights built from a config, sampling and the data order.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available.")
    steps: int = Field(100, ge=1, description="Optimizer steps (rollout → reward → publish → update) to run.")
    system_prompt: str | None = Field(None, description="A system message before each question.")
    model: ModelSpec
    task: TaskSpec
    rollout: RolloutConfig = RolloutConfig()
    loss: LossConfig = LossConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracking: TrackingConfig = TrackingConfig()
    exchange: ExchangeConfig | None = Field(None, description="Publish experience to this exchange (None: solo).")
    sharing: SharingConfig = Field(default_factory=sharing_config)
    warm_start: WarmStartConfig | None = Field(None, description="Supervised warm start before RL (cached).")
    scheduler: SchedulerConfig | None = Field(None, description="Lease devices from this scheduler (None: don't).")

    @field_validator("run_id", "policy")
    @classmethod
    def _name(cls, v: str, info) -> str:
        try:
            return validate_name(info.field_name, v)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _engine_device(self):
        if self.rollout.engine == "sglang" and self.device == "cpu":
            raise ValueError("rollout.engine='sglang' needs a GPU: set device to auto/cuda or use engine 'hf'")
        if self.sharing.mode != "none" and self.exchange is None:
            raise ValueError(f"sharing.mode {self.sharing.mode!r} takes peers' experience from the exchange: "
                             "configure `exchange` (target, tokenizer_id) or use sharing.mode 'none'")
        if self.policy in self.sharing.peers:
            raise ValueError(f"sharing.peers lists this policy itself ({self.policy!r}); list the other policies")
        return self

    def source(self, key: str) -> str:
        """Where a connection setting (a key of mrl.precedence.ENVIRONMENT) came from; THL's token, when unset, is
        the exchange's."""
        if key == "sharing.align.token" and self.sharing.align is not None and self.sharing.align.token is None:
            key = "exchange.token"
        return self._sources.get(key, "default")


def _resolve(config: dict, base: pathlib.Path) -> dict:
    """Paths in a config file are relative to the file."""
    def rel(value):
        value = expand(value)
        return value if pathlib.Path(value).is_absolute() else os.path.normpath(base / value)
    for section, keys in {"model": ("path", "tokenizer"), "task": ("path",), "checkpoint": ("dir",),
                          "metrics": ("jsonl",), "tracking": ("dir",)}.items():
        for key in keys:
            if isinstance(config.get(section), dict) and config[section].get(key):
                config[section][key] = rel(config[section][key])
    return config


def load_config(path: str | pathlib.Path, overrides: dict | None = None) -> TrainerConfig:
    path = pathlib.Path(path)
    if not path.is_file():
        raise TrainerError(f"config file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise TrainerError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise TrainerError(f"{path}: expected a mapping of settings, got {type(raw).__name__}")
    file = {key: _get(raw, key) for key in ENVIRONMENT}
    raw = apply_overrides(_resolve(raw, path.parent), overrides)
    sources = _apply_environment(raw, file, overrides or {}, path)
    try:
        config = TrainerConfig.model_validate(raw)
    except ValidationError as exc:
        raise TrainerError(f"{path}: invalid trainer config:\n{exc}") from exc
    config._sources = sources
    return config


def _get(raw: dict, dotted: str):
    """raw's value at a dotted key; None where a section on the way is absent."""
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _apply_environment(raw: dict, file: dict, overrides: dict, path: pathlib.Path) -> dict[str, str]:
    """The environment's layer of mrl.precedence over the file, under the overrides: each connection setting of a
    section the config has (the file's or the overrides') is the override's value, else the environment's (set in
    `raw`), else the file's; returns where each came from."""
    sources = {}
    for key, variable in ENVIRONMENT.items():
        section, _, leaf = key.rpartition(".")
        node = _get(raw, section)
        if not isinstance(node, dict):
            continue
        given = overrides[key] if key in overrides else next(
            (_get(value, key[len(k) + 1:]) for k, value in overrides.items()
             if key.startswith(k + ".") and isinstance(value, dict)), None)
        setting = resolve(given, f"--set {key}", variable, file[key], f"{key} in {path}")
        if setting.source == variable:
            node[leaf] = setting.value
        sources[key] = setting.source
    return sources


def apply_overrides(raw: dict, overrides: dict | None) -> dict:
    """`raw` with each dotted override set in place (`sharing.guard.enabled: False` → raw["sharing"]["guard"]
    ["enabled"]), sections made where absent or null; TrainerError where a path runs through a value. An override
    of sharing.mode then drops the other modes' knobs sections, the file's and the overrides' (sharing.mode_sections):
    a compared arm's mode takes the knobs of its own mode only."""
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = raw
        for depth, p in enumerate(parents):
            if node.get(p) is None:          # absent, or null in the file (`scheduler: null`): a section to fill
                node[p] = {}
            elif not isinstance(node[p], dict):
                raise TrainerError(f"override {dotted!r}: {'.'.join(parents[:depth + 1])!r} is not a section "
                                   f"(it holds {node[p]!r})")
            node = node[p]
        node[leaf] = value
    if "sharing.mode" in (overrides or {}) and isinstance(raw.get("sharing"), dict):
        raw["sharing"] = mode_sections(raw["sharing"], overrides["sharing.mode"])
    return raw

"""The sharing-mode registry (mrl_trainer.sharing.MODES): every registered mode describes itself (name, title,
kinds, Config, stats) and appears everywhere modes are listed: the `sharing:` config union, the statistics'
labels, the run report's figures, `mrl experiment compare`, and docs/algorithms.md. Each statistic a mode (or the
trainer's coordination with peers) logs on a hand-made step is one it declares, and each it declares is logged."""
import pathlib
import re
from types import SimpleNamespace

import pytest
import torch
import yaml
from pydantic import BaseModel, ValidationError

from helpers import tiny_config
from mrl.experience import KINDS
from mrl_trainer.config import LossConfig, TrainerConfig
from mrl_trainer.experience import StepBatch
from mrl_trainer.peers import Arrived, Retokenizer, _Entry, to_peer_batch
from mrl_trainer.rationalize import rationalize
from mrl_trainer.rollout.base import Sample
from mrl_trainer.sharing import (MODES, SHARING_MODES, STAT_SOURCES, Coordination, PeerBatch, PeerSample, Verifier,
                                 sharing_config, stat_labels)
from mrl.tasks import Problem

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = [m.name for m in MODES]
modes = pytest.mark.parametrize("mode", MODES, ids=NAMES)


# --- hand-made step: one prompt whose own group failed, one it half solved; peers sent every kind -------------
def step_batch() -> StepBatch:
    rewards = [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    problems = [Problem(prompt_id=f"toy:train:0:{p}", question=f"q{p}", answer=f"a{p}") for p in range(2)]
    samples = [[Sample(prompt_ids=[1, 2], ids=[10, 11, 12], logprobs=[-1.0] * 3, text=f"y{p}.{i}", truncated=False)
                for i in range(3)] for p in range(2)]
    return StepBatch(step=0, problems=problems, samples=samples, rewards=rewards, answers=[[None] * 3] * 2)


def peer_sample(p: int, text: str, reward: float, n_tokens: int = 3) -> PeerSample:
    return PeerSample(producer="j", prompt_index=p, ids=list(range(20, 20 + n_tokens)), text=text, reward=reward,
                      behaviour_logp=-1.5 * n_tokens, chunks=n_tokens)


def peer_batch() -> PeerBatch:
    """Right and wrong answers (one falsely claimed right), successes (one that fails re-verification)."""
    return PeerBatch(
        rollouts={0: [peer_sample(0, "a0", 1.0), peer_sample(0, "no", 1.0)], 1: [peer_sample(1, "no", 0.0, 2)]},
        successes={0: [peer_sample(0, "a0", 1.0), peer_sample(0, "wrong", 1.0)]},
        group_rewards={0: [1.0, 0.0, 0.0], 1: [0.0, 0.0, 0.0]},
        capability={"j": 0.4})


def emitted_stats(mode) -> set[str]:
    """The statistic keys a mode's plan() and, over its extras, summarize() log on the hand-made step."""
    batch = step_batch()
    m = mode(sharing_config(mode=mode.name), LossConfig())
    verify = Verifier(batch, lambda problem, text: float(text == problem.answer))
    plan = m.plan(batch, peer_batch(), capability=0.6, verify=verify)
    keys = set(plan.stats)
    if plan.extras:
        width = max(len(e.ids) for e in plan.extras)
        logp = -torch.rand(len(plan.extras), width, generator=torch.Generator().manual_seed(0))
        mask = torch.tensor([[1.0] * len(e.ids) + [0.0] * (width - len(e.ids)) for e in plan.extras])
        _, per_sequence = m.extra_loss(logp, mask, plan.extras, update=0, max_tokens=width, totals=plan.extra_totals)
        keys |= set(m.summarize(per_sequence))
    return keys


# --- each mode describes itself ------------------------------------------------------------------------------
@modes
def test_mode_declares_itself(mode):
    for attribute in ("name", "title", "kinds", "Config", "stats"):
        assert attribute in vars(mode), f"{mode.__name__} must declare {attribute} in its own class"
    assert re.fullmatch(r"[a-z][a-z0-9_]*", mode.name) and mode.title.lower().startswith(mode.name)
    assert set(mode.kinds) <= set(KINDS)
    assert issubclass(mode.Config, BaseModel) and mode.Config.model_config.get("extra") == "forbid"
    mode.Config()                                                   # every knob has a default
    assert all(isinstance(label, str) and label for label in mode.stats.values())
    drawn = {key for keys in mode.figures.values() for key in keys}
    assert drawn | mode.cumulative | set(mode.summary) <= set(mode.stats)


def test_names_are_unique_and_none_is_the_baseline():
    assert len(set(NAMES)) == len(NAMES) and list(SHARING_MODES) == NAMES and "none" in NAMES
    assert SHARING_MODES["none"].kinds == ()


@modes
def test_logged_stats_are_the_declared_ones(mode):
    assert emitted_stats(mode) == set(mode.stats)


def test_coordination_stats_are_the_declared_ones():
    """peers.to_peer_batch's statistics, with one rollout of a foreign tokenizer retokenized by a stand-in THL, and
    rationalize's (SGT's rescues in the receiver's words)."""
    rollout = SimpleNamespace(tokenizer_id="other", token_ids=[5, 6], logprobs=[-1.0, -1.0], response_text="a0",
                              reward=1.0)
    aligned = SimpleNamespace(target_ids=[7], lossless=True,
                              residual=SimpleNamespace(chunks=1, one_to_one_share=1.0,
                                                       mean_target_tokens_per_chunk=1.0))
    thl = SimpleNamespace(align_batch=lambda jobs: [aligned for _ in jobs])
    arrived = Arrived(entries={"p0": {"j": _Entry(version=0, group_rewards=[1.0], rollouts=[rollout])}},
                      capability={}, waited_s=0.1, complete=1.0)
    _, stats = to_peer_batch(arrived, ["p0"], Retokenizer("own", thl))
    _, rationalized = rationalize(step_batch(), PeerBatch(), [], verify=None, sample=None, n=1)
    assert set(stats) | set(rationalized) | {"peer_guided", "peer_recalled"} == set(Coordination.stats)  # those two: Trainer.step


# --- everywhere modes are listed ----------------------------------------------------------------------------
@modes
def test_config_union_accepts_the_mode(mode):
    config = sharing_config(mode=mode.name)
    assert config.mode == mode.name
    sections = {m.name for m in MODES if m.Config.model_fields}
    assert sections & set(type(config).model_fields) == ({mode.name} & sections)   # its own knobs only


def test_config_union_refuses_an_unknown_mode_and_defaults_to_none(tmp_path):
    with pytest.raises(ValidationError) as error:
        sharing_config(mode="grpo")
    assert ", ".join(NAMES) in str(error.value)
    assert sharing_config().mode == sharing_config(peers=["b"]).mode == "none"
    assert TrainerConfig.model_validate(tiny_config(tmp_path)).sharing.mode == "none"     # no `sharing:` section


def test_stat_labels_cover_every_source_with_one_label_per_key():
    labels = stat_labels()
    for source in STAT_SOURCES:
        for key, label in source.stats.items():
            assert labels[key] == label, f"{key} is labelled differently by two sources"


def test_report_draws_every_declared_figure():
    from mrl_launcher.figures import PANELS
    for source in STAT_SOURCES:
        assert set(source.figures) <= set(PANELS), f"{source.__name__} names a figure the report does not draw"


def test_compare_lists_every_mode(capsys, tmp_path):
    from mrl.cli import build_parser
    from mrl_launcher.errors import LauncherError
    from mrl_launcher.experiment import run_compare
    with pytest.raises(SystemExit):
        build_parser().parse_args(["experiment", "compare", "--help"])
    assert ", ".join(NAMES) in " ".join(capsys.readouterr().out.split())
    topology = tmp_path / "topology.yaml"
    topology.write_text("trainers: []\n")
    with pytest.raises(LauncherError, match=re.escape(", ".join(NAMES))):
        run_compare(topology, ["none", "bogus"], None, tmp_path / "out")


def test_docs_describe_every_mode():
    page = ROOT / "docs" / "algorithms.md"
    assert page.is_file(), "docs/algorithms.md describes the sharing modes"
    text = page.read_text(encoding="utf-8").lower()
    missing = [name for name in NAMES if name not in text]
    assert not missing, f"docs/algorithms.md does not mention {missing}"


def test_a_peer_response_that_thl_ends_with_a_mapped_end_of_sequence_ends_with_this_policys_own():
    """GPT-2's <|endoftext|> becomes SmolLM2's token of the same name, one SmolLM2 also stops at, but not the
    <|im_end|> its own answers end with; trained on as written (SGT's rescue), such ends pulled SmolLM2 off its
    form (docs/results/compare-addition-gpu-2026-11-27.md). The receiver ends a peer's response as it ends its own."""
    from mrl_research.lab.exchange import InProcessAlign
    from mrl_tokenizer_align.catalog import cached_paths
    from mrl_tokenizer_align.vocab import load_vocab
    paths = cached_paths()
    vocabs = {t: load_vocab(t, paths[t]) for t in ("gpt2", "smollm2")}
    gpt2, smollm2 = vocabs["gpt2"], vocabs["smollm2"]
    answer = [int(i) for i in gpt2.encode("Answer: 42")]
    thl = InProcessAlign(vocabs)
    as_mapped, _, _ = Retokenizer("smollm2", thl)([("gpt2", answer + [gpt2.eos_id])])
    assert as_mapped[0][-1] == smollm2.specials["<|endoftext|>"] != smollm2.eos_id
    ids, chunks, _ = Retokenizer("smollm2", thl, end_id=smollm2.eos_id)(
        [("gpt2", answer + [gpt2.eos_id]), ("gpt2", answer), ("smollm2", [5, smollm2.specials["<|endoftext|>"]])])
    assert ids[0] == as_mapped[0][:-1] + [smollm2.eos_id]
    assert ids[1][-1] != smollm2.eos_id                  # a response cut before its end gets none
    assert ids[2] == [5, smollm2.specials["<|endoftext|>"]]   # a peer with this policy's tokenizer: as it wrote it


def test_a_modes_config_takes_its_own_knobs_only_and_says_which_section_is_wrong():
    from pydantic import ValidationError
    assert sharing_config(mode="sgt", sgt={"lam": 0.2}).sgt.lam == 0.2
    with pytest.raises(ValidationError, match="sharing.sgt sets the knobs of mode 'sgt', but sharing.mode is 'xgrpo'"):
        sharing_config(mode="xgrpo", sgt={"lam": 0.2})
    assert not hasattr(sharing_config(mode="xgrpo"), "sgt")


def test_an_override_of_the_mode_drops_the_other_modes_knobs(tmp_path):
    """A compared arm changes a config's mode: the knobs of the mode it had no longer apply."""
    from mrl_trainer.config import load_config
    base = load_config(pathlib.Path(__file__).parents[2] / "examples/policy-a.yaml").model_dump(mode="json")
    base["sharing"] = {"mode": "sgt", "sgt": {"lam": 0.2}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(base))
    assert load_config(path).sharing.sgt.lam == 0.2
    switched = load_config(path, {"sharing.mode": "xgrpo"}).sharing
    assert switched.mode == "xgrpo" and not hasattr(switched, "sgt")

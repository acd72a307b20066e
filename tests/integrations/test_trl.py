"""mrl.integrations.trl: TRL's GRPOTrainer in a mutual run, over the real exchange, THL and Redis, with tiny real
models built from the shipped tokenizers (no mocks)."""
import math
import threading

import pytest
import torch

from mrl.assets import tokenizer_cache_dir
from mrl.errors import InvalidArgument
from mrl.exchange_client import ExchangeClient
from mrl.align_client import AlignClient

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402

from mrl.integrations.trl import (Mutual, MutualGRPOTrainer, pooled_advantages, rescue_nll, task_dataset,  # noqa: E402
                                  task_reward)
from mrl_research.bench.trl import TASK, grpo_config, peer_experiences, tiny_policy  # noqa: E402
from mrl.tasks import make_task  # noqa: E402

P, G, T = 2, 3, 6
SMOLLM2_TOKENIZER = str(tokenizer_cache_dir() / "smollm2-tokenizer")


def _train(tmp_path, mutual=None, steps=2, reward=None):
    """Train the tiny GPT-2 policy `steps` steps with plain TRL (mutual None) or the integration; returns
    (loss per step, final weights, trainer, reward function)."""
    task = make_task(TASK)
    model, tokenizer = tiny_policy(seed=3)
    torch.manual_seed(0)
    reward = reward or task_reward(task, steps * P)
    kwargs = dict(model=model, reward_funcs=reward, args=grpo_config(str(tmp_path), P=P, G=G, T=T, steps=steps),
                  train_dataset=task_dataset(task, tokenizer, steps * P), processing_class=tokenizer)
    trainer = GRPOTrainer(**kwargs) if mutual is None else MutualGRPOTrainer(**kwargs, mutual=mutual)
    try:
        trainer.train()
    finally:
        if mutual is not None:
            trainer.close()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, trainer, reward


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("sharing", ["xgrpo", "sgt"])
def test_with_no_peer_publishing_the_trl_trainer_is_unchanged(tmp_path, exchange, run_id, sharing):
    """Same seed, plain GRPOTrainer vs the integration whose peer never publishes: the same losses and weights.
    The reward (text length mod 10, / 9) varies within groups, so every step has a loss and a gradient."""
    from mrl.experience import kind_name

    def shaped(completions, **_):
        return [(len(text) % 10) / 9 for text in completions]
    plain_losses, plain, _, _ = _train(tmp_path / "plain", reward=shaped)
    with ExchangeClient(exchange.target) as client:
        losses, weights, trainer, _ = _train(tmp_path / "mrl", Mutual(
            exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2", sharing=sharing, peers=["ghost"],
            peer_wait_s=0.2), reward=shaped)
        published = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id, producer="trl-gpt2")}
    assert len(losses) == 2 and any(loss != 0 for loss in losses)
    assert losses == plain_losses and _same(weights, plain)
    assert [r["peers_complete"] for r in trainer.mutual_log] == [0.0, 0.0]
    # it published its experience every step: P group_stats, P·G rollouts, its successes, one policy_stats
    assert published["group_stats"] == 2 * P and published["rollout"] == 2 * P * G and published["policy_stats"] == 2
    assert sum(r["published"] for r in trainer.mutual_log) == sum(published.values())


@pytest.mark.slow
def test_published_behaviour_logprobs_are_the_sampling_weights_log_probs(tmp_path, exchange, run_id):
    """On TRL's on-policy path (no old_per_token_logps) the rollouts' log-probs come from TRL's loss forward, here
    over two micro-batches of the shuffled generation batch: token by token they equal log π of the weights that
    generated them (a no-grad forward of the initial model, TRL's inputs), and they are published by step's end."""
    import copy
    import dataclasses
    from mrl.experience import kind_name
    from helpers import Collector
    task = make_task(TASK)
    model, tokenizer = tiny_policy(seed=3)
    initial = copy.deepcopy(model)
    args = dataclasses.replace(grpo_config(str(tmp_path), P=P, G=G, T=T, steps=1), per_device_train_batch_size=G,
                               gradient_accumulation_steps=P, generation_batch_size=None, steps_per_generation=None)

    class Recording(MutualGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            assert "old_per_token_logps" not in out and out["mrl_row"].tolist() == list(range(P * G))
            self.generated = {k: out[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                          "completion_mask")}
            return out

    with ExchangeClient(exchange.target) as client:
        trainer = Recording(model=model, reward_funcs=task_reward(task, P), args=args, processing_class=tokenizer,
                            train_dataset=task_dataset(task, tokenizer, P), mutual=Mutual(
                                exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2"))
        torch.manual_seed(0)
        trainer.train()
        trainer.close()
        published = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id, producer="trl-gpt2")}
        reader = client.subscribe(run_id, "reader", kinds=["rollout"], producers=["trl-gpt2"], start="earliest")
        rollouts = [d.experience.rollout for d in Collector(reader).take(P * G)]
        reader.close()
    assert args.steps_per_generation == P and published["rollout"] == P * G
    assert trainer.mutual_log[0]["published"] == sum(published.values())
    g = trainer.generated
    completion, mask = g["completion_ids"], g["completion_mask"].bool()
    with torch.no_grad():
        logits = initial(input_ids=torch.cat([g["prompt_ids"], completion], 1),
                         attention_mask=torch.cat([g["prompt_mask"], g["completion_mask"]], 1)).logits
    expected = logits[:, -completion.size(1) - 1:-1].log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    for r in rollouts:
        row = int(r.group_id.rsplit(".", 1)[1]) * G + r.sample_index
        assert list(r.token_ids) == completion[row][mask[row]].tolist()
        assert torch.allclose(torch.tensor(list(r.logprobs)), expected[row][mask[row]], atol=1e-5)


@pytest.mark.slow
def test_sgt_rescues_are_reverified_by_the_trl_reward_function_and_a_poisoned_peer_changes_nothing(
        tmp_path, exchange, align, run_id):
    """Peers in SmolLM2's tokens (THL retokenizes them to GPT-2's): an honest one publishes the right answer of
    every prompt as a success, a poisoned one a wrong answer. The tiny policy fails every prompt, so each is
    gated for rescue; only the re-verified honest successes join the NLL term."""
    from transformers import AutoTokenizer
    task = make_task(TASK)
    smollm2 = AutoTokenizer.from_pretrained(SMOLLM2_TOKENIZER)
    plain_losses, plain, _, _ = _train(tmp_path / "plain", steps=1)

    def run(name, peers):
        rid = f"{run_id}-{name}"
        with ExchangeClient(exchange.target) as client, AlignClient(align.target) as thl:
            for peer in peers:
                wrong = peer == "poison"
                client.publish(peer_experiences(rid, peer, task, smollm2, "smollm2", 1, P, rewards=[1.0],
                                                answer_of=lambda p: int(p.answer) + 1 if wrong else p.answer))
            return _train(tmp_path / name, Mutual(
                exchange=client, run_id=rid, policy="trl-gpt2", tokenizer_id="gpt2", sharing="sgt", peers=peers,
                peer_wait_s=20, align=thl), steps=1)

    losses, weights, trainer, reward = run("poison", ["poison"])
    (record,) = trainer.mutual_log
    assert record["peers_complete"] == 1.0 and record["sgt_rejected"] == P and record["sgt_accepted"] == 0
    assert record["sgt_rescued"] == 0 and losses == plain_losses and _same(weights, plain)
    assert sum(text.startswith("Answer: ") for _, text in reward.calls) == P          # each claim was re-verified

    losses, weights, trainer, reward = run("both", ["honest", "poison"])
    (record,) = trainer.mutual_log
    assert record["sgt_accepted"] == P and record["sgt_rejected"] == P and record["sgt_rescued"] == P
    assert record["peer_experiences_used"] == P and 0 < record["thl_one_to_one"] <= 1      # THL in the loop
    problems = task.batch(0, P)
    verified = {(pid, text) for pid, text in reward.calls if text.startswith("Answer: ")}
    assert {(p.prompt_id, f"Answer: {p.answer}") for p in problems} <= verified        # by its own reward function
    assert not _same(weights, plain) and losses != plain_losses
    nll = [r["mrl/sgt_nll"] for r in trainer.state.log_history if "mrl/sgt_nll" in r]
    assert nll and nll[0] > 0


@pytest.mark.slow
def test_a_trl_policy_and_an_mrl_trainer_of_another_tokenizer_co_train(tmp_path, exchange, align, run_id):
    """TRL (GPT-2 tokens, XGRPO) and the mrl trainer (Llama over SmolLM2's tokens, PRP) train 2 steps side by side;
    each takes the other's experience of the same prompt ids: TRL pools the mrl trainer's group rewards, the mrl
    trainer pools TRL's rollouts (with their behaviour log-probs) retokenized by THL."""
    from mrl_trainer.config import TrainerConfig
    from mrl_trainer.metrics import read_metrics
    from mrl_trainer.trainer import build_trainer
    from helpers import tiny_config
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256}
    config = TrainerConfig.model_validate(tiny_config(
        tmp_path / "llama", policy="llama-tiny", run_id=run_id, steps=2, task=TASK, **{
            "model.architecture": llama, "model.tokenizer": SMOLLM2_TOKENIZER, "rollout.group_size": G,
            "rollout.prompts_per_step": P, "exchange": {"target": exchange.target, "tokenizer_id": "smollm2"},
            "sharing": {"mode": "prp", "peers": ["trl-gpt2"], "peer_wait_s": 60, "align": {"target": align.target}}}))
    errors = []
    with ExchangeClient(exchange.target) as client, ExchangeClient(exchange.target) as mrl_client:
        mrl = build_trainer(config, exchange=mrl_client)

        def run_mrl():
            try:
                mrl.run()
            except Exception as exc:      # noqa: BLE001 - reported below
                errors.append(exc)
        thread = threading.Thread(target=run_mrl)
        thread.start()
        try:
            _, _, trainer, _ = _train(tmp_path / "trl", Mutual(
                exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2", sharing="xgrpo",
                peers=["llama-tiny"], peer_wait_s=60))
        finally:
            thread.join(120)
            mrl.close()
    assert not errors, errors
    assert [r["peers_complete"] for r in trainer.mutual_log] == [1.0, 1.0]
    assert [r["xgrpo_pooled"] for r in trainer.mutual_log] == [2 * G, 2 * G]      # own G + the mrl trainer's G
    assert all(r["peer_experiences_used"] == P for r in trainer.mutual_log)
    train = [r for r in read_metrics(tmp_path / "llama" / "ckpt" / "metrics.jsonl") if r.get("kind", "train") == "train"]
    assert [r["step"] for r in train] == [0, 1]
    assert all(r["peers_complete"] == 1.0 and r["peer_samples"] == P * G for r in train)
    assert all(0 < r["thl_one_to_one"] <= 1 for r in train)


def test_pooled_advantages_match_grpo_without_peers_and_pool_with_them():
    own = torch.tensor([1.0, 0.0, 0.0])
    grpo = (own - own.mean()) / (own.std() + 1e-4)
    assert torch.allclose(pooled_advantages(own, [], scale=True)[0], grpo)
    a, moved = pooled_advantages(own, [1.0, 1.0, 1.0], scale=False)
    assert torch.allclose(a, own - 4 / 6) and not moved
    a, moved = pooled_advantages(torch.zeros(3), [1.0], scale=True, uniform_groups="pooled")   # all failed, a
    assert bool((a < 0).all()) and moved                                                        # peer succeeded
    a, moved = pooled_advantages(torch.zeros(3), [1.0], scale=True)                             # the default
    assert bool((a == 0).all()) and moved
    a, _ = pooled_advantages(torch.tensor([1.0, math.nan, 0.0]), [0.0], scale=False)  # unscorable: out, A = 0
    assert a.tolist() == pytest.approx([2 / 3, 0.0, -1 / 3])
    assert bool((pooled_advantages(torch.ones(3), [1.0], scale=True)[0] == 0).all())


def test_rescue_nll_is_lambda_times_the_mean_response_nll():
    logp = torch.tensor([[-1.0, -3.0, 0.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert rescue_nll(logp, mask, 0.1, 2).item() == pytest.approx(0.1 * (2.0 + 2.0) / 2)
    assert rescue_nll(logp, mask, 0.1, 4).item() == pytest.approx(0.1 * (2.0 + 2.0) / 4)


@pytest.mark.parametrize("bad, message", [
    ({"sharing": "hacpo"}, "sharing 'hacpo' is not one of none, xgrpo, sgt"),
    ({"peers": ["trl-gpt2"]}, "lists this policy itself"),
    ({"policy": "no spaces"}, "is not a valid name"),
    ({"lam": -1}, "lam is -1; it must be >= 0"),
    ({"tokenizer_id": ""}, "tokenizer_id is empty"),
])
def test_bad_mutual_settings_are_refused(bad, message):
    with pytest.raises(InvalidArgument, match=message):
        Mutual(**{"exchange": None, "run_id": "r", "policy": "trl-gpt2", "tokenizer_id": "gpt2", **bad})


def test_a_mutual_checks_its_connection_before_any_model_is_loaded(exchange, run_id, tmp_path):
    """Making a Mutual is one round trip (mrl.connection): an address that is the REST port, or a closed one, fails
    at once saying so; no model or dataset is needed to find out."""
    from mrl import errors
    rest = f"127.0.0.1:{exchange.server.admin_port}"
    with ExchangeClient(rest) as client, pytest.raises(errors.Unavailable, match=f"exchange at {rest}.*REST port"):
        Mutual(exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2")
    with ExchangeClient(exchange.target) as client, AlignClient(rest) as thl, \
            pytest.raises(errors.Unavailable, match=f"tokenizer alignment service at {rest}.*REST port"):
        Mutual(exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2", align=thl)


@pytest.mark.slow
def test_an_exchange_lost_mid_run_is_counted_each_step_and_stops_training_at_the_limit(tmp_path, start_exchange,
                                                                                       run_id, caplog):
    """The exchange goes away after the check: each step it does not take counts (mrl/unpublished_steps) and warns,
    and at max_unpublished_steps training stops with Unavailable instead of going on as plain TRL."""
    from mrl import errors
    from mrl.exchange_client import Backoff
    server = start_exchange()
    with ExchangeClient(server.target, backoff=Backoff(attempts=1)) as client:
        mutual = Mutual(exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2",
                        max_unpublished_steps=2)
        server.stop()
        with caplog.at_level("WARNING", logger="mrl.integrations.trl"), \
                pytest.raises(errors.Unavailable, match=r"took nothing for 2 steps in a row \(max_unpublished_steps\)"):
            _train(tmp_path, mutual, steps=3)
    assert "not published (1 step(s) in a row; training stops at 2)" in caplog.text


def test_a_dataset_without_prompt_ids_or_a_batch_scaled_xgrpo_is_refused(tmp_path, exchange, run_id):
    from datasets import Dataset
    task = make_task(TASK)
    model, tokenizer = tiny_policy()
    args = grpo_config(str(tmp_path), P=P, G=G, T=T, steps=1)
    with ExchangeClient(exchange.target) as client:
        mutual = Mutual(exchange=client, run_id=run_id, policy="trl-gpt2", tokenizer_id="gpt2", sharing="xgrpo")
        with pytest.raises(InvalidArgument, match="no 'prompt_id' column"):
            MutualGRPOTrainer(model=model, reward_funcs=task_reward(task, P), args=args, processing_class=tokenizer,
                              train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * P), mutual=mutual)
        args.scale_rewards = "batch"
        with pytest.raises(InvalidArgument, match="scale_rewards 'group' or 'none'"):
            MutualGRPOTrainer(model=model, reward_funcs=task_reward(task, P), args=args, processing_class=tokenizer,
                              train_dataset=task_dataset(task, tokenizer, P), mutual=mutual)


def test_importing_mrl_imports_neither_trl_nor_torch():
    import subprocess
    import sys
    code = "import sys, mrl; print(any(m.split('.')[0] in ('trl', 'torch', 'transformers') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_mrl_bench_trl_quick_ends_with_one_json_line(tmp_path):
    """`mrl bench trl --quick` through the command registry (the entry point research/pyproject.toml declares)."""
    import json
    import subprocess
    import sys
    import tomllib
    from helpers import ROOT
    declared = tomllib.loads((ROOT / "research" / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["mrl.commands"]["bench.trl"] == "mrl_research.cli:bench_trl"
    code = ("import sys; from mrl.cli import build_parser; from mrl_research.cli import bench_trl; "
            "args = build_parser({'bench.trl': bench_trl}).parse_args(['bench', 'trl', '--quick']); args.run(args)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "trl" and result["quick"] is True and result["machine"]
    assert result["overhead_ratio"] > 0 and result["met"] == (result["overhead_ratio"] <= 1.10)
    assert set(result["modes"]) == {"none", "xgrpo", "sgt"}
    assert result["modes"]["none"]["peer_experiences_used"] == 0
    assert result["modes"]["xgrpo"]["peer_experiences_used"] > 0 and result["modes"]["sgt"]["peer_experiences_used"] > 0
    assert result["peer_experiences_used"] == sum(m["peer_experiences_used"] for m in result["modes"].values())


@pytest.mark.parametrize("folder", ["smollm2-tokenizer", "gemma3-tokenizer", "gpt2.tiktoken"])
def test_the_datasets_prompts_encode_as_trl_does_to_the_trainers_prompt_ids(folder):
    """TRL encodes a prompt string with the tokenizer's special tokens: the text must not carry a BOS that the encoding
    adds again (Gemma), and a base model's tokenizer without a chat template gets the trainer's plain one."""
    from transformers import AutoTokenizer
    from mrl.prompts import prompt_ids
    from mrl_trainer.policy import ModelSpec, load_policy
    path = str(tokenizer_cache_dir() / folder)
    if folder.endswith(".tiktoken"):
        _, tokenizer = load_policy(ModelSpec(source="config", tokenizer=path, architecture={"model_type": "gpt2",
                                             "n_layer": 1, "n_embd": 8, "n_head": 1}))
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    task = make_task(TASK)
    rows = task_dataset(task, tokenizer, 3)
    for row, problem in zip(rows, task.batch(0, 3)):
        encoded = tokenizer(text=row["prompt"])["input_ids"]          # as GRPOTrainer encodes a plain-text prompt
        assert encoded == prompt_ids(tokenizer, problem.question)
    if folder == "gemma3-tokenizer":
        assert encoded[0] == tokenizer.bos_token_id and encoded.count(tokenizer.bos_token_id) == 1

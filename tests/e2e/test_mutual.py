"""Mutual RL through the real services: SGT against a poisoned peer, a dead peer, and two heterogeneous
policies end to end under `mrl up` (embedded Redis, exchange, THL, scheduler, two trainers)."""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch
import yaml

from mrl.assets import tokenizer_cache_dir
from mrl.exchange_client import ExchangeClient
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_trainer.config import TrainerConfig
from mrl_trainer.errors import TrainerError
from mrl_trainer.metrics import read_metrics
from mrl_trainer.trainer import Trainer, build_trainer
from helpers import tiny_config

SMOLLM2_TOKENIZER = str(tokenizer_cache_dir() / "smollm2-tokenizer")
TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256}


def _publish_successes(target: str, run_id: str, trainer: Trainer, answer_of) -> None:
    """A peer "poison" claiming, for each of step 0's prompts, one success with the text answer_of(problem)."""
    experiences = []
    for i, problem in enumerate(trainer.task.batch(0, trainer.cfg.rollout.prompts_per_step)):
        text = f"Answer: {answer_of(problem)}"
        ids = trainer.tokenizer.encode(text) + [trainer.tokenizer.eos_token_id]
        experiences += [
            new_experience(run_id, "poison", 0, pb.GroupStats(prompt_id=problem.prompt_id, group_id=f"g{i}",
                                                              rewards=[1.0]), f"poison.0.group_stats.{i}"),
            new_experience(run_id, "poison", 0, pb.VerifiedSuccess(
                prompt_id=problem.prompt_id, prompt_text=problem.question, response_text=text, token_ids=ids,
                reward=1.0, answer=str(answer_of(problem)), group_id=f"g{i}", tokenizer_id="gpt2"),
                f"poison.0.success.{i}")]
    with ExchangeClient(target) as client:
        client.publish(experiences)


def _sgt_step(tmp_path, exchange, run_id, answer_of, guard=None):
    config = TrainerConfig.model_validate(tiny_config(
        tmp_path / "sgt", run_id=run_id, steps=1, exchange={"target": exchange.target, "tokenizer_id": "gpt2"},
        sharing={"mode": "sgt", "peers": ["poison"], "peer_wait_s": 10, "guard": guard or {}}))
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        try:
            _publish_successes(exchange.target, run_id, trainer, answer_of)
            record = trainer.step()
            return record, trainer.model.state_dict(), trainer
        finally:
            trainer.close()


def _solo_step(tmp_path):
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path / "solo", steps=1)))
    try:
        record = trainer.step()
        return record, trainer.model.state_dict()
    finally:
        trainer.close()


def test_sgt_rejects_a_poisoned_peer_and_changes_nothing(tmp_path, exchange, run_id):
    record, weights, _ = _sgt_step(tmp_path, exchange, run_id, lambda p: int(p.answer) + 1)
    _, solo = _solo_step(tmp_path)
    assert record["peers_complete"] == 1.0 and record["sgt_rescued"] == 0 and record["extras"] == 0
    assert record["sgt_accepted"] == 0 and record["sgt_rejected"] >= 1     # every gated claim was re-verified
    assert all(torch.equal(weights[k], solo[k]) for k in solo), "a rejected peer must not change the update"


def test_sgt_rescues_with_a_peer_whose_successes_verify(tmp_path, exchange, run_id):
    """With no size cap (max_ratio 0) a verified rescue moves the weights even on a step whose own groups all
    failed."""
    record, weights, _ = _sgt_step(tmp_path, exchange, run_id, lambda p: p.answer, guard={"max_ratio": 0})
    _, solo = _solo_step(tmp_path)
    assert record["sgt_rejected"] == 0 and record["sgt_rescued"] >= 1 and record["extras"] == record["sgt_rescued"]
    assert record["sgt_nll"] > 0
    assert any(not torch.equal(weights[k], solo[k]) for k in solo)


def test_sgts_default_size_cap_takes_no_peer_step_where_the_policy_has_no_gradient_of_its_own(
        tmp_path, exchange, run_id):
    """SGT's default cap, ‖peer term‖ ≤ 1·‖g_s‖: the tiny policy fails every own group, so g_s = 0 and the
    rescue, though verified, leaves the update solo's."""
    record, weights, _ = _sgt_step(tmp_path, exchange, run_id, lambda p: p.answer)
    _, solo = _solo_step(tmp_path)
    assert record["sgt_rescued"] >= 1 and record["guard_capped"] == 1
    assert all(torch.equal(weights[k], solo[k]) for k in solo)


@pytest.mark.parametrize("coupling", ["lockstep", "async"])
def test_a_dead_peer_never_blocks_a_policy(tmp_path, exchange, run_id, coupling):
    """lockstep: each step waits out peer_wait_s, then goes on; async: no step waits at all."""
    config = TrainerConfig.model_validate(tiny_config(
        tmp_path, run_id=run_id, steps=2, exchange={"target": exchange.target, "tokenizer_id": "gpt2"},
        sharing={"mode": "prp", "peers": ["ghost"], "peer_wait_s": 0.5, "coupling": coupling}))
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        try:
            trainer.run()
        finally:
            trainer.close()
    train = [r for r in read_metrics(tmp_path / "ckpt" / "metrics.jsonl") if r.get("kind", "train") == "train"]
    assert [r["step"] for r in train] == [0, 1]
    assert all(r["peers_complete"] == 0 and r["sharing"] == "prp" for r in train)
    waits = [r["peer_wait_s"] for r in train]
    assert all(0.5 <= w < 10 for w in waits) if coupling == "lockstep" else all(w < 0.5 for w in waits)


@pytest.mark.parametrize("bad, message", [
    ({"sharing": {"mode": "sgt"}}, "takes peers' experience from the exchange"),
    ({"sharing": {"mode": "prp", "peers": ["tiny"]}, "exchange": {"target": "x:1", "tokenizer_id": "gpt2"}},
     "lists this policy itself"),
    ({"sharing": {"mode": "grpo"}}, "none"),
    ({"sharing": {"mode": "sgt", "sgt": {"lam": -1}}}, "greater than or equal to 0"),
])
def test_bad_sharing_configs_are_refused(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig.model_validate({**tiny_config(tmp_path), **bad})


def _tiny_pair(tmp_path, modes: tuple[str, str], steps: int = 3, warm_start_steps: int = 150) -> pathlib.Path:
    """A topology of two tiny policies of different families and tokenizers (GPT-2 over gpt2, Llama over
    SmolLM2's), each warm-started, under the given sharing modes, with the exchange, THL and the scheduler."""
    gpt2 = tiny_config(tmp_path, policy="gpt2-tiny", steps=steps, **{
        "rollout.group_size": 4, "rollout.prompts_per_step": 2, "eval.every": 3, "eval.problems": 8})
    llama = tiny_config(tmp_path, policy="llama-tiny", seed=4, steps=steps, **{
        "model.architecture": TINY_LLAMA, "model.tokenizer": SMOLLM2_TOKENIZER,
        "rollout.group_size": 4, "rollout.prompts_per_step": 2, "eval.every": 3, "eval.problems": 8})
    for config, peer, mode, tokenizer in ((gpt2, "llama-tiny", modes[0], "gpt2"),
                                          (llama, "gpt2-tiny", modes[1], "smollm2")):
        config["warm_start"] = {"steps": warm_start_steps, "lr": 3e-3, "batch_size": 16}
        config["sharing"] = {"mode": mode, "peers": [peer], "peer_wait_s": 60}
        config["exchange"] = {"target": "set-by-mrl-up:1", "tokenizer_id": tokenizer}
        (tmp_path / f"{config['policy']}.yaml").write_text(yaml.safe_dump(config))
    topology = {"data_dir": "run", "run_id": "e2e", "exchange": {"port": 0, "admin_port": 0},
                "tokenizer_align": {"port": 0, "admin_port": 0}, "scheduler": {"port": 0, "admin_port": 0, "slots": 1},
                "trainers": [{"config": "gpt2-tiny.yaml"}, {"config": "llama-tiny.yaml"}], "report": "report"}
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(topology))
    return tmp_path / "topology.yaml"


def test_two_heterogeneous_policies_end_to_end(tmp_path):
    """HACPO and PRP through Redis, the exchange, THL and the scheduler, under `mrl up`."""
    topology = _tiny_pair(tmp_path, ("hacpo", "prp"))
    env = {"MRL_MODEL_CACHE": str(tmp_path / "models")}
    out = subprocess.run([sys.executable, "-m", "mrl.cli", "up", str(topology)],
                         capture_output=True, text=True, timeout=170, env={**os.environ, **env})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "report" in out.stdout and (tmp_path / "run" / "report" / "index.html").is_file()
    for policy, mode in (("gpt2-tiny", "hacpo"), ("llama-tiny", "prp")):
        records = read_metrics(tmp_path / "run" / policy / "metrics.jsonl")
        train = [r for r in records if r.get("kind", "train") == "train"]
        assert [r["step"] for r in train] == [0, 1, 2]
        assert all(r["sharing"] == mode and r["peers_complete"] == 1.0 and r["peer_samples"] == 8 for r in train)
        assert all(0 < r["thl_one_to_one"] <= 1 and 0 < r["thl_lossless"] <= 1 for r in train)   # THL in the loop
        assert [r["step"] for r in records if r.get("kind") == "eval"] == [0, 3]
    summary = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"policy"')]
    assert sorted(s["policy"] for s in summary) == ["gpt2-tiny", "llama-tiny"]
    assert all(s["rollouts_total"] == 24 and not s["stopped_early"] for s in summary)


def _peer_step(run_id: str, producer: str, version: int, prompt_id: str, rewards: list[float]):
    """A peer's group_stats and rollouts (gpt2 ids, behaviour log-probs) for one prompt at one version."""
    out = [new_experience(run_id, producer, version, pb.GroupStats(prompt_id=prompt_id, group_id="g", rewards=rewards),
                          f"{producer}.{version}.{prompt_id}.gs")]
    for i, reward in enumerate(rewards):
        out.append(new_experience(run_id, producer, version, pb.Rollout(
            prompt_id=prompt_id, prompt_text="q", response_text=f"Answer: {i}", token_ids=[33706, 25, 220 + i],
            logprobs=[-1.0, -1.0, -1.0], reward=reward, group_id="g", tokenizer_id="gpt2", sample_index=i),
            f"{producer}.{version}.{prompt_id}.r{i}"))
    return out


def test_peer_inbox_waits_for_complete_batches_and_drops_stale_ones(exchange, run_id):
    from mrl_trainer.peers import PeerInbox, Retokenizer, to_peer_batch
    with ExchangeClient(exchange.target) as client:
        inbox = PeerInbox(client, run_id, "me", ("rollout",), ["peer"], max_staleness=1)
        try:
            client.publish(_peer_step(run_id, "peer", 0, "p0", [1.0, 0.0])        # stale by step 5
                           + _peer_step(run_id, "peer", 5, "p5", [0.0, 1.0, 1.0])
                           + _peer_step(run_id, "peer", 5, "p6", [1.0])[:1])      # group_stats without its rollout
            deadline = time.monotonic() + 30                                      # all delivered (a loaded CI box);
            while time.monotonic() < deadline and not (                           # p0 dropped by the exchange
                    inbox._progress(["p5"]) == (1, 1) and "p6" in inbox._index.entries):   # or by the index
                time.sleep(0.05)
            arrived = inbox.collect(5, ["p0", "p5", "p6"], timeout_s=1.0)
            assert set(arrived.entries) == {"p5", "p6"} and arrived.complete == pytest.approx(1 / 3)
            assert 1.0 <= arrived.waited_s < 10                                   # p0 never arrives: waited it out
            batch, stats = to_peer_batch(arrived, ["p0", "p5", "p6"], Retokenizer("gpt2"))
            assert [s.reward for s in batch.rollouts[1]] == [0.0, 1.0, 1.0] and 0 not in batch.rollouts
            first = batch.rollouts[1][0]
            assert first.ids == [33706, 25, 220] and (first.behaviour_logp, first.chunks) == (-3.0, 3)
            assert batch.group_rewards == {1: [0.0, 1.0, 1.0], 2: [1.0]} and stats["peers_complete"] == arrived.complete
            with pytest.raises(Exception, match="set sharing.align.target"):     # a foreign tokenizer needs THL
                to_peer_batch(arrived, ["p0", "p5", "p6"], Retokenizer("smollm2"))
            # taken entries are acked: collecting them again finds nothing
            assert inbox.collect(5, ["p5"], timeout_s=0.2).entries == {}
        finally:
            inbox.close()


def test_rollout_and_update_each_run_inside_a_scheduler_lease(tmp_path, start_scheduler):
    import threading

    from mrl.scheduler_client import SchedulerClient
    from mrl.v1 import scheduler_pb2 as spb
    scheduler = start_scheduler(slots=1)
    events = []
    with SchedulerClient(scheduler.target) as admin:
        watch = admin.watch()
        reader = threading.Thread(target=lambda: events.extend(watch), daemon=True)
        reader.start()
        scheduler.wait_for_watchers(1)                    # the Watch stream is open before the step
        trainer = build_trainer(TrainerConfig.model_validate(tiny_config(
            tmp_path, steps=1, scheduler={"target": scheduler.target, "ttl_s": 10})))
        try:
            trainer.step()
        finally:
            trainer.close()
        deadline = time.monotonic() + 5
        while sum(e.type == spb.LEASE_EVENT_TYPE_RELEASED for e in events) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.close()
    seen = [(spb.LeaseEventType.Name(e.type).removeprefix("LEASE_EVENT_TYPE_"), e.lease.phase, e.lease.policy)
            for e in events]
    assert seen == [("GRANTED", "rollout", "tiny"), ("RELEASED", "rollout", "tiny"),
                    ("GRANTED", "update", "tiny"), ("RELEASED", "update", "tiny")], seen


def test_an_unreachable_scheduler_stops_the_run_with_a_clear_error(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path, steps=1, scheduler={"target": dead})))
    try:
        with pytest.raises(TrainerError, match=f"no lease for rollout from the scheduler at {dead}"):
            trainer.step()
    finally:
        trainer.close()


@pytest.mark.timeout(420)   # every registered mode, each a real two-policy run
def test_experiment_compare_runs_each_mode_and_compares_them(tmp_path, monkeypatch):
    from mrl_launcher.experiment import run_compare
    monkeypatch.setenv("MRL_MODEL_CACHE", str(tmp_path / "models"))
    topology = _tiny_pair(tmp_path, ("none", "none"), steps=3, warm_start_steps=40)
    figures = run_compare(topology, ["none", "xgrpo:uniform_groups=zero"], [0, 1], tmp_path / "compare", parallel=2)
    assert figures["seeds"] == ["s0", "s1"] and set(figures["policies"]) == {"gpt2-tiny", "llama-tiny"}
    for policy, by_mode in figures["policies"].items():
        assert set(by_mode) == {"none", "xgrpo:uniform_groups=zero"}      # a variant, named by its spec
        assert all(m["rollouts_total"] == 24 for m in by_mode.values())
        assert figures["interval"][policy] == "seeds × eval problems"
        xgrpo = by_mode["xgrpo:uniform_groups=zero"]
        assert len(xgrpo["finals"]) == 2 and xgrpo["final_ci"][0] <= xgrpo["final_accuracy"] <= xgrpo["final_ci"][1]
        assert xgrpo["delta_baseline_ci"][0] <= xgrpo["delta_baseline"] <= xgrpo["delta_baseline_ci"][1]
    assert (tmp_path / "compare" / "index.html").is_file()
    assert json.loads((tmp_path / "compare" / "compare.json").read_text()) == figures
    evals = [r for r in read_metrics(tmp_path / "compare" / "s1" / "none" / "gpt2-tiny" / "metrics.jsonl")
             if r.get("kind") == "eval"]
    assert all(len(r["eval_correct"]) == len(r["eval_prompt_ids"]) > 0 for r in evals)
    xgrpo = read_metrics(tmp_path / "compare" / "s0" / "xgrpo-uniform_groups-zero" / "gpt2-tiny" / "metrics.jsonl")
    assert all(r["sharing"] == "xgrpo" and r["xgrpo_pooled"] == 8 for r in xgrpo if r.get("kind", "train") == "train")


def test_the_demo_topology_names_valid_trainer_configs():
    """examples/mutual.yaml (make demo): each trainer's config, with its `set` overrides, validates; the two
    policies run asynchronously on the same task (so their prompt ids can meet) and list each other."""
    from mrl_trainer.config import load_config
    root = pathlib.Path(__file__).resolve().parents[2] / "examples"
    topology = yaml.safe_load((root / "mutual.yaml").read_text())
    configs = [load_config(root / t["config"], t.get("set")) for t in topology["trainers"]]
    assert {c.sharing.mode for c in configs} == {"sgt", "hacpo"}
    assert configs[0].task == configs[1].task
    assert {c.sharing.coupling for c in configs} == {"async"}
    assert configs[0].sharing.peers == [configs[1].policy] and configs[1].sharing.peers == [configs[0].policy]
    assert configs[0].exchange.tokenizer_id != configs[1].exchange.tokenizer_id     # THL is in the loop
    # policy-b steps about 15× as fast: with as few steps as policy-a it finished before policy-a's first publish and
    # took nothing (the 2026-12-06 demo run); with 10× as many it trains through policy-a's run
    assert configs[1].steps >= 10 * configs[0].steps
    assert configs[0].steps // configs[0].eval.every == configs[1].steps // configs[1].eval.every == 4


def test_a_redelivered_peer_experience_is_stored_once(start_exchange, run_id):
    """Entries left unacked past the visibility timeout (a fast peer's next step while this trainer updates)
    come again; the inbox recognises them by experience id."""
    from mrl_trainer.peers import PeerInbox
    exchange = start_exchange(visibility_timeout_s=0.5)
    with ExchangeClient(exchange.target) as client:
        inbox = PeerInbox(client, run_id, "me", ("rollout",), ["peer"], max_staleness=1)
        try:
            client.publish(_peer_step(run_id, "peer", 3, "p3", [0.0, 1.0]))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and sum(len(e.deliveries) for e in inbox._index.entries.get("p3", {}).values()) < 6:
                time.sleep(0.1)                            # 3 experiences, each delivered at least twice
            arrived = inbox.collect(3, ["p3"], timeout_s=5)
            entry = arrived.entries["p3"]["peer"]
            assert len(entry.deliveries) >= 6 and len(entry.rollouts) == 2 and entry.group_rewards == [0.0, 1.0]
            assert arrived.complete == 1.0
        finally:
            inbox.close()


def test_async_inbox_acks_each_message_of_deliveries_in_one_call(exchange, run_id):
    """Under the async coupling every delivery is acked on arrival: one Ack call per message the exchange sends
    (a batch of deliveries), not one per delivery. The calls are counted on the real client."""
    from mrl_trainer.peers import PeerInbox
    with ExchangeClient(exchange.target) as client:
        calls: list[int] = []
        real_ack = client.ack
        client.ack = lambda run, subscriber, ids, subscription_id="": calls.append(len(ids)) or real_ack(
            run, subscriber, ids, subscription_id)
        inbox = PeerInbox(client, run_id, "me", ("rollout",), ["peer"], max_staleness=1, coupling="async")
        try:
            experiences = [e for i in range(10) for e in _peer_step(run_id, "peer", 1, f"p{i}", [0.0, 1.0])]
            client.publish(experiences)                                      # 30: 10 group_stats, 20 rollouts
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and sum(calls) < len(experiences):
                time.sleep(0.05)
            assert sum(calls) == len(experiences) == 30
            assert len(calls) <= 6, calls                                    # per delivery it was 30 calls
            assert inbox.collect(1, ["p3"], timeout_s=0).entries["p3"]["peer"].group_rewards == [0.0, 1.0]
        finally:
            inbox.close()

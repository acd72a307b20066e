"""Asynchronous mutual RL (sharing.coupling: async) through a real exchange: a 10× slower peer, staleness drops
counted, a resumed trainer that takes peer experience again, past successes from the library (a dead peer:
test_mutual.py). The peer is scripted (it publishes what a trainer publishes, at the pace a test sets); the
receiver is a real trainer."""
import threading

from mrl.exchange_client import ExchangeClient
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_trainer.config import TrainerConfig
from mrl_trainer.metrics import read_metrics
from mrl_trainer.trainer import build_trainer
from helpers import tiny_config, wait_for


class ScriptedPeer:
    """Publishes, as policy `name`, what a trainer at version k would publish for the task's k-th batch: group
    stats, one rollout per sample (gpt2 ids, behaviour log-probs) and a verified success, correct by the task's
    own answer (so a receiver's verifier accepts it)."""

    def __init__(self, target: str, run_id: str, task, tokenizer, name: str = "slow", prompts: int = 2):
        self.client, self.run_id, self.task, self.tokenizer = ExchangeClient(target), run_id, task, tokenizer
        self.name, self.prompts = name, prompts

    def publish_step(self, version: int) -> None:
        out = []
        for problem in self.task.batch(version, self.prompts):
            text = f"Answer: {problem.answer}"
            ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
            pid, key = problem.prompt_id, f"{self.name}.{version}.{problem.prompt_id}"
            out.append(new_experience(self.run_id, self.name, version, pb.GroupStats(
                prompt_id=pid, group_id=key, rewards=[1.0, 0.0]), f"{key}.gs"))
            for i, reward in enumerate([1.0, 0.0]):
                out.append(new_experience(self.run_id, self.name, version, pb.Rollout(
                    prompt_id=pid, prompt_text=problem.question, response_text=text if reward else "no",
                    token_ids=ids if reward else self.tokenizer.encode("no"),
                    logprobs=[-1.0] * len(ids if reward else self.tokenizer.encode("no")), reward=reward,
                    group_id=key, tokenizer_id="gpt2", sample_index=i), f"{key}.r{i}"))
            out.append(new_experience(self.run_id, self.name, version, pb.VerifiedSuccess(
                prompt_id=pid, prompt_text=problem.question, response_text=text, token_ids=ids, reward=1.0,
                answer=str(problem.answer), group_id=key, tokenizer_id="gpt2"), f"{key}.s"))
        self.client.publish(out)

    def run_every(self, period_s: float, stop: threading.Event) -> threading.Thread:
        def loop():
            version = 0
            while not stop.is_set():
                self.publish_step(version)
                version += 1
                stop.wait(period_s)
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def close(self):
        self.client.close()


def _config(tmp_path, exchange, run_id, **sharing):
    return TrainerConfig.model_validate(tiny_config(
        tmp_path, run_id=run_id, steps=sharing.pop("steps", 6),
        exchange={"target": exchange.target, "tokenizer_id": "gpt2"},
        sharing={"mode": "sgt", "peers": ["slow"], "coupling": "async", **sharing}))


def _train_records(tmp_path):
    return [r for r in read_metrics(tmp_path / "ckpt" / "metrics.jsonl") if r.get("kind", "train") == "train"]


def test_a_ten_times_slower_peer_never_holds_back_an_async_policy(tmp_path, exchange, run_id):
    """The peer publishes one step every 1.5 s (a tiny trainer's step takes ~0.1-0.3 s on an idle machine): no
    step waits for it (lockstep would wait up to peer_wait_s, 10 s, per step), and its successes still rescue
    prompts the trainer took from it."""
    config = _config(tmp_path, exchange, run_id, peer_wait_s=10, steps=8)
    stop = threading.Event()
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer)
        try:
            thread = peer.run_every(1.5, stop)
            wait_for(lambda: any(trainer.inbox.offered()), timeout_s=30.0)
            trainer.run()
        finally:
            stop.set()
            trainer.close()
    thread.join(5)
    peer.close()
    train = _train_records(tmp_path)
    assert [r["step"] for r in train] == list(range(8))
    assert all(r["peer_wait_s"] < 0.5 for r in train)     # no wait (lockstep: up to 10 s)
    assert sum(r["peer_guided"] for r in train) >= 1 and sum(r["sgt_rescued"] for r in train) >= 1
    assert sum(r["sgt_rejected"] for r in train) == 0


def _exchange_stale_dropped(exchange) -> float:
    """The exchange's count of entries it dropped as stale (mrl_exchange_stale_dropped), from its /metrics."""
    import re

    import httpx
    found = re.search(r"^mrl_exchange_stale_dropped_total (\S+)$", httpx.get(f"{exchange.admin}/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_async_staleness_drops_are_counted(tmp_path, exchange, run_id):
    """The peer published versions 0..5 before the receiver's first step; with max_staleness 1 its groups of
    versions 0..3 are dropped (SGT subscribes to group stats and successes: one group stats per prompt, 2 prompts
    per version), by the exchange (max_version_lag) or, what it delivered before it knew version 5, by the
    receiver's index; its successes are kept (lag_exempt_kinds)."""
    config = _config(tmp_path, exchange, run_id, max_staleness=1, steps=2)
    before = _exchange_stale_dropped(exchange)
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer)
        try:
            for version in range(6):
                peer.publish_step(version)
            index = trainer.inbox._index
            wait_for(lambda: sum(len(e.successes) for by in index.entries.values() for e in by.values()) == 12,
                     timeout_s=30.0)
            trainer.run()
        finally:
            trainer.close()
            peer.close()
    train = _train_records(tmp_path)
    assert sum(r["peer_dropped"] for r in train) + _exchange_stale_dropped(exchange) - before == 4 * 2


def test_a_peer_the_guard_does_not_trust_chooses_none_of_the_batch(tmp_path, exchange, run_id):
    """Guidance follows the guard's trust: at τ = 0 (τ_0 = 0, η = 0) the peers choose no prompt, ⌊guided_share·τ·P⌋
    = 0, and the batches are the task's own, as solo's; with guard.guidance: full they choose up to half."""
    guided = {}
    for guidance in ("trust", "full"):
        out = tmp_path / guidance
        config = _config(out, exchange, f"{run_id}-{guidance}", steps=2,
                         guard={"initial_trust": 0, "trust_rate": 0, "guidance": guidance})
        with ExchangeClient(exchange.target) as client:
            trainer = build_trainer(config, exchange=client)
            peer = ScriptedPeer(exchange.target, f"{run_id}-{guidance}", trainer.task, trainer.tokenizer)
            try:
                for version in range(4, 8):            # prompts of steps 4..7: none of the receiver's own 0..1
                    peer.publish_step(version)
                wait_for(lambda: len(trainer.inbox._index.entries) == 8, timeout_s=30.0)
                trainer.run()
            finally:
                trainer.close()
                peer.close()
        guided[guidance] = [r["peer_guided"] for r in _train_records(out)]
    assert guided["trust"] == [0, 0] and all(g >= 1 for g in guided["full"])


def test_a_slow_rollout_keeps_the_peer_groups_its_batch_was_chosen_for(tmp_path, exchange, run_id):
    """The receiver chooses step 0's batch while the peer's latest is version 0, then rolls out slowly: the fast
    peer publishes versions 1..6 meanwhile. With max_staleness 1 the version-0 groups would be stale by the collect
    after the rollout; they were fresh when the batch was chosen, so XGRPO pools them (the hold)."""
    config = _config(tmp_path, exchange, run_id, mode="xgrpo", max_staleness=1, steps=1)
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer, name="slow")
        index = trainer.inbox._index
        rollout = trainer.rollout

        def slow_rollout(step, problems=None):
            for version in range(1, 7):
                peer.publish_step(version)
            wait_for(lambda: index._latest.get("slow") == 6, timeout_s=30.0)
            return rollout(step, problems)
        chosen = [p.prompt_id for p in trainer.task.batch(0, 2)]

        def version_0_arrived():                          # XGRPO takes group stats only
            entries = [index.entries.get(pid, {}).get("slow") for pid in chosen]
            return all(e is not None and e.group_rewards for e in entries)
        try:
            peer.publish_step(0)
            wait_for(version_0_arrived, timeout_s=30.0)
            trainer.rollout = slow_rollout
            trainer.run()
        finally:
            trainer.close()
            peer.close()
    [record] = _train_records(tmp_path)
    group_size = config.rollout.group_size
    assert record["xgrpo_pooled"] == group_size + 2           # own 3 rewards and the peer's 2, on every prompt


def test_a_resumed_async_trainer_takes_peer_experience_again(tmp_path, exchange, run_id):
    for steps in (2, 4):                                      # a run of 2 steps, then resumed to 4
        config = _config(tmp_path, exchange, run_id, steps=steps)
        with ExchangeClient(exchange.target) as client:
            trainer = build_trainer(config, exchange=client)
            assert trainer.state.step == steps - 2
            peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer)
            try:
                peer.publish_step(steps * 10)                 # a fresh peer step each time
                wait_for(lambda: any(trainer.inbox.offered()), timeout_s=30.0)
                trainer.run()
            finally:
                trainer.close()
                peer.close()
    train = _train_records(tmp_path)
    assert [r["step"] for r in train] == [0, 1, 2, 3]
    assert train[0]["sgt_rescued"] >= 1 and train[2]["sgt_rescued"] >= 1      # before and after the resume


def test_a_resumed_trainer_gets_past_peer_successes_from_the_library(tmp_path, start_exchange, run_id):
    """The peer's successes for steps 2-3's prompts arrived during the first run (and were acked); the
    resumed trainer's subscription will not bring them again, so only the success library can rescue them."""
    exchange = start_exchange()
    for steps in (2, 4):
        config = _config(tmp_path, exchange, run_id, steps=steps, guided_share=0)
        with ExchangeClient(exchange.target) as client:
            trainer = build_trainer(config, exchange=client)
            try:
                if steps == 2:
                    peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer)
                    for version in (2, 3):
                        peer.publish_step(version)
                    peer.close()
                    wait_for(lambda: len(trainer.inbox._index.entries) == 4, timeout_s=30.0)
                trainer.run()
            finally:
                trainer.close()
    train = _train_records(tmp_path)
    assert [r["step"] for r in train] == [0, 1, 2, 3]
    assert all(r["peer_recalled"] == 0 for r in train[:2])              # steps 0-1: no peer success exists
    assert all(r["peer_recalled"] >= 1 and r["sgt_rescued"] >= 1 for r in train[2:])


def test_a_late_joiner_gets_successes_its_stream_no_longer_holds_from_the_library(tmp_path, start_exchange, run_id):
    """The peer's successes on steps 0-1's prompts were trimmed from the stream (retention 1, then 300 newer
    successes) before the receiver joined: only the library can bring them."""
    exchange = start_exchange(retention_maxlen=1)
    config = _config(tmp_path, exchange, run_id, steps=2, guided_share=0)
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        peer = ScriptedPeer(exchange.target, run_id, trainer.task, trainer.tokenizer)
        trainer.close()                                           # it joins only after the peer has moved on
        for version in (0, 1):
            peer.publish_step(version)
        filler = [new_experience(run_id, "slow", 9, pb.VerifiedSuccess(prompt_id=f"other/{i}", response_text="x",
                                                                        token_ids=[1], reward=1.0, tokenizer_id="gpt2"))
                  for i in range(300)]
        peer.client.publish(filler)
        peer.close()
        (tmp_path / "ckpt" / "metrics.jsonl").unlink(missing_ok=True)
        trainer = build_trainer(config, exchange=client)
        try:
            trainer.run()
        finally:
            trainer.close()
    train = _train_records(tmp_path)
    assert [r["step"] for r in train] == [0, 1]
    assert all(r["peer_recalled"] >= 1 and r["sgt_rescued"] >= 1 for r in train)


def test_a_resumed_trainer_keeps_what_it_learned_about_its_peers(tmp_path, exchange, run_id):
    """The guard's trust (its score m), HACPO's measured peer capabilities and the prompts own samples solved
    (which steer peer guidance) come back with the checkpoint, as they were when it was written."""
    config = _config(tmp_path, exchange, run_id, steps=1, mode="hacpo")
    with ExchangeClient(exchange.target) as client:
        trainer = build_trainer(config, exchange=client)
        try:
            trainer.run()
            trainer.sharing.guard.score = -0.42            # below 0: τ = 0, and as much to make up on resume
            trainer.sharing.measure_capabilities([[peer_sample("slow", 1.0), peer_sample("slow", 0.0)]])
            trainer._solved.update({"arith/9/1": None, "arith/9/2": None})
            trainer.state.step += 1                            # a later step, so that it is written
            trainer.checkpoint()
        finally:
            trainer.close()
        resumed = build_trainer(config, exchange=client)
        try:
            assert resumed.state.step == 2
            assert resumed.sharing.guard.score == -0.42 and resumed.sharing.guard.trust == 0.0
            assert resumed.sharing.state()["measured"] == {"slow": [0.5]}
            assert list(resumed._solved)[-2:] == ["arith/9/1", "arith/9/2"]
        finally:
            resumed.close()


def peer_sample(producer: str, reward: float):
    from mrl_trainer.sharing import PeerSample
    return PeerSample(producer=producer, prompt_index=0, ids=[1], text="x", reward=reward, behaviour_logp=-1.0,
                      chunks=1)

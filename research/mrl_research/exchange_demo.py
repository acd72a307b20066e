"""`mrl demo --exchange`: the exchange end to end, without trainers.

Two producer policies of different families publish, step by step, what a GRPO trainer
would: for each prompt a group of G rollouts (synthetic answers to real arithmetic
prompts, scored by an exact verifier), the group's rewards, its verified successes, and
the policy's running statistics. Each policy also subscribes to its peer's experience and
acks what it receives. Everything goes through a real exchange process over gRPC and a
real (embedded) Redis; the summary shows what each side received and the broker's view.
"""
import os
import pathlib
import random
import statistics
import threading
import time
import uuid

from mrl.errors import FailedPrecondition
from mrl.exchange_client import ExchangeClient
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_serving.processes import redis_for, spawn

__all__ = ["main"]

POLICIES = {"smollm2-135m": ("smollm2", 0.35), "gpt2-small": ("gpt2", 0.2)}  # id -> (tokenizer, skill)
PROMPTS_PER_STEP = 4


def _produce(target: str, run_id: str, policy: str, steps: int, group_size: int, sent: dict) -> None:
    tokenizer, skill = POLICIES[policy]
    rng = random.Random(policy)
    window: list[float] = []
    with ExchangeClient(target) as see:
        for step in range(steps):
            batch, rewards_all = [], []
            for p in range(PROMPTS_PER_STEP):
                a, b = rng.randint(10, 99), rng.randint(10, 99)
                prompt_id, prompt = f"arith-2d/seed0/{step * PROMPTS_PER_STEP + p}", f"What is {a} + {b}?"
                group_id = f"{policy}/{step}/{p}"
                rewards = []
                for i in range(group_size):
                    answer = a + b if rng.random() < skill else a + b + rng.randint(1, 9)
                    text = f"The answer is {answer}."
                    reward = float(answer == a + b)
                    ids = list(text.encode())  # stand-in token ids: one per byte
                    batch.append(new_experience(run_id, policy, step, pb.Rollout(
                        prompt_id=prompt_id, prompt_text=prompt, response_text=text, token_ids=ids,
                        logprobs=[-rng.random() for _ in ids], reward=reward, group_id=group_id,
                        verdict=pb.VERDICT_CORRECT if reward else pb.VERDICT_INCORRECT, tokenizer_id=tokenizer,
                        sample_index=i)))
                    if reward:
                        batch.append(new_experience(run_id, policy, step, pb.VerifiedSuccess(
                            prompt_id=prompt_id, prompt_text=prompt, response_text=text, token_ids=ids,
                            reward=reward, answer=str(answer), group_id=group_id, tokenizer_id=tokenizer)))
                    rewards.append(reward)
                batch.append(new_experience(run_id, policy, step, pb.GroupStats(
                    prompt_id=prompt_id, group_id=group_id, rewards=rewards)))
                rewards_all += rewards
            window = (window + [statistics.mean(rewards_all)])[-5:]
            batch.append(new_experience(run_id, policy, step, pb.PolicyStats(
                step=step, batch_mean_reward=window[-1], capability=statistics.mean(window), window=len(window),
                rollouts_total=(step + 1) * PROMPTS_PER_STEP * group_size)))
            see.publish(batch)
            for e in batch:
                kind = e.WhichOneof("payload")
                sent[kind] = sent.get(kind, 0) + 1


def _consume(sub, got: dict, latencies: list) -> None:
    """Receive the peer's experience until the subscription is closed; ack each delivery."""
    for d in sub:
        got[d.kind] = got.get(d.kind, 0) + 1
        got["redelivered"] = got.get("redelivered", 0) + d.redelivered
        latencies.append(time.time() * 1000 - d.experience.created_at.ToMilliseconds())
        d.ack()


def _complete(sent: dict, got: dict, peer: dict) -> bool:
    return all(got[p].get(k, 0) >= n for p, q in peer.items() for k, n in sent[q].items())


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(steps: int = 20, group_size: int = 8) -> None:
    data_dir = pathlib.Path(os.environ.get("MRL_DATA_DIR", ".mrl/demo"))
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    with redis_for(os.environ.get("MRL_REDIS_URL"), data_dir) as url, spawn("exchange", url) as exchange:
        target = f"127.0.0.1:{exchange.ready['grpc_port']}"
        print(f"exchange at {target} (admin http://127.0.0.1:{exchange.ready['admin_port']}), redis {url}, "
              f"run {run_id}\n{len(POLICIES)} policies x {steps} steps x {PROMPTS_PER_STEP} prompts x G={group_size} "
              f"(synthetic rollouts: the trainer lands with its own issue)", flush=True)
        policies = list(POLICIES)
        sent = {p: {} for p in policies}
        got = {p: {} for p in policies}
        lat = {p: [] for p in policies}
        peer = dict(zip(policies, reversed(policies)))
        t0 = time.perf_counter()
        with ExchangeClient(target) as see:
            subs = {p: see.subscribe(run_id, p, start="earliest", max_in_flight=256) for p in policies}
            consumers = [threading.Thread(target=_consume, args=(subs[p], got[p], lat[p])) for p in policies]
            producers = [threading.Thread(target=_produce, args=(target, run_id, p, steps, group_size, sent[p]))
                         for p in policies]
            for t in consumers + producers:
                t.start()
            for t in producers:
                t.join()
            # Each policy receives what its peer sent, known now that the producers are done.
            deadline = time.monotonic() + 60
            while not _complete(sent, got, peer) and time.monotonic() < deadline:
                time.sleep(0.02)
            elapsed = time.perf_counter() - t0
            for p in policies:
                subs[p].close()
            for t in consumers:
                t.join(10)
            stats = see.topic_stats(run_id)
    kinds = ["rollout", "group_stats", "success", "policy_stats"]
    print(f"\n{'policy':<14}{'sent':>40}   {'received from peer':>40}")
    print(f"{'':<14}{'  '.join(f'{k:>12}' for k in kinds)}   p50/p99 publish->deliver ms  redelivered")
    for p in policies:
        print(f"{p:<14}{'  '.join(f'{sent[p].get(k, 0):>12}' for k in kinds)}")
        print(f"{'  <- peer':<14}{'  '.join(f'{got[p].get(k, 0):>12}' for k in kinds)}   "
              f"{_pct(lat[p], .5):8.2f} / {_pct(lat[p], .99):8.2f}           {got[p].get('redelivered', 0)}")
    print(f"\nbroker view of run {run_id}:")
    for s in stats:
        groups = ", ".join(f"{g.subscriber}: pending {g.pending} lag {g.lag}" for g in s.groups)
        print(f"  {pb.ExperienceKind.Name(s.topic.kind):<30} {s.topic.producer:<14} length {s.length:>5}  "
              f"v{s.latest_policy_version:<3} {groups}")
    total = sum(sum(d.values()) for d in sent.values())
    complete = _complete(sent, got, peer)
    print(f"\n{total} experiences published and delivered in {elapsed:.2f} s; every peer experience received "
          f"and acked: {complete}")
    if not complete:
        raise FailedPrecondition("demo incomplete: some experience was not delivered")

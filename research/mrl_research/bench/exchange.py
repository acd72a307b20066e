"""`mrl bench exchange`: publish → deliver → ack of 1 KiB rollouts, against raw redis-py.

What is measured, on one Redis (embedded, AOF everysec, unless MRL_REDIS_URL is set) in one run:

  mrl   PRODUCERS policies publish Rollout experiences (~1 KiB serialized: 120 token ids,
        120 log-probs, some text) in batches of BATCH through the gRPC exchange (a child
        process, `mrl exchange serve`); SUBSCRIBERS policies, one consumer group each,
        receive every rollout of every producer and ack in batches of ACK_EVERY.
  raw   the anchor: the same workers with plain redis-py on the same Redis — producers
        pipeline BATCH XADDs of the same 1 KiB bytes to one stream each; subscribers, one
        consumer group each over all the streams, send XACK of the previous read and the
        next XREADGROUP in one pipeline. Same counts, same delivery semantics (each group
        reads every entry once and acks it); no validation, dedupe or protobuf.

Workers run as threads of two processes, one for the producers and one for the subscribers
(on a 2-core machine this beat one process per worker for both systems: fewer processes
contending with Redis and the exchange). After a warm-up (streams found, connections open,
Lua script loaded) all workers start together. Throughput = experiences published ÷ (first
publish → last ack of the last subscriber): each counted experience was delivered to and
acked by every subscriber.
Latency = subscriber receive time − the experience's creation time, stamped just before
its Publish (raw: a timestamp field written just before the XADD pipeline), same host
clock; p50/p99 over every delivery of the phase. A third phase paces the producers to half
of the mrl peak throughput and reports p99 there.

With --replicas R (> 1), R exchange processes serve the same Redis and one more mrl phase spreads
the workers over them (worker i on replica i mod R, as a balancer spreading connections would);
its throughput is reported next to the one-replica peak of the same run, and their ratio
(anchor: one replica). Replicas add throughput only where there are cores to run them: on a
2-core machine Redis, every replica and the workers share the same two cores, so the ratio there
measures what a second process costs, not how replicas scale (the JSON line says so).
The last stdout line is one JSON object.
"""
import array
import contextlib
import json
import multiprocessing as mp
import os
import tempfile
import time
import threading
import uuid
import queue

import redis
from redis.utils import HIREDIS_AVAILABLE

from mrl.errors import InvalidArgument
from mrl_research import benchmarking
from mrl.exchange_client import ExchangeClient
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb
from mrl_serving.processes import redis_for, spawn

__all__ = ["main", "rollout_payload"]

PRODUCERS, SUBSCRIBERS, BATCH, ACK_EVERY, CREDIT, WARMUP = 4, 2, 64, 64, 1024, 8
TARGETS = {"ratio": 0.5, "p99_ms_at_half_load": 10}
MAX_REPLICAS = 8


def rollout_payload(i: int = 0) -> pb.Rollout:
    """A rollout whose experience serializes to about 1 KiB."""
    return pb.Rollout(prompt_id=f"arith/0/{i}", prompt_text="What is 17 * 23 + 4? Answer with a number.",
                      response_text="17 * 23 = 391, and 391 plus 4 is 395. The answer is 395.",
                      token_ids=[(i * 7919 + k * 104729) % 50000 for k in range(120)],
                      logprobs=[-0.01 * (k % 50) for k in range(120)], reward=1.0, verdict=pb.VERDICT_CORRECT,
                      group_id=f"g{i // 8}", tokenizer_id="gpt2", sample_index=i % 8)


# -- workers (threads; each puts one result on the queue) ----------------------------------
def _produce(system, where, run_id, name, n, rate, barrier):
    template = rollout_payload()
    batches = [WARMUP] + [min(BATCH, n - i) for i in range(0, n, BATCH)]
    if system == "mrl":
        client = ExchangeClient(where)
        def send(k):
            batch = [new_experience(run_id, name, 1, template) for _ in range(k)]
            now = time.time_ns()
            for e in batch:
                e.created_at.FromNanoseconds(now)
            client.publish(batch)
    else:
        client, payload, key = redis.Redis.from_url(where), _raw_payload(), f"bench:{{{run_id}}}:{name}"
        def send(k):
            pipe, t = client.pipeline(transaction=False), time.time_ns()
            for _ in range(k):
                pipe.xadd(key, {"e": payload, "t": t})
            pipe.execute()
    send(batches[0])
    barrier.wait()
    start = time.time_ns()
    interval_ns = int(BATCH / rate * 1e9) if rate else 0
    offset = int(interval_ns * int(name.rsplit("-", 1)[1]) / PRODUCERS)  # producers not in lock-step
    for j, k in enumerate(batches[1:]):
        if interval_ns:
            time.sleep(max(0.0, (start + offset + j * interval_ns - time.time_ns()) / 1e9))
        send(k)
    client.close()
    return {"start": start}


def _subscribe(system, where, run_id, name, n, barrier):
    warm, lat = WARMUP * PRODUCERS, array.array("q")
    if system == "mrl":
        client = ExchangeClient(where)
        sub = client.subscribe(run_id, name, kinds=["rollout"], start="earliest", max_in_flight=CREDIT)
        acks = queue.SimpleQueue()  # acked by a second thread, as the raw subscriber pipelines its XACKs
        acker = threading.Thread(target=lambda: [sub.ack(ids) for ids in iter(acks.get, None)])
        acker.start()
        pending, got = [], 0
        for d in sub:
            now = time.time_ns()
            got += 1
            pending.append(d.delivery_id)
            if got <= warm:
                if got == warm:
                    sub.ack(pending)
                    pending = []
                    barrier.wait()
                continue
            lat.append(now - d.experience.created_at.ToNanoseconds())
            if len(pending) >= ACK_EVERY or len(lat) == n:
                acks.put(pending)
                pending = []
            if len(lat) == n:
                break
        acks.put(None)
        acker.join()
        sub.close()
    else:
        client = redis.Redis.from_url(where)
        streams = {f"bench:{{{run_id}}}:actor-{p}": ">" for p in range(PRODUCERS)}
        acks, got = [], 0
        while len(lat) < n:
            pipe = client.pipeline(transaction=False)
            for key, ids in acks:
                pipe.xack(key, name, *ids)
            pipe.xreadgroup(name, name, streams, count=CREDIT // PRODUCERS, block=250)
            reply = pipe.execute()[-1] or []
            now, acks = time.time_ns(), []
            for key, entries in reply:
                acks.append((key, [eid for eid, _ in entries]))
                for _, fields in entries:
                    got += 1
                    if got > warm:
                        lat.append(now - int(fields[b"t"]))
                    elif got == warm:
                        barrier.wait()
        if acks:
            pipe = client.pipeline(transaction=False)
            for key, ids in acks:
                pipe.xack(key, name, *ids)
            pipe.execute()
    done = time.time_ns()
    client.close()
    return {"done": done, "lat": lat.tobytes()}


def _worker(fn, args, results):
    try:
        results.put(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails loudly
        args[-1].abort()  # the barrier: release the other workers
        results.put({"error": f"{fn.__name__}{args[:4]}: {exc!r}"})


def _group(specs, results):
    """One process running its workers as threads (the gRPC and Redis calls release the GIL)."""
    threads = [threading.Thread(target=_worker, args=(fn, args, results)) for fn, args in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _raw_payload() -> bytes:
    return new_experience(f"bench-{'0' * 12}", "actor-0", 1, rollout_payload()).SerializeToString()


def _phase(system, where, redis_url, n, rate=None) -> dict:
    """Run PRODUCERS × n/PRODUCERS experiences to SUBSCRIBERS groups; throughput and latency. `where`: the
    addresses the workers use (exchanges for mrl, Redis for raw), worker i the (i mod len)-th."""
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    if system == "raw":  # the exchange creates its groups itself; the anchor needs them first
        r = redis.Redis.from_url(redis_url)
        for p in range(PRODUCERS):
            for s in range(SUBSCRIBERS):
                r.xgroup_create(f"bench:{{{run_id}}}:actor-{p}", f"learner-{s}", id="0", mkstream=True)
    per_producer = n // PRODUCERS
    ctx = mp.get_context("spawn")
    results_q, barrier = ctx.Queue(), ctx.Barrier(PRODUCERS + SUBSCRIBERS)
    producer_rate = rate / PRODUCERS if rate else None
    producers = [(_produce, (system, where[p % len(where)], run_id, f"actor-{p}", per_producer, producer_rate,
                             barrier)) for p in range(PRODUCERS)]
    subscribers = [(_subscribe, (system, where[s % len(where)], run_id, f"learner-{s}", per_producer * PRODUCERS,
                                 barrier)) for s in range(SUBSCRIBERS)]
    procs = [ctx.Process(target=_group, args=(specs, results_q), daemon=True) for specs in (producers, subscribers)]
    for p in procs:
        p.start()
    results, deadline = [], time.monotonic() + 300
    while len(results) < PRODUCERS + SUBSCRIBERS:
        try:
            results.append(results_q.get(timeout=1))
        except queue.Empty:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                raise RuntimeError(f"bench {system}: workers stopped or timed out ({len(results)} reported)")
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"bench {system} workers failed: {errors}")
    start = min(r["start"] for r in results if "start" in r)
    done = max(r["done"] for r in results if "done" in r)
    lat = sorted(x for r in results if "lat" in r for x in array.array("q", r["lat"]))
    pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6, 3)  # noqa: E731
    total = per_producer * PRODUCERS
    return {"run_id": run_id, "experiences": total, "deliveries": len(lat), "seconds": round((done - start) / 1e9, 3),
            "exp_per_s": round(total / ((done - start) / 1e9), 1), "p50_ms": pct(0.50), "p99_ms": pct(0.99)}


def _patterns(*run_ids) -> list[str]:
    """The keys of these runs (only ours: each run id is fresh)."""
    return [f"{prefix}:{{{run_id}}}:*" for run_id in run_ids for prefix in ("bench", "mrl")]


def main(quick: bool = False, replicas: int = 1) -> None:
    if not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidArgument(f"--replicas {replicas}: run 1 to {MAX_REPLICAS} exchange replicas")
    n = 512 if quick else 100_000
    with tempfile.TemporaryDirectory(prefix="mrl-bench-") as tmp, \
            redis_for(os.environ.get("MRL_REDIS_URL"), tmp) as url:
        machine = benchmarking.machine(url)
        size = len(_raw_payload())
        print(f"mrl bench exchange: {machine}\n  {PRODUCERS} producers × batches of {BATCH}, {SUBSCRIBERS} "
              f"subscribers (one group each, all producers), {size} B rollouts, {n} experiences", flush=True)
        raw = _phase("raw", [url], url, n)
        benchmarking.delete_keys(url, _patterns(raw["run_id"]))
        print(f"  raw redis-py  {raw['exp_per_s']:>9.0f} exp/s   p50 {raw['p50_ms']} ms  p99 {raw['p99_ms']} ms",
              flush=True)
        with contextlib.ExitStack() as stack:
            targets = [f"127.0.0.1:{stack.enter_context(spawn('exchange', url, log_level='ERROR')).ready['grpc_port']}"
                       for _ in range(replicas)]
            peak = _phase("mrl", targets[:1], url, n)
            print(f"  mrl exchange  {peak['exp_per_s']:>9.0f} exp/s   p50 {peak['p50_ms']} ms  p99 {peak['p99_ms']} ms",
                  flush=True)
            half_rate = peak["exp_per_s"] / 2
            half_n = max(PRODUCERS * BATCH, int(half_rate * (1.5 if quick else 8)))
            half = _phase("mrl", targets[:1], url, half_n, rate=half_rate)
            print(f"  mrl at half load ({half_rate:.0f} exp/s offered): {half['exp_per_s']:.0f} exp/s  p50 "
                  f"{half['p50_ms']} ms  p99 {half['p99_ms']} ms", flush=True)
            spread = _phase("mrl", targets, url, n) if replicas > 1 else None
            if spread:
                print(f"  mrl, {replicas} replicas {spread['exp_per_s']:>7.0f} exp/s   p50 {spread['p50_ms']} ms  p99 "
                      f"{spread['p99_ms']} ms   ({spread['exp_per_s'] / peak['exp_per_s']:.2f}× one replica)",
                      flush=True)
        # once the exchanges have let go of their groups
        phases = [peak, half, *([spread] if spread else [])]
        benchmarking.delete_keys(url, _patterns(*(phase["run_id"] for phase in phases)))
    ratio = round(peak["exp_per_s"] / raw["exp_per_s"], 3)
    result = {"bench": "exchange", "machine": machine, "quick": quick, "experiences": n, "experience_bytes": size,
              "producers": PRODUCERS, "subscribers": SUBSCRIBERS, "batch": BATCH, "hiredis": HIREDIS_AVAILABLE,
              "mrl_exp_per_s": peak["exp_per_s"], "raw_redis_exp_per_s": raw["exp_per_s"], "ratio": ratio,
              "p50_ms": peak["p50_ms"], "p99_ms": peak["p99_ms"], "raw_p50_ms": raw["p50_ms"],
              "raw_p99_ms": raw["p99_ms"], "half_load_experiences": half["experiences"],
              "half_load_exp_per_s": half["exp_per_s"],
              "p50_ms_at_half_load": half["p50_ms"], "p99_ms_at_half_load": half["p99_ms"],
              "latency": "subscriber receive - created_at stamped just before Publish (wall clock, same host)",
              "targets": TARGETS,
              "pass": {"ratio": ratio >= TARGETS["ratio"],
                       "p99_ms_at_half_load": half["p99_ms"] <= TARGETS["p99_ms_at_half_load"]},
              "replicas": replicas}
    if spread:
        cores = os.cpu_count() or 1
        result.update({
            "replica_exp_per_s": {"1": peak["exp_per_s"], str(replicas): spread["exp_per_s"]},
            "replica_p99_ms": {"1": peak["p99_ms"], str(replicas): spread["p99_ms"]},
            "replica_anchor": "1 replica, same run", "replica_ratio": round(spread["exp_per_s"] / peak["exp_per_s"], 3),
            "cores": cores,
            "replica_note": (f"{cores} cores run Redis, {replicas} replicas and the worker processes: replicas cannot "
                             f"add throughput here, the ratio measures what another process costs"
                             if cores < 2 * (replicas + 1) else
                             "each replica, Redis and the workers can have cores of their own")})
    print(f"  ratio {ratio} (target ≥ {TARGETS['ratio']}), p99 at half load {half['p99_ms']} ms "
          f"(target ≤ {TARGETS['p99_ms_at_half_load']} ms)")
    print(json.dumps(result), flush=True)

"""`mrl trainer run` under torchrun (2 gloo ranks on CPU) over a real exchange and scheduler: rank 0 alone
publishes (the whole batch, once), takes the peers' experience and holds a gang lease per phase of the 2 devices
its config pins; the run resumes from its sharded checkpoint at one rank, and a single process refuses it with a
clear error."""
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml

from helpers import tiny_config
from mrl.exchange_client import ExchangeClient
from mrl.experience import kind_name
from mrl.scheduler_client import SchedulerClient
from mrl.v1 import scheduler_pb2 as spb

pytestmark = [pytest.mark.scale, pytest.mark.slow]


def trainer_run(config_path, ranks: int, *overrides: str) -> subprocess.CompletedProcess:
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks else []
    args = [sys.executable, *launch, "-m", "mrl.cli", "trainer", "run", str(config_path)]
    args += [f"--set={o}" for o in overrides]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(480)       # three trainer runs, two under torchrun (about 70 s when quiet)
def test_a_trainer_under_torchrun_publishes_once_leases_its_gang_and_resumes(tmp_path, start_exchange,
                                                                              start_scheduler, run_id):
    exchange, scheduler = start_exchange(), start_scheduler(slots=3)
    pins = ["node-0/slot-2", "node-0/slot-0"]                       # rank 0's device, rank 1's
    config = tiny_config(tmp_path, run_id=run_id, steps=2, sharing={"mode": "sgt", "coupling": "async"},
                         exchange={"target": exchange.target, "tokenizer_id": "gpt2"},
                         scheduler={"target": scheduler.target, "ttl_s": 10})
    config["rollout"]["prompts_per_step"] = 3          # not a multiple of the ranks: one rank pads its block
    config["eval"].update(every=2, problems=3)
    config["loss"]["beta"] = 0.01                     # every sample has a gradient (KL to the sharded reference)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(config))
    events = []
    with SchedulerClient(scheduler.target) as admin:
        watch = admin.watch()
        threading.Thread(target=lambda: events.extend(watch), daemon=True).start()
        scheduler.wait_for_watchers(1)
        proc = trainer_run(path, 2, f"scheduler.device_ids=[{', '.join(pins)}]")
        time.sleep(0.5)
        watch.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["step"] == 2 and summaries[0]["ranks"] == 2   # rank 0 prints
    granted = [(e.lease.phase, [d.device_id for d in e.lease.devices]) for e in events
               if e.type == spb.LEASE_EVENT_TYPE_GRANTED]
    assert granted == [("rollout", pins), ("update", pins)] * 2, granted
    with ExchangeClient(exchange.target) as client:
        counts = {kind_name(t.topic.kind): t.length for t in client.topic_stats(run_id)}
    assert {k: counts.get(k) for k in ("rollout", "group_stats", "policy_stats")} == \
        {"rollout": 18, "group_stats": 6, "policy_stats": 2}       # 2 steps × 3 prompts × G 3, published once
    records = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward_mean" in r]
    assert [r["step"] for r in steps] == [0, 1] and all(r["updates"] == 1 and r["kl"] >= 0 for r in steps)
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [len(r["eval_prompt_ids"]) for r in evals] == [3, 3]       # every held-out problem once, not per rank
    assert (tmp_path / "ckpt" / "step-000002" / "shards" / ".metadata").is_file()

    single = trainer_run(path, 0, "steps=3")                             # a single process cannot resume it
    assert single.returncode == 2 and "written by a trainer under torchrun" in single.stderr, single.stderr[-2000:]
    resumed = trainer_run(path, 1, "steps=3")                            # one rank can
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and json.loads(resumed.stdout.splitlines()[-1])["step"] == 3

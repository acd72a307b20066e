"""Builders of valid experiences and auth files for the tests."""
import json
import pathlib
import subprocess
import sys

import yaml

from mrl.auth import hash_token, new_token
from mrl.experience import new_experience
from mrl.v1 import experience_pb2 as pb


def rollout(run_id, producer="policy-a", version=1, reward=1.0, n_tokens=4, prompt_id="arith/0/0", **kw):
    payload = pb.Rollout(prompt_id=prompt_id, prompt_text="1+1=", response_text="2",
                         token_ids=list(range(n_tokens)), logprobs=[-0.5] * n_tokens, reward=reward,
                         verdict=pb.VERDICT_CORRECT, group_id="g0", tokenizer_id="gpt2", **kw)
    return new_experience(run_id, producer, version, payload)


def one_of_each(run_id, producer="policy-a", version=1):
    return [
        rollout(run_id, producer, version),
        new_experience(run_id, producer, version, pb.GroupStats(prompt_id="arith/0/0", group_id="g0",
                                                                rewards=[0.0, 1.0, 1.0])),
        new_experience(run_id, producer, version, pb.VerifiedSuccess(
            prompt_id="arith/0/0", prompt_text="1+1=", response_text="2", token_ids=[5], reward=1.0, answer="2",
            group_id="g0", tokenizer_id="gpt2")),
        new_experience(run_id, producer, version, pb.PolicyStats(step=3, batch_mean_reward=0.5, capability=0.4,
                                                                 window=5, rollouts_per_s=10.0)),
    ]


POLICIES = ("policy-a", "policy-b")


def write_auth_file(path: pathlib.Path, run_id: str) -> dict[str, str]:
    """policy-a and policy-b in run_id, and an admin; returns the tokens (the file holds only hashes)."""
    tokens = {name: new_token() for name in (*POLICIES, "admin")}
    principals = [{"name": p, "role": "policy", "policy": p, "runs": [run_id],
                   "token_sha256": hash_token(tokens[p])} for p in POLICIES]
    principals.append({"name": "admin", "role": "admin", "token_sha256": hash_token(tokens["admin"])})
    path.write_text(yaml.safe_dump({"principals": principals}))
    return tokens


def run_quick_bench(name: str, cwd: pathlib.Path, timeout_s: float) -> dict:
    """Run `mrl bench NAME --quick` in a child process; its last stdout line, parsed (it must be JSON)."""
    proc = subprocess.run([sys.executable, "-m", "mrl.cli", "bench", name, "--quick"], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == name and result["quick"] is True and result["machine"]
    return result

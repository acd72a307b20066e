"""One rank of tests/scale/test_fsdp.py's update runs (under torchrun, or alone as a single process): a tiny GPT-2
from a fixed seed, sharded with mrl_trainer.distributed under torchrun, takes `--steps` updates of the trainer's
update (mrl_trainer.update) on a fixed step batch in each sharing mode (its guard on), with several mini- and
micro-batches; rank 0 writes each mode's full parameters and statistics to `--out`. `--save DIR` writes each mode's
sharded checkpoint (torch.distributed.checkpoint) after the steps, `--resume DIR` starts from one. `--untrusted`:
every guard at τ = 0 for good, on a batch whose second mini-batch solo takes no step on."""
import argparse
import pathlib
import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import GPT2Config, GPT2LMHeadModel

from mrl_trainer import distributed
from mrl_trainer.config import LossConfig
from mrl_trainer.logprobs import completion_logprobs
from mrl_trainer.optimizer import adamw
from mrl_trainer.sharing import PeerBatch, make_sharing, sharing_config
from mrl_trainer.update import update

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "trainer"))
from test_sharing_modes import answer_verifier, make_batch, peer  # noqa: E402

VOCAB = 128
REWARDS = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
LENGTHS = [[2, 5, 3, 4], [6, 2, 2, 3], [3, 3, 7, 2], [4, 4, 2, 5], [2, 6, 3, 3]]
PEERS = PeerBatch(group_rewards={0: [1, 1, 0, 0], 1: [1, 0, 0, 0], 3: [0, 1, 1, 1]},
                  successes={1: [peer(1, 3, 1.0)], 3: [peer(3, 5, 1.0), peer(3, 2, 1.0)]},
                  rollouts={0: [peer(0, 4, 1.0, behaviour=-4.0), peer(0, 3, 0.0, behaviour=-4.5)],
                            3: [peer(3, 4, 1.0, behaviour=-4.2)]},
                  capability={"j": 0.6})
# --untrusted: prompts 2–4, the second mini-batch, are uniform (solo takes no step there) and prompt 3 has peer
# experience; every guard at τ = 0 for good
IDLE_REWARDS = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
MODES = ("none", "xgrpo", "sgt", "hacpo", "prp")


def run(mode: str, steps: int, ranks: distributed.Ranks, save: str | None, resume: str | None,
        untrusted: bool = False) -> dict:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=VOCAB,
                                       bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, embd_pdrop=0.0,
                                       resid_pdrop=0.0))
    if ranks.sharded:
        distributed.shard(model)
    loss = LossConfig(lr=1e-3, mini_batches=2, micro_batch_tokens=30)
    pushed = {"xgrpo": {"uniform_groups": "pooled"}} if mode == "xgrpo" else {}    # a peer term the guard projects
    # at full trust from the start (XGRPO and HACPO earn theirs from 0 by default), so that every mode's update
    # applies its peer term, the combination the shards must reproduce
    guard = {"guard": {"initial_trust": 1.0}} if mode != "none" else {}
    if untrusted and mode != "none":
        guard = {"guard": {"initial_trust": 0.0, "trust_rate": 0.0}}
    sharing = make_sharing(sharing_config(mode=mode, **pushed, **guard), loss)
    optimizer = adamw(model, loss)
    batch = make_batch(IDLE_REWARDS if untrusted else REWARDS, LENGTHS)
    logprobs = lambda prompts, completions: completion_logprobs(model, prompts, completions, 0, 1.0)  # noqa: E731
    if resume:
        distributed.load(f"{resume}/{mode}", model, optimizer)
    stats = []
    params = list(model.parameters())   # taken before any forward, as the trainer does (Trainer.params)
    for _ in range(steps):
        plan = sharing.plan(batch, PEERS, capability=0.5, verify=answer_verifier(batch))
        stats.append(update(logprobs, params, optimizer, sharing, loss, batch, plan, max_tokens=8, ranks=ranks))
    if save:
        distributed.save(f"{save}/{mode}", model, optimizer, steps)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"params": {k: v.clone() for k, v in full.items()}, "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save")
    parser.add_argument("--resume")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--untrusted", action="store_true")
    args = parser.parse_args()
    ranks = distributed.setup() if distributed.under_torchrun() else distributed.Ranks()
    try:
        results = {mode: run(mode, args.steps, ranks, args.save, args.resume, args.untrusted)
                   for mode in args.modes.split(",")}
        if ranks.main:
            torch.save(results, args.out)
    finally:                    # a rank that raises still leaves the process group (else it may abort at exit)
        if ranks.sharded:
            distributed.teardown()


if __name__ == "__main__":
    main()

"""A TRL GRPOTrainer joins a mutual run (docs/trl.md).

Start the services and an mrl policy to co-train with (policy-a: SmolLM2's tokenizer, the `linear` task,
4 prompts × 8 samples per step), then this script:

    mrl up examples/local.yaml                         # Redis, exchange :50051, THL :50052, scheduler
    mrl trainer run examples/policy-a.yaml --set exchange.target=127.0.0.1:50051 \
        --set sharing.align.target=127.0.0.1:50052 --set sharing.mode=prp --set "sharing.peers=[trl-gpt2]"
    python examples/trl_peer.py --exchange 127.0.0.1:50051 --align 127.0.0.1:50052 \
        --run-id compose --peers policy-a --sharing sgt

The TRL policy is a tiny GPT-2-architecture model (random weights over the shipped GPT-2 tokenizer, `make
tokenizers`); its prompts are the run's task (--task, by default policy-a's: linear level 1, seed 0, whose
prompt ids the mrl trainers use), in the task's order, so that its step t holds the same prompt ids as its
peers' step t. Pass your own model, dataset (with
a `prompt_id` column) and reward functions the same way. `--token` (or MRL_TOKEN): this policy's bearer token
when the services require one.
"""
import argparse
import os
import tempfile

from mrl import AlignClient, ExchangeClient
from mrl.integrations.trl import Mutual, MutualGRPOTrainer
from mrl_research.bench.trl import grpo_config, task_dataset, task_reward, tiny_policy
from mrl_trainer.tasks import make_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchange", required=True, help="host:port of the exchange")
    parser.add_argument("--align", help="host:port of THL (needed when a peer uses another tokenizer)")
    parser.add_argument("--token", default=os.environ.get("MRL_TOKEN"))
    parser.add_argument("--run-id", default="local")
    parser.add_argument("--policy", default="trl-gpt2")
    parser.add_argument("--peers", nargs="*", default=[])
    parser.add_argument("--sharing", choices=["none", "xgrpo", "sgt"], default="sgt")
    parser.add_argument("--task", default="linear:1:0", help="family:level:seed of the run's task")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts-per-step", type=int, default=4, help="= the peers' rollout.prompts_per_step")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()

    family, level, seed = args.task.split(":")
    task = make_task({"family": family, "level": int(level), "seed": int(seed)})
    model, tokenizer = tiny_policy()
    P, G = args.prompts_per_step, args.group_size
    with tempfile.TemporaryDirectory() as out, ExchangeClient(args.exchange, args.token) as exchange:
        align = AlignClient(args.align, args.token) if args.align else None
        trainer = MutualGRPOTrainer(
            model=model, reward_funcs=task_reward(task, args.steps * P), processing_class=tokenizer,
            args=grpo_config(out, P=P, G=G, T=16, steps=args.steps),
            train_dataset=task_dataset(task, tokenizer, args.steps * P),
            mutual=Mutual(exchange=exchange, run_id=args.run_id, policy=args.policy, tokenizer_id="gpt2",
                          sharing=args.sharing, peers=args.peers, align=align, peer_wait_s=60))
        try:
            trainer.train()
        finally:
            trainer.close()
            if align is not None:
                align.close()
        for record in trainer.mutual_log:
            print(record)


if __name__ == "__main__":
    main()

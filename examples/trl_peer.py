"""A TRL GRPOTrainer joins a mutual run (docs/trl.md): a lab's script, needing only `pip install "./sdk[trl]"`.

Start the services and an mrl policy to co-train with (policy-a: SmolLM2's tokenizer, the `linear` task,
4 prompts × 8 samples per step), then this script:

    mrl up examples/local.yaml                         # Redis, exchange :50051, THL :50052, scheduler :50053
    mrl trainer run examples/policy-a.yaml --set sharing.mode=prp --set "sharing.peers=[trl-tiny]"
    python examples/trl_peer.py --exchange 127.0.0.1:50051 --run-id compose --peers policy-a --sharing sgt

The TRL policy is a tiny Llama-architecture model (random weights over SmolLM2's tokenizer, which `make tokenizers`
caches; --tokenizer names another HF tokenizer folder, --tokenizer-id its THL id, and --align THL's address, which
a peer of another tokenizer needs). Its prompts are the run's task (--task, by default policy-a's: linear level 1,
seed 0) from mrl.tasks, in the task's order, so that its step t holds the same prompt ids as its peers' step t.
Pass your own model, dataset (with a `prompt_id` column) and reward functions the same way.

Settings follow mrl.precedence: a flag > the environment (MRL_TOKEN, MRL_EXCHANGE_TARGET, MRL_ALIGN_TARGET,
MRL_TLS_ROOT_CERT) > the default. The Mutual is made first: it checks the connection (address, TLS, token, policy
and run) before the model is loaded, and a wrong one stops the script at once with what to fix.
"""
import argparse
import tempfile

from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig

from mrl import AlignClient, ExchangeClient
from mrl.assets import tokenizer_cache_dir
from mrl.errors import InvalidArgument
from mrl.integrations.trl import Mutual, MutualGRPOTrainer, task_dataset, task_reward
from mrl.precedence import resolve
from mrl.tasks import make_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchange", help="host:port of the exchange (or MRL_EXCHANGE_TARGET)")
    parser.add_argument("--align", help="host:port of THL (or MRL_ALIGN_TARGET): a peer of another tokenizer needs it")
    parser.add_argument("--token", help="this policy's bearer token (or MRL_TOKEN) when the services require one")
    parser.add_argument("--run-id", default="local")
    parser.add_argument("--policy", default="trl-tiny")
    parser.add_argument("--peers", nargs="*", default=[])
    parser.add_argument("--sharing", choices=["none", "xgrpo", "sgt"], default="sgt")
    parser.add_argument("--task", default="linear:1:0", help="family:level:seed of the run's task")
    parser.add_argument("--tokenizer", default=str(tokenizer_cache_dir() / "smollm2-tokenizer"))
    parser.add_argument("--tokenizer-id", default="smollm2", help="THL's id of --tokenizer")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts-per-step", type=int, default=4, help="= the peers' rollout.prompts_per_step")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    exchange_target = resolve(args.exchange, "--exchange", "MRL_EXCHANGE_TARGET")
    align_target = resolve(args.align, "--align", "MRL_ALIGN_TARGET")
    if exchange_target.value is None:
        raise InvalidArgument("no exchange: pass --exchange HOST:PORT or set MRL_EXCHANGE_TARGET")

    family, level, seed = args.task.split(":")
    task = make_task({"family": family, "level": int(level), "seed": int(seed)})
    P, G = args.prompts_per_step, args.group_size
    align = None
    with ExchangeClient(exchange_target.value, args.token, token_source="--token",
                        target_source=exchange_target.source) as exchange:
        try:
            if align_target.value is not None:
                align = AlignClient(align_target.value, args.token, token_source="--token",
                                    target_source=align_target.source)
            mutual = Mutual(exchange=exchange, run_id=args.run_id, policy=args.policy, tokenizer_id=args.tokenizer_id,
                            sharing=args.sharing, peers=args.peers, align=align, peer_wait_s=60)
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, padding_side="left")
            model = LlamaForCausalLM(LlamaConfig(
                vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id))
            with tempfile.TemporaryDirectory() as out:
                config = GRPOConfig(output_dir=out, use_cpu=True, max_steps=args.steps, num_generations=G,
                                    per_device_train_batch_size=P * G, max_completion_length=16, beta=0.0,
                                    shuffle_dataset=False, learning_rate=1e-3, report_to="none", save_strategy="no",
                                    logging_steps=1)
                trainer = MutualGRPOTrainer(model=model, reward_funcs=task_reward(task, args.steps * P),
                                            processing_class=tokenizer, args=config, mutual=mutual,
                                            train_dataset=task_dataset(task, tokenizer, args.steps * P))
                try:
                    trainer.train()
                finally:
                    trainer.close()
        finally:
            if align is not None:
                align.close()
    for record in trainer.mutual_log:
        print(record)


if __name__ == "__main__":
    main()

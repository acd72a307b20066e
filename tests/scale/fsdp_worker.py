"""One rank of an FSDP2 run for tests/scale/test_fsdp.py (started by torchrun): a tiny GPT-2 from a fixed seed,
sharded with mrl_trainer.distributed, `--steps` updates on fixed global batches split across the ranks, then
rank 0 writes the full parameters to `--out`. `--resume DIR` starts from a checkpoint, `--save DIR` writes one."""
import argparse

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import GPT2Config, GPT2LMHeadModel

from mrl_trainer import distributed

VOCAB, ROWS, COLUMNS = 128, 8, 16


def global_batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, COLUMNS), generator=torch.Generator().manual_seed(100 + step))


def summed_lm_loss(model, ids):
    """(summed next-token cross-entropy, tokens predicted)."""
    logits = model(ids).logits[:, :-1]
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="sum")
    return total, ids[:, 1:].numel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save")
    parser.add_argument("--resume")
    args = parser.parse_args()
    rank, world = distributed.setup()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=COLUMNS, vocab_size=VOCAB,
                                       bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, embd_pdrop=0.0,
                                       resid_pdrop=0.0))
    distributed.shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = distributed.load(args.resume, model, optimizer) if args.resume else 0
    for _ in range(args.steps):
        distributed.update(model, optimizer, summed_lm_loss, global_batch(step).chunk(world)[rank])
        step += 1
    if args.save:
        distributed.save(args.save, model, optimizer, step)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"step": step, "params": full}, args.out)
    distributed.teardown()


if __name__ == "__main__":
    main()

"""Rollouts with Hugging Face `generate` (CPU or GPU), batched, with behaviour log-probs.

The engine samples from the very model the trainer updates, so `sync_weights` has nothing to
copy. Prompts are left-padded and each is repeated n times; sequences are generated in chunks
of at most `max_batch` so that memory stays bounded. The behaviour log-prob of a sampled token
is log softmax(logits / temperature)[y_t]: the distribution before top-p truncation, the same
one the trainer's log π_θ is computed under. Temperature 0 decodes greedily (evaluation).

`synced` (a model sharded by FSDP over torchrun's ranks, each generating its own prompts): every rank runs
the model's forward until all ranks' sequences are done (transformers' synced_gpus), since each forward
gathers the shards from all of them; the ranks must generate equally many chunks.
"""
import torch

from mrl_trainer.rollout.base import Sample, SamplingParams, stop_token_ids

__all__ = ["HFEngine"]


class HFEngine:
    def __init__(self, model, tokenizer, max_batch: int = 64, synced: bool = False):
        self.model, self.synced = model, synced
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.stop_ids = stop_token_ids(model, tokenizer)

    def sync_weights(self, model) -> None:
        self.model = model

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(n)]
        samples: list[Sample] = []
        torch.manual_seed(params.seed)
        for start in range(0, len(flat), self.max_batch):
            samples.extend(self._chunk(flat[start:start + self.max_batch], params))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def _chunk(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        was_training = self.model.training
        self.model.eval()
        try:
            sampling = (dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
                        if params.temperature > 0 else dict(do_sample=False))
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=params.max_new_tokens,
                output_logits=True, return_dict_in_generate=True, pad_token_id=pad, synced_gpus=self.synced,
                **sampling)
        finally:
            self.model.train(was_training)
        generated = out.sequences[:, width:]                                    # (B, T)
        # step by step, so that no (B, T, V) copy of the logits is made: 1.1 GiB each for 64 × 96 tokens of
        # a 49k vocabulary, which ran several trainers sharing a GPU out of memory
        temperature = params.temperature or 1.0
        logprobs = torch.stack([torch.log_softmax(step.float() / temperature, dim=-1).gather(
            -1, generated[:, t:t + 1]).squeeze(-1) for t, step in enumerate(out.logits)], dim=1)   # (B, T)
        samples = []
        for prompt, ids, lps in zip(prompts, generated.tolist(), logprobs.tolist()):
            stop = next((t for t, i in enumerate(ids) if i in self.stop_ids), None)
            length = len(ids) if stop is None else stop + 1
            samples.append(Sample(prompt_ids=prompt, ids=ids[:length], logprobs=lps[:length],
                                  text=self.tokenizer.decode(ids[:length], skip_special_tokens=True),
                                  truncated=stop is None))
        return samples

"""Rollouts with SGLang (`sglang.Engine`, GPU only; `pip install mrl-trainer[sglang]`).

The engine runs in-process next to the trainer's model on the same GPU: it is started from a
HF folder holding the policy's current weights and, after each optimizer step, receives the new
weights with `update_weights_from_tensor` (no disk round trip). Generation takes token ids (the
trainer applies the chat template) and returns the sampled ids with their log-probs
(`meta_info["output_token_logprobs"]`: (logprob, token id, text) per token).

NOT YET RUN: no GPU was lent to the session that wrote this module; it follows SGLang's
documented Engine API but has not been exercised (README, "What is not done yet").
"""
import pathlib
import tempfile

from mrl_trainer.errors import TrainerError
from mrl_trainer.rollout.base import Sample, SamplingParams, stop_token_ids

__all__ = ["SGLangEngine"]


class SGLangEngine:
    def __init__(self, model, tokenizer, max_batch: int = 64, mem_fraction_static: float = 0.4):
        try:
            import sglang
        except ImportError as exc:
            raise TrainerError("rollout.engine='sglang' needs SGLang: pip install 'mrl-trainer[sglang]' "
                               "(GPU machines), or use engine 'hf'") from exc
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self._folder = tempfile.TemporaryDirectory(prefix="mrl-sglang-")
        model.save_pretrained(self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        self.engine = sglang.Engine(model_path=str(pathlib.Path(self._folder.name)), dtype=str(model.dtype).split(".")[-1],
                                    mem_fraction_static=mem_fraction_static, skip_tokenizer_init=True)
        self.stop_ids = stop_token_ids(model, tokenizer)

    def sync_weights(self, model) -> None:
        self.engine.update_weights_from_tensor(named_tensors=[(n, p.detach()) for n, p in model.named_parameters()])

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(n)]
        sampling = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
                    "top_p": params.top_p, "stop_token_ids": sorted(self.stop_ids)}
        samples = []
        for start in range(0, len(flat), self.max_batch):
            chunk = flat[start:start + self.max_batch]
            outputs = self.engine.generate(input_ids=chunk, sampling_params=sampling, return_logprob=True)
            for prompt, out in zip(chunk, outputs):
                pairs = out["meta_info"]["output_token_logprobs"]
                ids, logprobs = [int(t) for _, t, _ in pairs], [float(lp) for lp, _, _ in pairs]
                samples.append(Sample(prompt_ids=prompt, ids=ids, logprobs=logprobs,
                                      text=self.tokenizer.decode(ids, skip_special_tokens=True),
                                      truncated=not ids or ids[-1] not in self.stop_ids))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def close(self) -> None:
        self.engine.shutdown()
        self._folder.cleanup()

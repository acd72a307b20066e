"""Per-token log-probs of sampled completions under a policy: the log π_θ(y_t | x, y_<t) of every loss."""
import torch

__all__ = ["completion_logprobs"]


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                        temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y_t | x, y_<t) of each completion token, (n, L) right-padded, and its mask (n, L).

    Prompts are left-padded and completions right-padded, so every completion starts at the same
    column and only the last L+1 positions' logits are computed; position ids follow the attention
    mask, as in generation, so log-probs match the engine's.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    length = max(len(c) for c in completions)
    rows, attn = [], []
    for p, c in zip(prompts, completions):
        rows.append([pad_id] * (width - len(p)) + p + c + [pad_id] * (length - len(c)))
        attn.append([0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)))
    input_ids = torch.tensor(rows, device=device)                               # (n, W + L)
    attention_mask = torch.tensor(attn, device=device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   logits_to_keep=length + 1).logits[:, :-1]                    # (n, L, V)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    targets = input_ids[:, width:]                                              # (n, L)
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = attention_mask[:, width:].to(token_logp.dtype)
    return token_logp, mask

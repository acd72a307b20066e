"""How a run poses a question to a policy: one user turn in the tokenizer's chat template — the one place that says
it, for mrl's trainer and for a lab's own trainer (mrl.integrations.trl.task_dataset), so that both see the same
token ids for the same prompt.

    a tokenizer with a chat template     its own template (an instruction-tuned model, e.g. SmolLM2-Instruct)
    one without (GPT-2, a base model     PLAIN_CHAT_TEMPLATE, "User: <question>\\nAssistant:", after the BOS when the
    such as Gemma-3-270M)                tokenizer's own encoding begins with one (default_template; Gemma's
                                         continuations degenerate without it)

prompt_ids(tokenizer, question) are the ids a rollout starts from. prompt_text(tokenizer, question) is the text whose
encoding with the tokenizer's special tokens (as TRL encodes a prompt string) gives those ids: the template's text
without a leading BOS that the encoding adds back. Works with any Hugging Face tokenizer; imports nothing itself.
"""

__all__ = ["PLAIN_CHAT_TEMPLATE", "default_template", "ensure_template", "prompt_ids", "prompt_text"]

# One turn per line, the answer after "Assistant:".
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}")


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("x").input_ids[:1] == [bos]


def default_template(tokenizer) -> str:
    """PLAIN_CHAT_TEMPLATE, after `{{ bos_token }}` when the tokenizer's own encoding of text begins with its BOS
    (a model trained with one, as Gemma, sees it first in every prompt; GPT-2's encoding adds none)."""
    return ("{{ bos_token }}" if _adds_bos(tokenizer) else "") + PLAIN_CHAT_TEMPLATE


def ensure_template(tokenizer, template: str | None = None) -> None:
    """Give a tokenizer without a chat template `template`, else default_template (its own is kept)."""
    if not tokenizer.chat_template:
        tokenizer.chat_template = template or default_template(tokenizer)


def _messages(question: str, system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]


def prompt_ids(tokenizer, question: str, system: str | None = None) -> list[int]:
    """The token ids of a one-turn prompt in the tokenizer's chat template, ready for generation."""
    ids = tokenizer.apply_chat_template(_messages(question, system), add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids)


def prompt_text(tokenizer, question: str, system: str | None = None) -> str:
    """The prompt as text whose encoding with special tokens is prompt_ids(tokenizer, question, system)."""
    text = tokenizer.apply_chat_template(_messages(question, system), add_generation_prompt=True, tokenize=False)
    bos = tokenizer.bos_token
    return text[len(bos):] if bos and text.startswith(bos) and _adds_bos(tokenizer) else text

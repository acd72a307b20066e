"""Rationalization: a peer's verified answer, written again by the receiver in its own words (STaR's
rationalization, Zelikman et al. 2022), for SGT's rescues.

SGT trains on a peer's success as the peer wrote it. A peer of another family writes in its own form (the demo's
GPT-2 policy: "Answer: 68"; SmolLM2: a sentence), and the NLL of a response the receiver finds unlikely pulls
its form towards the peer's as much as it teaches the answer. With `sharing.sgt.rationalize: n` (n > 0), for
each prompt x SGT would rescue (its own group's success rate ≤ τ) that has a peer success y_j which the
receiver's own verifier accepts, with the answer a it extracts from y_j:

    x_hint        = x + "\\nHint: the answer is a."
    y_1 … y_n     ~ π_θ^k(· | x_hint)                 (the rollout's sampling settings; one batch for the step)
    rescued       = the y_i with r_k(x, y_i) = 1       (verified against x as posed, without the hint)

and SGT trains on (x, y_i): λ·NLL of the receiver's own words, as a response to x without the hint. Only the
answer, as the receiver's verifier reads it, crosses over from the peer; its text is never trained on. A prompt
none of whose n samples is verified is not rescued (counted in sgt_unrationalized). Peer successes the verifier
rejects are left as they are, for SGT to reject and count.

The rescued y_i are ordered for SGT, which keeps the first `per_prompt`: those that ended by themselves (a stop
token) before those cut at max_new_tokens, and the shorter first within each:

    order(y_i)    = (truncated(y_i), |y_i|)

A rewrite cut at the limit is verified only because its answer came early; its NLL can train the policy to go on
writing past the answer, towards the limit. A prompt whose only verified rewrites were cut is still rescued, and
counted in sgt_rationalized_truncated.
"""
from collections.abc import Callable
from dataclasses import replace

from mrl_trainer.experience import StepBatch
from mrl_trainer.sharing import PeerBatch

__all__ = ["rationalize", "hinted"]

Verify = Callable[[object, str], tuple[float, str | None]]          # (problem, text) → (reward, extracted answer)
Sample = Callable[[list[tuple[object, str]], int], list[list]]      # [(problem, hinted question)], n → samples


def hinted(question: str, answer: str) -> str:
    """The question with the peer's verified answer as a hint."""
    return f"{question}\nHint: the answer is {answer}."


def rationalize(batch: StepBatch, peers: PeerBatch, prompts: list[int], *, verify: Verify, sample: Sample,
                n: int) -> tuple[PeerBatch, dict[str, int]]:
    """`peers` with the successes of `prompts` (the prompt indices SGT would rescue) replaced by the receiver's
    own verified rewrites; stats sgt_rationalized (prompts with one) and sgt_unrationalized (prompts with a
    verified peer answer and none of the n samples verified) and sgt_rationalized_truncated (prompts whose first
    rewrite, in the module's order, was cut at the token limit)."""
    asked = []           # (prompt index, the successes the verifier rejects, the hinted question)
    for p in prompts:
        offered = peers.successes.get(p, [])
        problem = batch.problems[p]
        checked = [(s, *verify(problem, s.text)) for s in offered]
        answers = [answer for _, reward, answer in checked if reward >= 1.0 and answer]
        if answers:
            asked.append((p, [s for s, reward, _ in checked if reward < 1.0], hinted(problem.question, answers[0])))
    if not asked:
        return peers, {"sgt_rationalized": 0, "sgt_unrationalized": 0, "sgt_rationalized_truncated": 0}
    groups = sample([(batch.problems[p], question) for p, _, question in asked], n)
    successes = dict(peers.successes)
    rationalized = truncated = 0
    for (p, rejected, _), group in zip(asked, groups):
        problem, template = batch.problems[p], peers.successes[p][0]
        verified = sorted((s for s in group if s.ids and verify(problem, s.text)[0] >= 1.0),
                          key=lambda s: (s.truncated, len(s.ids)))
        rationalized += bool(verified)
        truncated += bool(verified) and verified[0].truncated
        successes[p] = rejected + [replace(template, producer="rationalized", ids=list(s.ids), text=s.text,
                                           reward=1.0) for s in verified]
    return replace(peers, successes=successes), {"sgt_rationalized": rationalized,
                                                 "sgt_unrationalized": len(asked) - rationalized,
                                                 "sgt_rationalized_truncated": truncated}

"""The contextual bandit: contexts with verifiable answers, and tiny token-level policies over real tokenizers.

Environment. C contexts, each a question with a short verifiable answer:

    context c   "What is a + b?"          a + b ∈ [10, 49], two different digits
    verifier    R(c, y) = 1  iff  final_number(text(y)) = a + b      (the trainer's numeric verifier,
                                                                      mrl.tasks.base.final_number)

so "37", "+37" and "037" all score 1. Two answer *formats* matter below: plain "37" and signed "+37".

Policy. A per-context bigram over a policy's OWN real tokenizer (gpt2, mistral-v1, smollm2 via
mrl_tokenizer_align.vocab), with a small action set:

    A        = the tokens of the canonical encodings of every "n" and "+n", 0 ≤ n ≤ 49, and EOS
    actions  = A ∪ {OTHER}             OTHER stands for every other non-special token of the vocabulary
    π_θ(v | c, y_<t) = softmax(W[c, s] + β·S[s])_v          v an action; s = s(y_{t−1}), the previous token's
                                                            action, or BOS
    π_θ(y_t | ...) of a real token id y_t = π_θ(y_t | ...)                   y_t ∈ A
                                          = π_θ(OTHER | ...) / N_rest        otherwise
                                            (N_rest = |vocabulary| − |A| − specials)

S is a table SHARED by all contexts, β the testbed's `interference` (0: no S, each context a separate
table; > 0: an update on one context moves every other one through S, as a shared representation does in
an LLM — so a peer's answer format learned on a few contexts can drag the others, "format drag").

π_θ is a proper distribution over the WHOLE vocabulary: a peer response retokenized into tokens
outside A is scored (low, through OTHER), never −∞. Sampling OTHER emits a uniformly drawn token
of the rest of the vocabulary. Responses stop at EOS (included, as the trainer's Sample.ids) or
after `max_new_tokens`; sampling is at temperature 1 (Gumbel-max), with the behaviour log-probs kept.

Competence (the initial W, controllable). For each context a policy has favoured token paths
(canonical encodings + EOS) with target sequence probabilities:

    strong context   correct answer             p_strong
    weak context     correct answer             p_weak        (rare: solo GRPO rarely sees a success)
                     a wrong "distractor"       p_distract    (confidently wrong, as a weak LLM)

each split across the policy's formats by its format weights (format "plain" / "signed"). The
logits are W = noise·N(0, 1) (+ a low OTHER logit), then, at each state on a favoured path, the
favoured tokens get exactly their target conditional probability q_v:

    W[c, s, v] = log q_v + log( Σ_{u not favoured} e^{W[c, s, u]} / (1 − Σ q) )

with q from the trie of favoured paths: q(child) = r · M(child) / M(node), M = favoured mass through
a prefix, r = (Σ p)^{1/n} (n = the longest path), so each path gets ≈ its target probability.
"""
import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from mrl_trainer.rollout.base import Sample
from mrl.tasks import Problem
from mrl.tasks.base import final_number
from mrl_tokenizer_align.vocab import Vocab

__all__ = ["FORMATS", "Profile", "Bandit", "TabularPolicy", "reward", "extract", "decode", "action_tokens"]

ANSWER_RANGE = (10, 49)                       # answers a + b; the action sets spell 0 .. 49
FORMATS = {"plain": "{}", "signed": "+{}"}
OTHER_LOGIT = -2.0                            # the initial logit of OTHER (off-task tokens are rare)
_DISTINCT = re.compile(r"^(\d)(?!\1)\d$")     # two different digits: a bigram can spell it without a loop


@functools.lru_cache(maxsize=1 << 16)
def _final(text: str) -> Fraction | None:
    return final_number(text)


@functools.lru_cache(maxsize=1 << 16)
def _reward(text: str, answer: str) -> float:
    return 1.0 if _final(text) == Fraction(answer) else 0.0


def reward(problem: Problem, text: str) -> float:
    """R(c, y): the trainer's numeric verifier (final_number) against the reference answer (cached by text)."""
    return _reward(text, problem.answer)


def extract(problem: Problem, text: str) -> str | None:
    value = _final(text)
    return None if value is None else str(value)


def decode(vocab: Vocab, ids: tuple[int, ...]) -> str:
    """The response's text as the trainer's tokenizer.decode(skip_special_tokens=True) gives it: specials
    dropped, a dummy-prefix tokenizer's invented leading space removed, invalid UTF-8 replaced."""
    return _decode(vocab.tokenizer_id, vocab, tuple(ids))


@functools.lru_cache(maxsize=1 << 16)
def _decode(tokenizer_id: str, vocab: Vocab, ids: tuple[int, ...]) -> str:
    arr = np.asarray(ids, dtype=np.int64)
    arr = arr[~vocab.is_special[arr]] if len(arr) else arr
    data = vocab.token_bytes(arr)
    if vocab.dummy_prefix and len(arr) and data[:1] == b" " and arr[0] != vocab.space_byte_id:
        data = data[1:]
    return data.decode("utf-8", errors="replace")


def action_tokens(vocab: Vocab) -> np.ndarray:
    """A: the sorted token ids of the canonical encodings of every "n" and "+n" (0 ≤ n ≤ 49), and EOS."""
    texts = [f.format(n) for f in FORMATS.values() for n in range(ANSWER_RANGE[1] + 1)]
    tokens = {int(i) for t in texts for i in vocab.encode(t)} | {vocab.eos_id}
    return np.asarray(sorted(tokens), dtype=np.int64)


@dataclass(frozen=True)
class Profile:
    """A policy's initial competence: which contexts it is strong on, and how it writes answers."""
    strong: tuple[bool, ...]                  # per context
    formats: dict                             # format name → weight (sums to 1)
    p_strong: float = 0.5
    p_weak: float = 0.02
    p_distract: float = 0.5


class Bandit:
    """C contexts (Problems) drawn from a seed, and the step schedule: P contexts per step, the same for every
    policy at step t (as the trainer's task.batch(step, P))."""

    def __init__(self, contexts: int, seed: int):
        rng = np.random.default_rng([seed, 7])
        answers = [n for n in range(ANSWER_RANGE[0], ANSWER_RANGE[1] + 1) if _DISTINCT.match(str(n))]
        chosen = rng.choice(answers, size=contexts, replace=contexts > len(answers))
        self.problems = []
        for i, n in enumerate(int(x) for x in chosen):
            a = int(rng.integers(1, n))
            self.problems.append(Problem(prompt_id=f"bandit:train:{seed}:{i}", question=f"What is {a} + {n - a}?",
                                         answer=str(n), meta={"context": i}))
        self.seed = seed

    def __len__(self) -> int:
        return len(self.problems)

    def batch(self, step: int, size: int) -> list[Problem]:
        rng = np.random.default_rng([self.seed, 11, step])
        return [self.problems[i] for i in rng.choice(len(self.problems), size=min(size, len(self)), replace=False)]


def distractor(answer: int) -> int:
    """A wrong answer close to the right one (± 10, else ± 1), with two different digits."""
    for d in (10, -10, 1, -1, 2, -2):
        n = answer + d
        if ANSWER_RANGE[0] <= n <= ANSWER_RANGE[1] and _DISTINCT.match(str(n)):
            return n
    raise ValueError(f"no distractor for {answer}")


class TabularPolicy(torch.nn.Module):
    """π_θ of the module docstring over one tokenizer: W (C, |A| + 2 states, |A| + 1 actions), and with
    interference β > 0 the shared S (|A| + 2 states, |A| + 1 actions), initially 0.

    States: 0..|A|−1 after token A[i], |A| after OTHER, |A|+1 = BOS. Actions: 0..|A|−1 = A[i], |A| = OTHER.
    """

    def __init__(self, vocab: Vocab, bandit: Bandit, profile: Profile, *, seed: int, noise: float = 0.3,
                 max_new_tokens: int = 5, interference: float = 0.0):
        super().__init__()
        self.vocab, self.max_new_tokens, self.interference = vocab, max_new_tokens, interference
        self.tokens = action_tokens(vocab)                                   # A (sorted real ids)
        n = len(self.tokens)
        self.other, self.bos = n, n + 1
        lookup = np.full(vocab.vocab_size, n, dtype=np.int64)               # real id → action (OTHER if not in A)
        lookup[self.tokens] = np.arange(n)
        self.action_of = torch.from_numpy(lookup)
        in_a = np.zeros(vocab.vocab_size, dtype=bool)
        in_a[self.tokens] = True
        self._rest = np.flatnonzero(~in_a & ~vocab.is_special)              # what OTHER emits
        self.log_rest = math.log(len(self._rest))
        self.eos = int(vocab.eos_id)
        self.prompts = [vocab.encode(p.question).tolist() for p in bandit.problems]
        self.context_of = {tuple(p): c for c, p in enumerate(self.prompts)}
        self.W = torch.nn.Parameter(torch.from_numpy(self._initial(bandit, profile, seed, noise)))
        self.S = torch.nn.Parameter(torch.zeros(self.W.shape[1:])) if interference > 0 else None

    def logits(self) -> torch.Tensor:
        """W[c, s] + β·S[s] for every context and state, (C, |A| + 2, |A| + 1)."""
        return self.W if self.S is None else self.W + self.interference * self.S[None]

    # --- the initial logits -----------------------------------------------------------------------------
    def _path(self, text: str) -> tuple[int, ...]:
        return (*(int(self.action_of[i]) for i in self.vocab.encode(text)), int(self.action_of[self.eos]))

    def _initial(self, bandit: Bandit, profile: Profile, seed: int, noise: float) -> np.ndarray:
        rng = np.random.default_rng([seed, 13])
        n_act = len(self.tokens) + 1
        W = noise * rng.standard_normal((len(bandit), n_act + 1, n_act))
        W[:, :, self.other] += OTHER_LOGIT
        for c, problem in enumerate(bandit.problems):
            answer = int(problem.answer)
            paths = {}
            targets = [(answer, profile.p_strong)] if profile.strong[c] else \
                [(answer, profile.p_weak), (distractor(answer), profile.p_distract)]
            for value, p in targets:
                for name, weight in profile.formats.items():
                    if weight > 0 and p > 0:
                        path = self._path(FORMATS[name].format(value))
                        paths[path] = paths.get(path, 0.0) + p * weight
            for state, favoured in _conditionals(paths, self.bos).items():
                _set_conditionals(W[c, state], favoured)
        return W.astype(np.float32)

    # --- sampling -------------------------------------------------------------------------------------
    def generate(self, contexts: list[int], rng: np.random.Generator | None, greedy: bool = False) -> list[Sample]:
        """One response per context (repeat a context for a group), with behaviour log-probs (temperature 1).

        Categorical sampling by the Gumbel-max trick (numpy: small arrays, microseconds per step); greedy takes
        the argmax (OTHER, if ever the argmax, emits the first token of the rest)."""
        n, T = len(contexts), self.max_new_tokens
        W = self.logits().detach().numpy()
        c = np.asarray(contexts)
        rows = np.arange(n)
        state = np.full(n, self.bos)
        tokens = np.zeros((n, T), dtype=np.int64)
        logps = np.zeros((n, T))
        alive = np.ones(n, dtype=bool)
        lengths = np.full(n, T)
        for t in range(T):
            z = W[c, state].astype(np.float64)                                  # (n, |A| + 1)
            z -= z.max(1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(1, keepdims=True))
            a = logp.argmax(1) if greedy else (logp + rng.gumbel(size=logp.shape)).argmax(1)
            other = a == self.other
            tok = self.tokens[np.minimum(a, len(self.tokens) - 1)]
            if other.any():
                drawn = [0] if greedy else rng.integers(len(self._rest), size=int(other.sum()))
                tok[other] = self._rest[drawn]
            tokens[:, t] = tok
            logps[:, t] = logp[rows, a] - other * self.log_rest
            ended = alive & (tok == self.eos)
            lengths[ended] = t + 1
            alive &= ~ended
            state = a
        out = []
        for c_i, row, lp, L, cut in zip(contexts, tokens.tolist(), logps.tolist(), lengths.tolist(), alive.tolist()):
            ids = row[:L]
            out.append(Sample(prompt_ids=self.prompts[c_i], ids=ids, logprobs=lp[:L], text=decode(self.vocab, ids),
                              truncated=cut))
        return out

    # --- the trainer's completion_logprobs --------------------------------------------------------------
    def completion_logprobs(self, prompts: list[list[int]],
                            completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """log π_θ(y_t | x, y_<t) of each completion token, (n, L) right-padded, and its mask (n, L), as
        mrl_trainer.logprobs.completion_logprobs (temperature 1); the prompt names the context."""
        c = torch.tensor([self.context_of[tuple(p)] for p in prompts])
        lengths = torch.tensor([len(y) for y in completions])
        mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]                 # (n, L)
        ids = torch.full(mask.shape, self.eos, dtype=torch.int64)
        ids[mask] = torch.tensor([i for y in completions for i in y], dtype=torch.int64)
        actions = self.action_of[ids]
        states = torch.cat([torch.full((len(prompts), 1), self.bos), actions[:, :-1]], 1)
        logp = torch.log_softmax(self.logits()[c[:, None], states], -1).gather(-1, actions[..., None]).squeeze(-1)
        return logp - (actions == self.other) * self.log_rest, mask.float()


def _conditionals(paths: dict[tuple[int, ...], float], bos: int) -> dict[int, dict[int, float]]:
    """state → {action: target conditional q} from favoured paths (action tuples) and their probabilities."""
    mass: dict[tuple, float] = {(): sum(paths.values())}
    for path, p in paths.items():
        for t in range(1, len(path) + 1):
            mass[path[:t]] = mass.get(path[:t], 0.0) + p
    total, longest = mass[()], max(len(p) for p in paths) if paths else 1
    if total <= 0:
        return {}
    retain = total ** (1.0 / longest)
    out: dict[int, dict[int, float]] = {}
    for prefix, m in mass.items():
        if not prefix:
            continue
        parent = prefix[:-1]
        state = parent[-1] if parent else bos
        q = retain * m / mass[parent]
        favoured = out.setdefault(state, {})
        favoured[prefix[-1]] = max(favoured.get(prefix[-1], 0.0), q)
    return out


def _set_conditionals(row: np.ndarray, favoured: dict[int, float], floor: float = 1e-4) -> None:
    """Logits of one state with the favoured actions at exactly their conditional q (the others keep their
    relative noise): W_v = log q_v + log(Σ_{u not favoured} e^{W_u} / (1 − Σ q))."""
    q = {a: max(v, floor) for a, v in favoured.items()}
    total = sum(q.values())
    if total > 0.99:
        q = {a: v * 0.99 / total for a, v in q.items()}
        total = 0.99
    others = np.ones(len(row), dtype=bool)
    others[list(q)] = False
    rest = float(np.exp(row[others]).sum())
    for a, v in q.items():
        row[a] = math.log(v) + math.log(rest / (1.0 - total))

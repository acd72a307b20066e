"""The sharing modes (mrl_trainer.sharing, docs/algorithms.md) on hand-made batches whose answer is known: the plan
(advantages, extras, totals, stats) and the loss terms (value and gradient w.r.t. per-token log-probs) of none,
XGRPO, SGT, PRP and HACPO; micro-batching of the extra terms; and, once, Trainer.update with a hand-made Plan on
the tiny GPT-2-architecture policy of test_trainer_loop.py. Pure tensor tests apart from that."""
import math
import statistics

import pytest
import torch

from mrl_trainer.config import LossConfig
from mrl_trainer.experience import StepBatch
from mrl.algorithms import group_advantages, policy_loss
from mrl_trainer.rollout.base import Sample
from mrl_trainer.sharing import SHARING_MODES, Extra, PeerBatch, PeerSample, Plan, Verifier, sharing_config
from mrl.algorithms import cross_log_ratio
from mrl.algorithms.hacpo import capability_ratio, mixed_advantages, peer_loss, stepwise_lower_bound
from mrl.algorithms.prp import truncated_ratio
from mrl.tasks import Problem

EPS = 1e-4          # the advantages' std epsilon (losses.advantages)


# --- hand-made batches ---------------------------------------------------------------------------------------
def make_batch(rewards: list[list[float]], lengths: list[list[int]] | None = None) -> StepBatch:
    """P prompts × G samples with the given rewards; sample (p, i) has lengths[p][i] tokens (default 2)."""
    problems = [Problem(prompt_id=f"toy:train:0:{p}", question=f"q{p}", answer=f"a{p}") for p in range(len(rewards))]
    samples = [[Sample(prompt_ids=[1, 2], ids=list(range(10, 10 + (lengths[p][i] if lengths else 2))),
                       logprobs=[-1.0] * (lengths[p][i] if lengths else 2), text=f"y{p}.{i}", truncated=False)
                for i in range(len(group))] for p, group in enumerate(rewards)]
    return StepBatch(step=0, problems=problems, samples=samples, rewards=[list(map(float, g)) for g in rewards],
                     answers=[[None] * len(g) for g in rewards])


def peer(prompt_index: int, n_tokens: int, reward: float, *, behaviour: float = -1.0, text: str | None = None,
         producer: str = "j") -> PeerSample:
    """A peer sample whose text, by default, is what answer_verifier scores `reward` (the answer iff reward 1);
    one tokenizer (a chunk per token), `behaviour` the producer's mean log-prob per token."""
    text = (f"a{prompt_index}" if reward >= 1 else f"score:{reward}") if text is None else text
    return PeerSample(producer=producer, prompt_index=prompt_index, ids=list(range(20, 20 + n_tokens)), text=text,
                      reward=reward, behaviour_logp=behaviour * n_tokens, chunks=n_tokens)


def answer_verifier(batch: StepBatch) -> Verifier:
    """This policy's verifier: 1 iff the text is the problem's reference answer; "score:x" scores x (partial credit)."""
    return Verifier(batch, lambda problem, text: 1.0 if text == problem.answer else
                    float(text[6:]) if text.startswith("score:") else 0.0)


def mode(name: str, loss: LossConfig | None = None, **sharing):
    cfg = sharing_config(mode=name, **sharing)
    return SHARING_MODES[name](cfg, loss or LossConfig())


def plan_of(m, batch, peers=None, capability=0.5):
    return m.plan(batch, peers or PeerBatch(), capability=capability, verify=answer_verifier(batch))


def rows(values: list[list[float]], width: int | None = None, pad: float = float("nan")):
    """(N, T) log-probs (requires_grad, float64) right-padded with `pad`, and the mask."""
    width = width or max(len(v) for v in values)
    logp = torch.tensor([v + [pad] * (width - len(v)) for v in values], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0] * len(v) + [0.0] * (width - len(v)) for v in values], dtype=torch.float64)
    return logp, mask


def own_step_loss(m, plan, batch, logp, mask, max_tokens=8):
    """The own-sample loss as the trainer computes it at update 0 (π_old = π_θ detached), all rows at once."""
    return m.own_loss(logp, logp.detach(), plan.advantages.to(logp.dtype), mask, ref_logp=None,
                      max_tokens=max_tokens, totals=plan.totals)[0]


def own_rows(batch: StepBatch, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return rows([(-3 * torch.rand(len(s.ids), generator=g, dtype=torch.float64)).tolist()
                 for group in batch.samples for s in group])


# --- none ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [True, False])
def test_none_plan_is_group_advantages_of_the_rewards(scale):
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 0.5, 0, 0]]
    batch = make_batch(rewards, [[1, 2, 3, 4], [2, 2, 2, 2], [5, 1, 1, 1]])
    plan = plan_of(mode("none", LossConfig(scale_rewards=scale)), batch)
    assert torch.equal(plan.advantages, group_advantages(torch.tensor(rewards, dtype=torch.float32),
                                                         scale=scale).flatten())
    assert plan.extras == [] and plan.totals == {"num_sequences": 12, "num_tokens": 10 + 8 + 8}
    with pytest.raises(NotImplementedError):
        mode("none").extra_loss(*rows([[-1.0]]), [Extra(0, [1])], update=0, max_tokens=8, totals={})


@pytest.mark.parametrize("name", ["xgrpo", "prp", "hacpo"])
def test_on_a_prompt_no_peer_reached_the_advantages_are_solos_exactly(name):
    """The guard takes g_s from the own gradient wherever the plan left solo's advantages (mrl_trainer.update),
    which it checks by exact equality: partial-credit rewards, peers on prompt 1 only."""
    rewards = [[1, 0.3, 0, 0.7, 0.5], [0.3, 0.7, 0.5, 0, 1], [0.5, 0.5, 0.3, 1, 0.7]]
    batch = make_batch(rewards)
    peers = PeerBatch(group_rewards={1: [1, 1]}, rollouts={1: [peer(1, 2, 1.0), peer(1, 2, 0.0)]},
                      capability={"j": 0.5})
    solo = plan_of(mode("none"), batch).advantages
    plan = plan_of(mode(name), batch, peers)
    assert torch.equal(plan.advantages[:5], solo[:5]) and torch.equal(plan.advantages[10:], solo[10:])
    assert not torch.equal(plan.advantages[5:10], solo[5:10])


# --- XGRPO ---------------------------------------------------------------------------------------------------
def _xgrpo_case():
    batch = make_batch([[1, 0, 0, 0], [0, 1, 1, 0]])
    peers = PeerBatch(group_rewards={0: [1, 1, 0, 0]})          # stats for prompt 0 only
    return batch, peers


@pytest.mark.parametrize("scale", [True, False])
def test_xgrpo_baseline_pools_own_and_peer_rewards(scale):
    batch, peers = _xgrpo_case()
    plan = plan_of(mode("xgrpo", LossConfig(scale_rewards=scale)), batch, peers)
    pool = [1, 0, 0, 0, 1, 1, 0, 0]
    mean, std = 3 / 8, statistics.stdev(pool)                  # unbiased (n − 1)
    assert math.isclose(std, math.sqrt(1.875 / 7))
    denominator = std + EPS if scale else 1.0
    expected_0 = [(r - mean) / denominator for r in [1, 0, 0, 0]]
    own_1 = [0, 1, 1, 0]                                       # no peer stats: its own group's GRPO advantages
    expected_1 = [(r - 0.5) / ((statistics.stdev(own_1) + EPS) if scale else 1.0) for r in own_1]
    assert plan.advantages.shape == (8,)
    assert torch.allclose(plan.advantages, torch.tensor(expected_0 + expected_1), atol=1e-6)
    assert plan.stats["xgrpo_pooled"] == (8 + 4) / 2


def test_xgrpo_without_peer_stats_is_grpo():
    batch, _ = _xgrpo_case()
    for scale in (True, False):
        loss = LossConfig(scale_rewards=scale)
        assert torch.equal(plan_of(mode("xgrpo", loss), batch).advantages,
                           plan_of(mode("none", loss), batch).advantages)
    # peer stats for a prompt index outside the batch change nothing either
    assert torch.equal(plan_of(mode("xgrpo"), batch, PeerBatch(group_rewards={7: [1.0]})).advantages,
                       plan_of(mode("none"), batch).advantages)


def test_xgrpo_uniform_groups_pooled_pushes_an_all_failed_group_down_and_zero_leaves_it():
    """Own group 0 all failed, a peer succeeded on it; own group 1 has a spread."""
    batch = make_batch([[0, 0, 0, 0], [0, 1, 1, 0]])
    peers = PeerBatch(group_rewards={0: [1, 1, 0, 0], 1: [1, 1, 1, 1]})
    pooled = plan_of(mode("xgrpo", xgrpo={"uniform_groups": "pooled"}), batch, peers)
    assert bool((pooled.advantages[:4] < 0).all()) and pooled.stats["xgrpo_uniform"] == 1
    zero = plan_of(mode("xgrpo"), batch, peers)                                    # the default
    assert torch.equal(zero.advantages[:4], torch.zeros(4)) and zero.stats["xgrpo_uniform"] == 1
    assert torch.equal(zero.advantages[4:], pooled.advantages[4:])        # a group with a spread: as pooled
    assert plan_of(mode("xgrpo"), batch, PeerBatch()).stats["xgrpo_uniform"] == 0    # no pool: GRPO's zeros


def test_xgrpo_gradient_comes_only_from_own_samples():
    batch, peers = _xgrpo_case()
    m = mode("xgrpo", LossConfig(aggregation="token-mean"))
    plan = plan_of(m, batch, peers)
    assert plan.extras == [] and plan.extra_totals == {}
    assert plan.totals == {"num_sequences": 8, "num_tokens": 16}   # own samples only
    with pytest.raises(NotImplementedError):
        m.extra_loss(*rows([[-1.0]]), [Extra(0, [1])], update=0, max_tokens=8, totals={})
    # Own rows plus two rows standing for peer sequences: only the own rows enter the loss.
    logp, mask = own_rows(batch)
    stranger = torch.zeros(2, logp.shape[1], dtype=torch.float64, requires_grad=True)
    all_rows = torch.cat([logp, stranger])
    loss = own_step_loss(m, plan, batch, all_rows[:8], mask)
    loss.backward()
    assert stranger.grad is None or not stranger.grad.any()
    # r = 1 at update 0, token-mean over the 16 own tokens: ∂L/∂logp_{i,t} = −A_i / 16
    expected = (-plan.advantages.double() / 16)[:, None].expand_as(mask) * mask
    assert torch.allclose(logp.grad, expected, atol=1e-12)


# --- SGT -----------------------------------------------------------------------------------------------------
def test_sgt_adds_nothing_when_the_own_group_succeeded():
    batch = make_batch([[1, 0, 0, 0], [0, 1, 0, 0]])
    peers = PeerBatch(successes={0: [peer(0, 3, 1.0, text="a0")], 1: [peer(1, 2, 1.0, text="a1")]})
    sgt, none = mode("sgt"), mode("none")
    plan, base = plan_of(sgt, batch, peers), plan_of(none, batch)
    assert plan.extras == []
    assert plan.stats == {"sgt_rescued": 0, "sgt_accepted": 0, "sgt_rejected": 0}
    assert torch.equal(plan.advantages, base.advantages) and plan.totals == base.totals
    logp, mask = own_rows(batch)
    assert torch.equal(own_step_loss(sgt, plan, batch, logp, mask), own_step_loss(none, base, batch, logp, mask))


def test_sgt_rescues_one_verified_success_per_prompt_with_lambda_nll():
    batch = make_batch([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    first, second = peer(0, 3, 1.0, text="a0", producer="j"), peer(0, 2, 1.0, text="a0", producer="l")
    peers = PeerBatch(successes={0: [first, second], 1: [peer(1, 2, 1.0, text="a1")],
                                 2: [peer(2, 4, 1.0, text="a2")]})
    sgt = mode("sgt", sgt={"lam": 0.1})
    plan = plan_of(sgt, batch, peers)
    assert plan.extras == [Extra(prompt_index=0, ids=first.ids), Extra(prompt_index=2, ids=peers.successes[2][0].ids)]
    assert plan.extra_totals == {"nll_divisor": 2}
    assert plan.stats == {"sgt_rescued": 2, "sgt_accepted": 3, "sgt_rejected": 0}
    assert torch.equal(plan.advantages, plan_of(mode("none"), batch).advantages)   # own part: GRPO
    logp, mask = rows([[-0.5, -1.0, -1.5], [-2.0, -2.0, -2.0, -2.0]])
    loss, stats = sgt.extra_loss(logp, mask, plan.extras, update=0, max_tokens=8, totals=plan.extra_totals)
    # λ · (1/|S|) Σ_y mean_t −log π: mean NLLs 1.0 and 2.0, |S| = 2
    assert math.isclose(loss.item(), 0.1 * (1.0 + 2.0) / 2, rel_tol=1e-12)
    assert torch.allclose(stats["sgt_nll"], torch.tensor([1.0, 2.0], dtype=torch.float64))
    loss.backward()
    expected = torch.tensor([[-0.1 / (3 * 2)] * 3 + [0.0], [-0.1 / (4 * 2)] * 4], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-15)
    assert sgt.summarize({"sgt_nll": stats["sgt_nll"]}) == {"sgt_nll": 1.5}


def test_sgt_normalize_prompts_weighs_the_nll_by_how_much_was_rescued():
    """Three prompts, one rescued: 'responses' gives the rescued NLL the full λ, 'prompts' λ/3."""
    batch = make_batch([[0, 0], [1, 0], [1, 1]])
    peers = PeerBatch(successes={0: [peer(0, 2, 1.0, text="a0")]})
    logp, mask = rows([[-0.2, -0.4]])
    losses = {}
    for normalize in ("responses", "prompts"):
        sgt = mode("sgt", sgt={"normalize": normalize})
        plan = plan_of(sgt, batch, peers)
        losses[normalize] = sgt.extra_loss(logp, mask, plan.extras, update=0, max_tokens=8,
                                           totals=plan.extra_totals)[0].item()
    assert losses["responses"] == pytest.approx(0.1 * 0.3) and losses["prompts"] == pytest.approx(0.1 * 0.3 / 3)


def test_sgt_single_rescue_has_per_prompt_one():
    batch = make_batch([[0, 0]])
    peers = PeerBatch(successes={0: [peer(0, 2, 1.0, text="a0"), peer(0, 3, 1.0, text="a0")]})
    plan = plan_of(mode("sgt"), batch, peers)
    assert len(plan.extras) == 1 and plan.extra_totals == {"nll_divisor": 1}
    logp, mask = rows([[-0.2, -0.4]])
    loss, _ = mode("sgt").extra_loss(logp, mask, plan.extras, update=0, max_tokens=8, totals=plan.extra_totals)
    assert math.isclose(loss.item(), 0.1 * 0.3, rel_tol=1e-12)        # λ = 0.1 by default


def test_sgt_poisoned_peer_changes_nothing():
    """A peer claims successes (reward 1) for wrong answers: the receiver's verifier says 0, nothing is added."""
    batch = make_batch([[0, 0, 0, 0], [0, 1, 0, 1]], [[2, 3, 1, 2], [1, 2, 3, 4]])
    poisoned = PeerBatch(successes={0: [peer(0, 3, 1.0, text="wrong"), peer(0, 2, 1.0, text="also wrong")]})
    sgt, none = mode("sgt", LossConfig(aggregation="seq-mean-token-mean")), \
        mode("none", LossConfig(aggregation="seq-mean-token-mean"))
    plan, base = plan_of(sgt, batch, poisoned), plan_of(none, batch)
    assert plan.extras == [] and plan.stats["sgt_rejected"] == 2
    assert plan.stats["sgt_accepted"] == 0 and plan.stats["sgt_rescued"] == 0
    assert torch.equal(plan.advantages, base.advantages) and plan.totals == base.totals
    grads = []
    for m, p in ((sgt, plan), (none, base)):
        logp, mask = own_rows(batch, seed=3)
        total = own_step_loss(m, p, batch, logp, mask)           # + Σ extra_loss over no extras
        total.backward()
        grads.append((total.detach(), logp.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("tau, rescued", [(0.0, False), (0.2, False), (0.25, True), (0.5, True)])
def test_sgt_tau_gate(tau, rescued):
    batch = make_batch([[1, 0, 0, 0]])                                   # own success rate 0.25
    peers = PeerBatch(successes={0: [peer(0, 2, 1.0, text="a0")]})
    plan = plan_of(mode("sgt", sgt={"tau": tau}), batch, peers)
    assert len(plan.extras) == int(rescued) and plan.stats["sgt_rescued"] == int(rescued)


# --- PRP -----------------------------------------------------------------------------------------------------
def _prp_case():
    batch = make_batch([[1, 0]], [[2, 3]])
    peers = PeerBatch(rollouts={0: [peer(0, 2, 1.0, behaviour=-1.0), peer(0, 4, 0.0, behaviour=-2.0)]})
    return batch, peers


def test_prp_pools_advantages_and_totals():
    batch, peers = _prp_case()
    plan = plan_of(mode("prp"), batch, peers)
    a = 0.5 / (statistics.stdev([1, 0, 1, 0]) + EPS)                    # pool {1, 0 | 1, 0}: mean 0.5
    assert torch.allclose(plan.advantages, torch.tensor([a, -a]), atol=1e-6)
    assert [(e.prompt_index, e.ids, e.behaviour_logp / e.chunks) for e in plan.extras] == \
        [(0, peers.rollouts[0][0].ids, -1.0), (0, peers.rollouts[0][1].ids, -2.0)]
    assert math.isclose(plan.extras[0].advantage, a, rel_tol=1e-6)
    assert math.isclose(plan.extras[1].advantage, -a, rel_tol=1e-6)
    assert plan.totals == plan.extra_totals == {"num_sequences": 4, "num_tokens": 2 + 3 + 2 + 4}
    assert plan.stats["peer_samples"] == 2


def test_prp_zero_advantage_peers_are_no_extras_but_count_in_totals():
    batch = make_batch([[1, 0], [1, 1]], [[2, 3], [1, 1]])
    peers = PeerBatch(rollouts={0: [peer(0, 5, 0.5)],                     # pool {1, 0, 0.5}: A(0.5) = 0
                                1: [peer(1, 7, 1.0)]})                    # pool all 1: A = 0
    plan = plan_of(mode("prp"), batch, peers)
    assert plan.extras == []
    assert plan.totals == {"num_sequences": 6, "num_tokens": 2 + 3 + 1 + 1 + 5 + 7}
    a = 0.5 / (statistics.stdev([1, 0, 0.5]) + EPS)
    assert torch.allclose(plan.advantages, torch.tensor([a, -a, 0.0, 0.0]), atol=1e-6)


def test_prp_per_prompt_cap_and_empty_peers():
    batch = make_batch([[1, 0]])
    peers = PeerBatch(rollouts={0: [peer(0, 0, 1.0)] + [peer(0, 1, float(i % 2)) for i in range(5)]})
    plan = plan_of(mode("prp", prp={"per_prompt": 3}), batch, peers)
    assert plan.stats["peer_samples"] == 3                                # the empty one is skipped, then 3 kept
    assert plan.totals == {"num_sequences": 5, "num_tokens": 4 + 3}


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_prp_peer_term_is_a_truncated_stopped_gradient_weight(aggregation):
    batch, peers = _prp_case()
    prp = mode("prp", LossConfig(aggregation=aggregation), prp={"c": 1.0})
    plan = plan_of(prp, batch, peers)
    # peer a: mean logp −0.6, behaviour −1.0 → log ρ = 0.4, ρ = e^0.4 > c → ρ̄ = 1
    # peer b: mean logp −2.5, behaviour −2.0 → log ρ = −0.5, ρ̄ = e^−0.5
    logp, mask = rows([[-0.5, -0.7], [-2.5, -2.5, -2.5, -2.5]])
    log_rho, rho_bar = truncated_ratio(logp, mask, torch.tensor([-2.0, -8.0], dtype=torch.float64),
                                       torch.tensor([2.0, 4.0], dtype=torch.float64), 1.0)
    assert torch.allclose(log_rho, torch.tensor([0.4, -0.5], dtype=torch.float64))
    assert torch.allclose(rho_bar, torch.tensor([1.0, math.exp(-0.5)], dtype=torch.float64))
    assert not rho_bar.requires_grad
    max_tokens = 6
    loss, stats = prp.extra_loss(logp, mask, plan.extras, update=0, max_tokens=max_tokens, totals=plan.extra_totals)
    a = plan.extras[0].advantage
    weights, advantages, lengths = [1.0, math.exp(-0.5)], [a, -a], [2, 4]
    token_sums = [-w * adv * sum(v for v in row if not math.isnan(v))
                  for w, adv, row in zip(weights, advantages, [[-0.5, -0.7], [-2.5] * 4])]
    n, m = 4, 11                                                            # pooled totals
    per_token_scale = {"token-mean": [1 / m, 1 / m], "seq-mean-token-mean": [1 / (n * l) for l in lengths],
                       "seq-mean-token-sum-norm": [1 / (n * max_tokens)] * 2}[aggregation]
    expected_value = sum(s * k for s, k in zip(token_sums, per_token_scale))
    assert math.isclose(loss.item(), expected_value, rel_tol=1e-6)
    loss.backward()
    # stopped-gradient weight: ∂L/∂logp_{i,t} = −ρ̄_i · A_i · scale_i (no term from ∂ρ̄/∂logp)
    expected = torch.tensor([[-w * adv * k] * l + [0.0] * (4 - l)
                             for w, adv, k, l in zip(weights, advantages, per_token_scale, lengths)],
                            dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, rtol=1e-6, atol=1e-12)
    assert torch.allclose(stats["log_rho"], torch.tensor([0.4, -0.5], dtype=torch.float64))


def test_prp_summarize():
    prp = mode("prp", prp={"c": 1.0})
    log_rho = torch.tensor([0.4, -0.5, 0.1, -0.2])
    out = prp.summarize({"log_rho": log_rho})
    values = [0.4, -0.5, 0.1, -0.2]
    mean = sum(values) / 4
    assert math.isclose(out["prp_log_rho_var"], sum((v - mean) ** 2 for v in values) / 4, rel_tol=1e-6)
    assert out["prp_truncated"] == 0.5                                     # ρ > 1 for 0.4 and 0.1
    assert math.isclose(out["prp_rho_mean"], sum(math.exp(v) for v in values) / 4, rel_tol=1e-6)


# --- HACPO ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p_k, p_j, omega", [
    (0.5, 0.25, 2.0), (0.25, 0.5, 0.5), (0.9, 0.01, 10.0), (0.01, 0.9, 0.1), (0.0, 0.0, 1.0), (0.5, 0.0, 10.0),
    (0.0, 0.5, 0.1), (0.3, 0.3, 1.0)])
def test_capability_ratio_clamps_and_handles_zeros(p_k, p_j, omega):
    assert math.isclose(capability_ratio(p_k, p_j), omega)


def test_mixed_advantages_by_hand():
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0], dtype=torch.float64)
    omegas = torch.tensor([1.0, 1, 1, 1, 2, 2], dtype=torch.float64)
    own = torch.tensor([True] * 4 + [False] * 2)
    mu = (1 + 0 + 0 + 1 + 2 * 1 + 2 * 0) / 6
    sigma = statistics.stdev([1, 0, 0, 1, 1, 0])
    expected = torch.tensor([(r - mu) / (sigma + EPS) for r in [1, 0, 0, 1, 1, 0]], dtype=torch.float64)
    assert torch.allclose(mixed_advantages(rewards, omegas, own), expected)
    assert torch.allclose(mixed_advantages(rewards, omegas, own, scale=False), rewards - mu)


def test_mixed_advantages_safeguards():
    own = torch.tensor([True, True, False, False])
    for value in (0.0, 1.0, 0.3):                # all equal → A = 0, though ω·R would move μ̂ off R (σ = 0)
        for omegas in ([1.0, 1, 10, 10], [1.0, 1, 0.1, 0.5]):
            rewards = torch.full((4,), value, dtype=torch.float64)
            assert torch.equal(mixed_advantages(rewards, torch.tensor(omegas, dtype=torch.float64), own),
                               torch.zeros(4, dtype=torch.float64))
            assert torch.equal(mixed_advantages(rewards, torch.tensor(omegas, dtype=torch.float64), own, scale=False),
                               torch.zeros(4, dtype=torch.float64))
    rewards = torch.tensor([1.0, 0, 1, 1], dtype=torch.float64)
    omegas = torch.tensor([1.0, 1, 10, 10], dtype=torch.float64)          # μ̂ = 21/4 > 1 → own mean 0.5
    expected = (rewards - 0.5) / (statistics.stdev([1, 0, 1, 1]) + EPS)
    assert torch.allclose(mixed_advantages(rewards, omegas, own), expected)


def test_stepwise_lower_bound_rises_with_each_update_and_is_capped():
    bounds = [stepwise_lower_bound(0.2, 0.01, m) for m in range(30)]
    assert math.isclose(bounds[0], 0.8) and math.isclose(bounds[5], 0.85)
    assert all(b < c for b, c in zip(bounds[:20], bounds[1:21]))           # strictly rising up to the cap
    assert all(b == 1.0 for b in bounds[20:]) and max(bounds) == 1.0
    assert stepwise_lower_bound(0.2, 0.025, 3) == pytest.approx(0.875)
    assert stepwise_lower_bound(0.2, 0.0, 100) == pytest.approx(0.8)


def test_hacpo_extra_loss_reports_the_lower_bound_of_update_m():
    hacpo = mode("hacpo", hacpo={"delta": 0.2, "delta_step": 0.025})
    extras = [Extra(0, [1, 2], advantage=0.5, behaviour_logp=-2.0, chunks=2, weight=1.0)]
    for m, lower in ((0, 0.8), (1, 0.825), (4, 0.9), (8, 1.0), (50, 1.0)):
        logp, mask = rows([[-1.05, -1.05]])                                # s = e^−0.05 ≈ 0.951
        _, stats = hacpo.extra_loss(logp, mask, extras, update=m, max_tokens=8,
                                    totals={"num_sequences": 1, "num_tokens": 2})
        assert stats["lower_bound"].tolist() == pytest.approx([lower])
        assert stats["clipped"].tolist() == [float(math.exp(-0.05) < lower)]
    assert hacpo.summarize({"lower_bound": torch.tensor([0.9, 0.9])}) == {"hacpo_lower_bound": pytest.approx(0.9)}


@pytest.mark.parametrize("alpha", [1.0, 3.0])
def test_peer_loss_has_no_min_and_stops_the_weight_gradient(alpha):
    # three peers: s inside [0.8, 1], s below (clipped up to 0.8), s above 1 (clipped down to 1)
    logp, mask = rows([[-1.1, -1.1, -1.1], [-1.5, -1.5], [-0.9]])
    chunks = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    behaviour = -1.0 * chunks                                              # −1 per token
    advantages = torch.tensor([0.5, -0.7, 0.9], dtype=torch.float64)
    omega = torch.tensor([2.0, 0.5, 3.0], dtype=torch.float64)
    loss, ratio = peer_loss(logp, mask, behaviour, chunks, advantages, omega, lower=0.8, alpha=alpha,
                            aggregation="seq-mean-token-mean", num_sequences=5)
    s = [math.exp(-0.1), math.exp(-0.5), math.exp(0.1)]
    assert torch.allclose(ratio, torch.tensor(s, dtype=torch.float64))
    s_bar = [s[0], 0.8, 1.0]
    terms = [-sb * sb ** alpha * w * a for sb, w, a in zip(s_bar, [2.0, 0.5, 3.0], [0.5, -0.7, 0.9])]
    assert math.isclose(loss.item(), sum(terms) / 5, rel_tol=1e-12)
    # a negative advantage with s clipped low: −0.8·0.8^α·ω·A > 0 — no min() with the unclipped s·A
    assert terms[1] > 0
    loss.backward()
    # inside: ∂/∂logp_t [−s · sg(s)^α ω A] / N = −s^(1+α) ω A / (|y| N); clipped rows: 0
    inside = -s[0] ** (1 + alpha) * 2.0 * 0.5 / (3 * 5)
    expected = torch.tensor([[inside] * 3, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected, atol=1e-15)


def _hacpo_case():
    batch = make_batch([[1, 0, 0, 1]], [[2, 2, 2, 2]])
    peers = PeerBatch(rollouts={0: [peer(0, 3, 1.0, behaviour=-1.0, producer="j"),
                                    peer(0, 2, 0.0, behaviour=-2.0, producer="j")]},
                      capability={"j": 0.25})
    return batch, peers


def test_hacpo_plan_uses_omega_kj_in_the_baseline_and_omega_jk_on_peers():
    batch, peers = _hacpo_case()
    hacpo = mode("hacpo")
    plan = plan_of(hacpo, batch, peers, capability=1.0)   # P̂^j measured 0.5: ω^(k,j) = 1/0.5 = 2, ω^(j,k) = 0.5
    rewards = [1, 0, 0, 1, 1, 0]
    mu = (1 + 0 + 0 + 1 + 2 * 1 + 2 * 0) / 6
    sigma = statistics.stdev(rewards)
    expected = [(r - mu) / (sigma + EPS) for r in rewards]
    assert torch.allclose(plan.advantages, torch.tensor(expected[:4]), atol=1e-6)
    assert [e.weight for e in plan.extras] == [0.5, 0.5]
    assert [e.advantage for e in plan.extras] == pytest.approx(expected[4:])
    assert [e.behaviour_logp / e.chunks for e in plan.extras] == [-1.0, -2.0]
    assert plan.stats["hacpo_omega_mean"] == 0.5 and plan.stats["peer_samples"] == 2
    assert plan.stats["hacpo_peer_capability"] == 0.5 and plan.stats["hacpo_capability_gap"] == 0.25  # claimed 0.25
    assert plan.totals == plan.extra_totals == {"num_sequences": 6, "num_tokens": 8 + 5}


def test_hacpo_measures_a_peers_capability_and_ignores_its_claim():
    """P̂^j is the mean, over the last K steps, of the re-scored rewards of j's pooled rollouts: a peer that
    claims P̂ = 1 (for 10× weight) or says nothing gets the same ω."""
    batch, peers = _hacpo_case()
    truthful = plan_of(mode("hacpo"), batch, peers, capability=1.0)
    for claim in ({"j": 1.0}, {}):
        lying = plan_of(mode("hacpo"), batch, PeerBatch(rollouts=peers.rollouts, capability=claim), capability=1.0)
        assert [e.weight for e in lying.extras] == [e.weight for e in truthful.extras] == [0.5, 0.5]
        assert torch.equal(lying.advantages, truthful.advantages)
    hacpo = mode("hacpo", window=2)
    wrong = PeerBatch(rollouts={0: [peer(0, 3, 0.0, producer="j"), peer(0, 2, 0.0, producer="j")]})
    assert hacpo.measure_capabilities([peers.rollouts[0]]) == {"j": 0.5}           # rewards 1, 0
    assert hacpo.measure_capabilities([wrong.rollouts[0]]) == {"j": 0.25}          # (0.5 + 0) / 2
    assert hacpo.measure_capabilities([wrong.rollouts[0]]) == {"j": 0.0}           # window K = 2: (0 + 0) / 2
    assert hacpo.measure_capabilities([[]]) == {}                                  # j sent nothing this step


@pytest.mark.parametrize("name", ["prp", "hacpo"])
def test_peer_pool_uniform_groups_pooled_pushes_an_all_failed_group_down_and_zero_leaves_it(name):
    """Own group 0 all failed while the peer succeeded on it; own group 1 has a spread. Under 'zero' group 0 keeps
    GRPO's A = 0 and the peer's samples keep their pooled advantages."""
    batch = make_batch([[0, 0, 0, 0], [0, 1, 1, 0]])
    peers = PeerBatch(rollouts={0: [peer(0, 3, 1.0), peer(0, 2, 0.0)], 1: [peer(1, 2, 1.0)]})
    pooled = plan_of(mode(name, **{name: {"uniform_groups": "pooled"}}), batch, peers, capability=0.5)
    assert bool((pooled.advantages[:4] < 0).all()) and pooled.stats[f"{name}_uniform"] == 1
    zero = plan_of(mode(name), batch, peers, capability=0.5)                       # the default
    assert torch.equal(zero.advantages[:4], torch.zeros(4)) and zero.stats[f"{name}_uniform"] == 1
    assert torch.equal(zero.advantages[4:], pooled.advantages[4:])        # a group with a spread: as pooled
    assert [e.advantage for e in zero.extras] == [e.advantage for e in pooled.extras] != []
    assert plan_of(mode(name), batch, PeerBatch()).stats[f"{name}_uniform"] == 0    # no pool: GRPO's zeros


def test_hacpo_extra_loss_applies_omega_jk():
    batch, peers = _hacpo_case()
    hacpo = mode("hacpo", LossConfig(aggregation="seq-mean-token-mean"))
    plan = plan_of(hacpo, batch, peers, capability=1.0)
    logp, mask = rows([[-1.1, -1.1, -1.1], [-2.1, -2.1]])                 # s = e^−0.1 both, inside [0.8, 1]
    loss, _ = hacpo.extra_loss(logp, mask, plan.extras, update=0, max_tokens=8, totals=plan.extra_totals)
    s = math.exp(-0.1)
    expected = sum(-s * s * 0.5 * e.advantage for e in plan.extras) / 6
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)


def test_hacpo_own_samples_take_the_trainers_loss():
    """HACPO's own samples take the trainer's loss (its level, clip and aggregation) with the pooled totals."""
    loss_cfg = LossConfig(level="sequence", eps_low=3e-4, eps_high=4e-4)
    hacpo, none = mode("hacpo", loss_cfg), mode("none", loss_cfg)
    old = torch.full((3, 2), -1.0, dtype=torch.float64)
    logp = (old + torch.tensor([[1e-3, 1e-3], [5e-4, -3e-4], [-1e-3, -1e-3]], dtype=torch.float64))
    advantages, mask = torch.ones(3, dtype=torch.float64), torch.ones_like(old)
    totals = {"num_sequences": 3, "num_tokens": 6}
    ours = hacpo.own_loss(logp, old, advantages, mask, ref_logp=None, max_tokens=8, totals=totals)[0]
    assert ours.item() == none.own_loss(logp, old, advantages, mask, ref_logp=None, max_tokens=8, totals=totals)[0].item()


# --- micro-batching of the extra terms -----------------------------------------------------------------------
def _random_rows(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return rows([(-3 * torch.rand(n, generator=g, dtype=torch.float64)).tolist() for n in lengths])


@pytest.mark.parametrize("name, aggregation", [
    ("prp", "token-mean"), ("prp", "seq-mean-token-mean"), ("prp", "seq-mean-token-sum-norm"),
    ("sgt", "token-mean"), ("hacpo", "seq-mean-token-mean"), ("hacpo", "token-mean")])
def test_extra_loss_over_two_halves_equals_one_call(name, aggregation):
    m = mode(name, LossConfig(aggregation=aggregation), **({"prp": {"c": 1.2}} if name == "prp" else {}))
    batch = make_batch([[0, 0, 0], [1, 0, 0], [0, 0, 0]])
    lengths = [3, 1, 4, 2, 5]
    if name == "sgt":
        peers = PeerBatch(successes={0: [peer(0, 3, 1.0, text="a0")], 2: [peer(2, 1, 1.0, text="a2")]})
        plan = plan_of(m, batch, peers)
        lengths = [len(e.ids) for e in plan.extras]
    else:
        peers = PeerBatch(rollouts={0: [peer(0, 3, 1.0, behaviour=-1.2), peer(0, 1, 0.0, behaviour=-0.3)],
                                    1: [peer(1, 4, 1.0, behaviour=-1.6), peer(1, 2, 0.0, behaviour=-1.4)],
                                    2: [peer(2, 5, 1.0, behaviour=-1.5)]},
                          capability={"j": 0.3})
        plan = plan_of(m, batch, peers, capability=0.4)
    extras = plan.extras
    assert len(extras) == len(lengths) and len(extras) >= 2
    whole_logp, mask = _random_rows(lengths, seed=11)
    whole, whole_stats = m.extra_loss(whole_logp, mask, extras, update=1, max_tokens=6, totals=plan.extra_totals)
    whole.backward()
    half = len(extras) // 2
    parts, grads, per_sequence = 0.0, [], {}
    for lo, hi in ((0, half), (half, len(extras))):
        logp, part_mask = _random_rows(lengths, seed=11)
        logp = logp[lo:hi].detach().requires_grad_(True)
        width = int(part_mask[lo:hi].sum(-1).max())                         # each part padded to its own width
        loss, stats = m.extra_loss(logp[:, :width], part_mask[lo:hi, :width], extras[lo:hi], update=1,
                                   max_tokens=6, totals=plan.extra_totals)
        loss.backward()
        parts = parts + loss.detach()
        grads.append(logp.grad)
        for key, value in stats.items():
            per_sequence.setdefault(key, []).append(value)
    assert torch.allclose(parts, whole.detach(), rtol=1e-12, atol=1e-15)
    assert torch.allclose(torch.cat(grads), whole_logp.grad, rtol=1e-12, atol=1e-15)
    assert torch.isfinite(whole_logp.grad).all()                            # NaN padding never reaches it
    assert m.summarize({k: torch.cat(v) for k, v in per_sequence.items()}) == pytest.approx(m.summarize(whole_stats))


# --- Trainer.update with a hand-made Plan (tiny GPT-2-architecture policy) ----------------------------------
@pytest.fixture(scope="module")
def tiny_trainer(tmp_path_factory):
    from test_trainer_loop import tiny_config

    from mrl_trainer.config import TrainerConfig
    from mrl_trainer.trainer import build_trainer
    trainer = build_trainer(TrainerConfig.model_validate(tiny_config(tmp_path_factory.mktemp("sharing"), **{
        "loss.micro_batch_tokens": 24})))
    yield trainer
    trainer.close()


@pytest.mark.parametrize("name, summary", [
    ("prp", {"prp_rho_mean", "prp_log_rho_var", "prp_truncated"}),
    ("sgt", {"sgt_nll"}),
    ("hacpo", {"hacpo_ratio_mean", "hacpo_clipped", "hacpo_lower_bound"})])
def test_trainer_update_runs_a_plan_with_extras(tiny_trainer, name, summary):
    trainer = tiny_trainer
    # uncapped and trusted: the plan's advantages are made up, and the tiny model's own groups may all be uniform
    # (g_s = 0), where a peer term at τ = 0 (HACPO's τ_0) takes no step
    trainer.sharing = SHARING_MODES[name](sharing_config(mode=name, guard={"max_ratio": 0, "initial_trust": 1}),
                                          trainer.cfg.loss)
    batch = trainer.rollout(0)
    n = sum(len(g) for g in batch.samples)
    own = [s for g in batch.samples for s in g]
    extra_ids = [own[0].ids or [11, 12], [13, 14, 15], [16]]
    extras = [Extra(prompt_index=i % len(batch.problems), ids=ids, advantage=0.5 - i,
                    behaviour_logp=-8.0 * len(ids), chunks=len(ids), weight=1.0) for i, ids in enumerate(extra_ids)]
    totals = {"num_sequences": n + 3, "num_tokens": sum(len(s.ids) for s in own) + 6}
    extra_totals = {"nll_divisor": 3} if name == "sgt" else totals
    plan = Plan(advantages=torch.linspace(-1, 1, n), extras=extras, totals=totals, extra_totals=extra_totals,
                stats={"peer_samples": 3})
    before = [p.detach().clone() for p in trainer.model.parameters()]
    stats = trainer.update(batch, plan)
    assert summary <= set(stats) and all(math.isfinite(stats[k]) for k in summary)
    assert stats["extras"] == 3 and stats["peer_samples"] == 3 and math.isfinite(stats["loss"])
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
    if name == "hacpo":
        assert stats["hacpo_lower_bound"] == pytest.approx(0.8)
        # two mini-batches (prompt 0's extras at m = 0, prompt 1's at m = 1): the bound rises within the step
        trainer.cfg.loss.mini_batches = 2
        stats = trainer.update(batch, plan)
        assert stats["updates"] == 2
        assert stats["hacpo_lower_bound"] == pytest.approx((2 * 0.8 + 1 * 0.81) / 3)


@pytest.mark.parametrize("name", ["prp", "hacpo"])
def test_peer_rollouts_are_rescored_by_the_receivers_verifier(name):
    """A peer claiming reward 1 for a wrong answer is scored 0 by the receiver: same plan as an honest peer."""
    batch = make_batch([[1, 0, 0]])
    honest = plan_of(mode(name), batch, PeerBatch(rollouts={0: [peer(0, 2, 0.0, text="wrong")]}))
    lying = plan_of(mode(name), batch, PeerBatch(rollouts={0: [peer(0, 2, 1.0, text="wrong")]}))
    assert torch.equal(honest.advantages, lying.advantages) and honest.extras == lying.extras
    assert honest.stats["peer_reward_disputed"] == 0 and lying.stats["peer_reward_disputed"] == 1


def test_a_cross_tokenizer_ratio_is_one_when_both_policies_give_the_text_the_same_probability():
    """The same text, 30 tokens under the receiver k and 36 under the producer j, log P = −40 under both.
    Per-side means gave log s = −40/30 + 40/36 ≈ −0.22 (s ≈ 0.80, HACPO's clip edge); one normaliser, THL's
    chunk count (here 24), gives exactly 0 — and with the same tokenizer it is the papers' per-token ratio."""
    logp, mask = rows([[-40.0 / 30] * 30])
    behaviour, chunks = torch.tensor([-40.0]), torch.tensor([24.0])
    assert cross_log_ratio(logp, mask, behaviour, chunks).item() == pytest.approx(0.0, abs=1e-6)
    assert math.exp(-40.0 / 30 + 40.0 / 36) == pytest.approx(0.80, abs=0.005)    # what the per-side means gave
    _, ratio = peer_loss(logp, mask, behaviour, chunks, torch.tensor([1.0]), torch.tensor([1.0]), lower=0.8,
                         alpha=1.0, aggregation="seq-mean-token-mean", num_sequences=1, num_tokens=30)
    assert ratio.item() == pytest.approx(1.0, abs=1e-6)
    _, rho = truncated_ratio(logp, mask, behaviour, chunks, c=1.0)
    assert rho.item() == pytest.approx(1.0, abs=1e-6)
    # one tokenizer: C = |y|, and log s = mean log π_θ^k − mean log π^j (per token)
    logp, mask = rows([[-1.0, -2.0, -3.0]])
    assert cross_log_ratio(logp, mask, torch.tensor([-4.5]), torch.tensor([3.0])).item() == pytest.approx(-2.0 + 1.5)

"""The no-harm guard (mrl_trainer.guard): projection of the peer term against the solo gradient, and trust."""
import math
from dataclasses import replace

import pytest
import torch

from mrl_trainer.config import LossConfig
from mrl_trainer.distributed import Ranks
from mrl_trainer import guard as guard_module
from mrl_trainer.guard import CHUNK, Guard, GuardConfig
from mrl_trainer.sharing import SHARING_MODES, PeerBatch, Plan, make_sharing, sharing_config
from mrl_trainer.sharing.base import solo_advantages
from mrl_trainer.sharing.xgrpo import XGRPO
from mrl_trainer import update as update_module
from mrl_trainer.update import TIMINGS, gradient, update
from helpers import run_quick_bench
from test_sharing_modes import answer_verifier, make_batch, peer


# --- the combination, on hand-made gradients ----------------------------------------------------------------
def _param(grad: list[float]) -> torch.Tensor:
    p = torch.zeros(len(grad), requires_grad=True)
    p.grad = torch.tensor(grad)
    return p


def test_a_peer_term_that_agrees_with_own_learning_passes_unchanged():
    p = _param([2.0, 1.0])                             # g_m
    evidence = Guard(GuardConfig()).combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.equal(p.grad, torch.tensor([2.0, 1.0]))   # d = (1, 1), ⟨d, g_s⟩ = 1 ≥ 0: the mode's own update
    assert evidence["projected"] == 0.0 and evidence["agreement"] == pytest.approx(1 / math.sqrt(2))


def test_the_conflicting_part_of_a_peer_term_is_projected_out():
    p = _param([-1.0, 1.0])                            # g_m; g_s = (1, 0): d = (−2, 1) conflicts
    guard = Guard(GuardConfig())
    evidence = guard.combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.allclose(p.grad, torch.tensor([1.0, 1.0]))          # g_s + d⊥, d⊥ = (0, 1)
    assert float(p.grad @ torch.tensor([1.0, 0.0])) >= 1.0           # ⟨g, g_s⟩ ≥ ‖g_s‖²: never worse than solo
    assert evidence["projected"] == 1.0 and evidence["agreement"] < 0
    guard.trust = 0.5
    p.grad = torch.tensor([-1.0, 1.0])
    guard.combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5]))          # g_s + τ·d⊥


def test_per_tensor_projection_removes_a_conflict_that_the_whole_model_sum_hides():
    """Two tensors: the peer term agrees with own learning on the first and conflicts on the second; summed over
    the model the agreement wins (no projection), per tensor the second tensor's conflict is removed."""
    g_s = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])]
    peer_terms = [torch.tensor([3.0, 0.0]), torch.tensor([-1.0, 1.0])]       # ⟨d, g_s⟩: +3 and −1, sum +2

    def combined(projection: str) -> list[torch.Tensor]:
        params = [_param((g + d).tolist()) for g, d in zip(g_s, peer_terms)]
        evidence = Guard(GuardConfig(projection=projection)).combine(params, [g.clone() for g in g_s])
        return [p.grad for p in params], evidence["projected"]

    whole, share = combined("model")
    assert all(torch.equal(g, (a + b)) for g, a, b in zip(whole, g_s, peer_terms)) and share == 0.0
    per_tensor, share = combined("tensor")
    assert torch.equal(per_tensor[0], torch.tensor([4.0, 0.0]))            # agreeing tensor: unchanged
    assert torch.allclose(per_tensor[1], torch.tensor([1.0, 1.0]))         # g_s + d⊥, d⊥ = (0, 1)
    assert share == 0.5                                                    # one tensor of two projected
    assert all(float(g @ s) >= float(s @ s) for g, s in zip(per_tensor, g_s))   # never worse than solo, per tensor


def test_a_peer_term_that_lowers_a_remembered_success_is_projected_out_too():
    """g_s = (1, 0, 0), d = (0, −1, 1): no conflict with the batch's own gradient, but it raises the NLL of a
    remembered success (g_r = (0, 1, 0)): with the memory that part goes, the rest of d stays."""
    g_s, g_r = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    p = _param([1.0, -1.0, 1.0])
    evidence = Guard(GuardConfig()).combine([p], [g_s.clone()])
    assert torch.equal(p.grad, torch.tensor([1.0, -1.0, 1.0])) and "remembered" not in evidence
    p = _param([1.0, -1.0, 1.0])
    evidence = Guard(GuardConfig(memory=4)).combine([p], [g_s.clone()], remembered=[g_r])
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.0, 1.0]))          # g_s + d⊥, d⊥ = (0, 0, 1)
    assert evidence["remembered"] == 1.0 and evidence["projected"] == 0.0
    p = _param([1.0, 1.0, 1.0])                                             # d = (0, 1, 1) lowers the NLL: kept
    assert Guard(GuardConfig(memory=4)).combine([p], [g_s.clone()], remembered=[g_r])["remembered"] == 0.0
    assert torch.equal(p.grad, torch.tensor([1.0, 1.0, 1.0]))


def test_the_memory_keeps_the_newest_own_success_of_the_most_recently_solved_prompts():
    guard = Guard(GuardConfig(memory=2, memory_batch=1))
    guard.remember(make_batch([[0, 1, 1, 0], [0, 0, 0, 0]], [[1, 2, 3, 4], [1, 1, 1, 1]]))
    assert list(guard.memory.values()) == [list(range(10, 13))]          # prompt 0's last success (3 tokens)
    batch = make_batch([[1, 0], [0, 1]], [[5, 1], [1, 6]])
    for p, group in enumerate(batch.samples):                             # two other prompts
        for sample in group:
            sample.prompt_ids = [7, p]
    guard.remember(batch)
    assert list(guard.memory) == [(7, 0), (7, 1)]                        # the oldest prompt forgotten
    prompts, completions = guard.recall()
    assert len(prompts) == 1 and completions[0] == guard.memory[tuple(prompts[0])]
    smaller = make_sharing(sharing_config(mode="xgrpo", guard={"memory": 1}), LossConfig())
    smaller.restore({"guard_memory": [[list(prompt), ids] for prompt, ids in guard.memory.items()]})
    assert list(smaller.guard.memory) == [(7, 1)]                         # resumed with a smaller memory: newest


def test_the_update_projects_against_the_remembered_successes_and_a_checkpoint_keeps_them():
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0]]
    batch, peers = make_batch(rewards), PeerBatch(group_rewards={0: [0, 0, 0, 0]})     # the pool moves group 0
    sharing = make_sharing(sharing_config(mode="xgrpo", guard={"memory": 8}), LossConfig())
    table = _Table()
    optimizer = torch.optim.AdamW(table.parameters(), lr=0.1)
    plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
    stats = update(table, list(table.parameters()), optimizer, sharing, LossConfig(), batch, plan, max_tokens=8)
    assert "guard_remembered" in stats and len(sharing.guard.memory) == 1   # the batch's success, remembered first
    resumed = make_sharing(sharing_config(mode="xgrpo", guard={"memory": 8}), LossConfig())
    resumed.restore(sharing.state())
    assert resumed.guard.memory == sharing.guard.memory
    plan = sharing.plan(batch, PeerBatch(), capability=0.5, verify=answer_verifier(batch))    # no peer term
    stats = update(table, list(table.parameters()), optimizer, sharing, LossConfig(), batch, plan, max_tokens=8)
    assert "guard_remembered" not in stats                    # nothing to project: no recall, no extra backward


def test_the_update_says_where_its_time_went():
    """Seconds per part: a part the update ran took some, a part it did not run took none."""
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0]]
    batch = make_batch(rewards)
    table = _Table()
    optimizer = torch.optim.AdamW(table.parameters(), lr=0.1)
    for mode, peers, ran in [
            ("xgrpo", PeerBatch(group_rewards={0: [0, 0, 0, 0]}), {"own", "solo", "memory", "guard", "optimizer"}),
            ("sgt", PeerBatch(successes={1: [peer(1, 3, 1.0, text="a1")]}),      # g_s: a copy
             {"own", "solo", "extras", "guard", "optimizer"}),
            ("none", PeerBatch(), {"own", "optimizer"})]:
        sharing = make_sharing(sharing_config(mode=mode, guard={"memory": 8 if mode == "xgrpo" else 0}), LossConfig())
        plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
        stats = update(table, list(table.parameters()), optimizer, sharing, LossConfig(), batch, plan, max_tokens=8)
        took = {name[len("update_"):-len("_s")] for name in TIMINGS if stats[name] > 0}
        assert took == ran, mode


def test_without_an_own_gradient_the_peer_term_passes_and_is_no_evidence():
    p = _param([0.0, 3.0])
    evidence = Guard(GuardConfig()).combine([p], [None])
    assert torch.equal(p.grad, torch.tensor([0.0, 3.0])) and math.isnan(evidence["agreement"])


def test_a_peer_term_larger_than_kappa_times_the_own_gradient_is_cut_to_that_size():
    """g_s = (1, 0), d = (0, 30): a peer NLL's gradient dwarfs the policy gradient; with κ = 0.5 the peer term
    is cut to 0.5·‖g_s‖, a smaller one passes, and a step with no own gradient takes no peer term."""
    p = _param([1.0, 30.0])
    evidence = Guard(GuardConfig(max_ratio=0.5)).combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5])) and evidence["capped"] == 1.0
    p = _param([1.0, 0.25])
    evidence = Guard(GuardConfig(max_ratio=0.5)).combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.equal(p.grad, torch.tensor([1.0, 0.25])) and evidence["capped"] == 0.0
    p = _param([0.0, 3.0])
    evidence = Guard(GuardConfig(max_ratio=0.5)).combine([p], [None])
    assert torch.equal(p.grad, torch.tensor([0.0, 0.0])) and evidence["capped"] == 1.0
    guard = Guard(GuardConfig(max_ratio=0.5))
    guard.trust = 0.1                                   # τ·‖d‖ = 3 > 0.5: the cap, not τ, sets the weight
    p = _param([1.0, 30.0])
    guard.combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5]))
    guard.trust = 0.01                                  # τ·‖d‖ = 0.3 < 0.5: τ sets it
    p = _param([1.0, 30.0])
    assert guard.combine([p], [torch.tensor([1.0, 0.0])])["capped"] == 0.0
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.3]))


@pytest.mark.parametrize("projection", ["model", "tensor"])
def test_the_cap_measures_the_peer_term_after_both_projections(projection):
    """‖d⊥‖ from the inner products equals the norm of the projected term formed by hand."""
    torch.manual_seed(0)
    g_s = [torch.randn(5), torch.randn(3)]
    g_r = [torch.randn(5), torch.randn(3)]
    g_m = [torch.randn(5) * 4, torch.randn(3) * 4]
    params = [_param(g.tolist()) for g in g_m]
    Guard(GuardConfig(memory=4, projection=projection)).combine(params, [g.clone() for g in g_s], remembered=g_r)
    projected = torch.cat([p.grad - g for p, g in zip(params, g_s)])          # d⊥ (τ = 1, no cap)
    params = [_param(g.tolist()) for g in g_m]
    Guard(GuardConfig(memory=4, projection=projection, max_ratio=0.5)).combine(params, [g.clone() for g in g_s],
                                                                                remembered=g_r)
    capped = torch.cat([p.grad - g for p, g in zip(params, g_s)])
    assert float(projected.norm()) > 0.5 * float(torch.cat(g_s).norm())      # so the cap acts
    assert float(capped.norm()) == pytest.approx(0.5 * float(torch.cat(g_s).norm()), rel=1e-5)
    assert torch.allclose(capped / capped.norm(), projected / projected.norm(), atol=1e-6)


def test_trust_falls_when_the_last_peer_term_conflicts_with_the_next_own_gradient():
    guard = Guard(GuardConfig(trust_rate=0.25))
    p = _param([1.0, 1.0])
    guard.combine([p], [torch.tensor([1.0, 0.0])])   # peer term (0, 1)
    assert guard.observe([]) == {"guard_trust": 1.0, "guard_projected": 0.0}   # no evidence: τ unchanged
    # guard.observe above ended the step: its peer term (0, 1) is now `previous`
    p.grad = torch.tensor([1.0, -1.0])
    evidence = guard.combine([p], [torch.tensor([0.0, -1.0])])   # own learning now goes the other way; peer (1, 0)
    assert evidence["hindsight"] == pytest.approx(-1.0)
    stats = guard.observe([evidence])
    assert stats["guard_trust"] == 1.0 and stats["guard_hindsight"] == pytest.approx(-1.0)
    chance = math.sqrt(0.25 / 1.75)                              # σ_0 = √(η / (2 − η))
    assert guard.score == pytest.approx(0.5)                     # m = (1 − η)·1 + η·(−1)
    assert guard.trust == pytest.approx((0.5 - chance) / (1 - chance))
    p.grad = torch.tensor([1.0, 0.0])
    guard.observe([guard.combine([p], [torch.tensor([1.0, 0.0])])])   # agrees with the last peer term
    assert guard.score == pytest.approx(0.75 * 0.5 + 0.25)
    assert guard.trust == pytest.approx((0.625 - chance) / (1 - chance))


def test_a_running_mean_within_chance_of_a_fair_coins_gives_no_trust():
    """τ = max(0, (m − σ_0) / (1 − σ_0)), σ_0 = √(η / (2 − η)) the settled standard deviation of the running mean of
    fair signs: a peer term that agrees with own learning by chance is not applied; τ_0 = 1 is full trust; setting
    τ sets m; η = 0 keeps τ at τ_0."""
    guard = Guard(GuardConfig(trust_rate=0.1))
    chance = math.sqrt(0.1 / 1.9)
    assert guard.trust == 1.0 and guard.chance == pytest.approx(chance)
    guard.score = chance
    assert guard.trust == 0.0
    guard.score = 0.5 * (1 + chance)
    assert guard.trust == pytest.approx(0.5)
    guard.trust = 0.3
    assert guard.trust == pytest.approx(0.3) and guard.score > chance
    guard.trust = 0.0
    assert guard.score == 0.0
    still = Guard(GuardConfig(trust_rate=0.0, initial_trust=0.4))
    assert still.trust == pytest.approx(0.4)
    assert Guard(GuardConfig(trust_rate=0.1, initial_trust=0.3)).trust == pytest.approx(0.3)   # τ_0, not m_0


def test_hindsight_sees_only_the_part_of_the_peer_term_beyond_the_own_gradient():
    """d = (1, 1) beside g_s = (1, 0): its part along g_s, (1, 0), would agree with any next own gradient that
    keeps going the same way; the hindsight measures the rest, r = (0, 1), and an own gradient orthogonal to it
    is no evidence (τ unchanged)."""
    guard = Guard(GuardConfig(trust_rate=0.25))
    p = _param([2.0, 1.0])
    guard.combine([p], [torch.tensor([1.0, 0.0])])
    assert torch.equal(p.grad, torch.tensor([2.0, 1.0]))          # the combination is the mode's own update
    guard.observe([])
    assert torch.equal(guard.previous[0], torch.tensor([0.0, 1.0]))
    p.grad = torch.tensor([1.0, 0.0])
    evidence = guard.combine([p], [torch.tensor([1.0, 0.0])])    # own learning keeps its direction
    assert evidence["hindsight"] == 0.0
    guard.observe([evidence])
    assert guard.trust == 1.0


def test_a_peer_term_at_no_trust_is_not_applied_but_still_judged_and_trust_is_earned():
    """A trust at 0 keeps the update solo's while the hindsight of the peer term it did not apply goes on; the
    score m may fall below 0 and must be made up, past chance, before τ is positive again."""
    guard = Guard(GuardConfig(trust_rate=0.25, initial_trust=0.0))
    p = _param([1.0, 1.0])
    guard.combine([p], [torch.tensor([1.0, 0.0])])               # peer term (0, 1), not applied
    assert torch.equal(p.grad, torch.tensor([1.0, 0.0]))
    guard.observe([])
    p.grad = torch.tensor([1.0, -1.0])
    guard.observe([guard.combine([p], [torch.tensor([0.0, -1.0])])])   # conflicts: m = −0.25; peer (1, 0)
    assert guard.score == pytest.approx(-0.25) and guard.trust == 0.0
    assert torch.equal(p.grad, torch.tensor([0.0, -1.0]))
    for m in (0.0625, 0.296875, 0.47265625):               # agrees: m ← 0.75·m + 0.25
        assert guard.trust == 0.0                           # within chance (σ_0 ≈ 0.378) of a fair coin's
        p.grad = torch.tensor([1.0, 0.0])
        guard.observe([guard.combine([p], [torch.tensor([1.0, 0.0])])])
        assert guard.score == pytest.approx(m)
    assert guard.trust > 0


# --- in the update ------------------------------------------------------------------------------------------
class _Table(torch.nn.Module):
    """A context-free softmax over 32 tokens: log π(y_t) = log_softmax(w)[y_t]."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 32))

    def __call__(self, prompts, completions):
        width = max(len(c) for c in completions)
        ids = torch.tensor([c + [0] * (width - len(c)) for c in completions])
        mask = torch.tensor([[1.0] * len(c) + [0.0] * (width - len(c)) for c in completions])
        return torch.log_softmax(self.w, -1)[ids], mask


class _Contrarian(XGRPO):
    """A harmful 'sharing' mode: the own advantages negated, a peer term that only undoes own learning."""

    def plan(self, batch, peers, *, capability, verify):
        return Plan(-solo_advantages(batch, self.loss), totals=self.own_totals(batch))


def _gradients(sharing, batch, peers=PeerBatch()):
    table = _Table()
    plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
    return gradient(table, list(table.parameters()), sharing, LossConfig(), batch, plan, max_tokens=8)


# HACPO's guard tests: three own groups with a spread, peer rollouts for two of their prompts
_HACPO_BATCH = make_batch([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 0]], [[1, 2, 3, 2], [3, 1, 2, 2], [2, 2, 1, 3]])
_HACPO_PEERS = PeerBatch(rollouts={0: [peer(0, 2, 1.0), peer(0, 3, 0.0)], 1: [peer(1, 1, 1.0)]},
                         capability={"j": 0.5})


def test_a_peer_term_that_only_undoes_own_learning_is_turned_down_to_solo():
    batch = make_batch([[1, 0, 0, 1], [0, 0, 1, 0]])
    solo = _gradients(make_sharing(sharing_config(mode="none"), LossConfig()), batch)
    guarded = _Contrarian(sharing_config(mode="xgrpo"), LossConfig())
    unguarded = _Contrarian(sharing_config(mode="xgrpo", guard={"enabled": False}), LossConfig())
    assert solo.abs().sum() > 0
    assert torch.allclose(_gradients(unguarded, batch), -solo)
    assert torch.allclose(_gradients(guarded, batch), solo)


def test_hacpo_at_no_trust_steps_as_solo_does_not_on_its_own_gspo_loss():
    """The guard's fallback is solo's update, the trainer's loss as `none` takes it (GRPO by default), whatever
    loss the mode puts on its own samples: HACPO's GSPO own loss is part of its peer term d. At τ = 0 the guarded
    HACPO gradient is none's; unguarded, it is not (the peer rollouts, the mixed baseline and GSPO)."""
    def gradient_of(sharing):
        return _gradients(sharing, _HACPO_BATCH, _HACPO_PEERS)

    solo = gradient_of(make_sharing(sharing_config(mode="none"), LossConfig()))
    at_no_trust = gradient_of(make_sharing(sharing_config(mode="hacpo", guard={"trust_rate": 0.0}), LossConfig()))
    unguarded = gradient_of(make_sharing(sharing_config(mode="hacpo", guard={"enabled": False}), LossConfig()))
    assert solo.abs().sum() > 0 and not torch.allclose(unguarded, solo, atol=1e-4)
    assert torch.allclose(at_no_trust, solo, rtol=1e-5, atol=1e-7)


def _projected(d: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """d⊥ = d − min(0, ⟨d, g⟩) / ‖g‖² · g."""
    return d - min(0.0, float(d @ g)) / float(g @ g) * g


def test_hacpos_gspo_loss_and_its_peers_are_trusted_apart():
    """HACPO's guard splits d into what its own loss changes and what its peers add:

        g_s = ∇ GRPO at solo advantages (none's),  g_o = ∇ GSPO at solo advantages (HACPO with no peers),
        g_m = ∇ HACPO with its peers
        g = g_s + τ_own · (g_o − g_s)⊥g_s + τ_peer · (g_m − g_o)⊥g_s

    each with a trust of its own, so a peer never rides on the trust GSPO's part earned; and an update keeps each
    part's direction beyond g_s, the next step's hindsight evidence, with its own guard."""
    batch, peers = _HACPO_BATCH, _HACPO_PEERS

    def gradient_of(sharing, peers):
        return _gradients(sharing, batch, peers).float()

    g_s = gradient_of(make_sharing(sharing_config(mode="none"), LossConfig()), peers)
    unguarded = sharing_config(mode="hacpo", guard={"enabled": False})
    g_o, g_m = gradient_of(make_sharing(unguarded, LossConfig()), PeerBatch()), \
        gradient_of(make_sharing(unguarded, LossConfig()), peers)
    assert not torch.allclose(g_o, g_s, atol=1e-4) and not torch.allclose(g_m, g_o, atol=1e-4)
    for own, peer_trust in ((1.0, 0.0), (0.0, 1.0), (0.5, 0.25)):
        hacpo = make_sharing(sharing_config(mode="hacpo", guard={"trust_rate": 0.0}), LossConfig())
        hacpo.own_guard.trust, hacpo.guard.trust = own, peer_trust
        expected = g_s + own * _projected(g_o - g_s, g_s) + peer_trust * _projected(g_m - g_o, g_s)
        assert torch.allclose(gradient_of(hacpo, peers), expected, rtol=1e-4, atol=1e-6), (own, peer_trust)

    def beyond(d):                                     # r = d⊥ − (⟨d⊥, g_s⟩ / ‖g_s‖²)·g_s, the step's direction
        d = _projected(d, g_s)
        return d - float(d @ g_s) / float(g_s @ g_s) * g_s

    hacpo = make_sharing(sharing_config(mode="hacpo", guard={"trust_rate": 0.0}), LossConfig())
    hacpo.own_guard.trust, hacpo.guard.trust = 0.5, 0.25
    table = _Table()
    plan = hacpo.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
    update(table, list(table.parameters()), torch.optim.AdamW(table.parameters(), lr=0.1), hacpo, LossConfig(),
           batch, plan, max_tokens=8)
    assert torch.allclose(hacpo.own_guard.previous[0], beyond(g_o - g_s), rtol=1e-4, atol=1e-6)
    assert torch.allclose(hacpo.guard.previous[0], beyond(g_m - g_o), rtol=1e-4, atol=1e-6)


def test_hacpos_two_terms_each_projected_against_the_own_gradient_keep_the_no_harm_bound():
    """⟨g, g_s⟩ ≥ ‖g_s‖² with both terms trusted: a peer term that conflicts with g_s is projected against g_s itself,
    not against g_s plus the own loss's change (which it may agree with). g_s = (1, 0), g_o = (1, 1), g_m = g_o +
    (−10, 10): projected against g_1 = (1, 1) the peer term would pass whole, g = (−9, 11), ⟨g, g_s⟩ = −9."""
    hacpo = make_sharing(sharing_config(mode="hacpo", guard={"trust_rate": 0.0}), LossConfig())
    hacpo.own_guard.trust = hacpo.guard.trust = 1.0
    p = _param([-9.0, 11.0])                                        # g_m
    evidence, own = update_module._combine(hacpo, [p], [torch.tensor([1.0, 0.0])], [torch.tensor([1.0, 1.0])],
                                           Ranks(), None, peer_only=False)
    assert torch.equal(p.grad, torch.tensor([1.0, 11.0])) and evidence["projected"] == 1 and own["projected"] == 0
    assert not evidence["idle"] and not own["idle"]


def test_hacpos_peer_trust_is_earned_by_peers_alone():
    """With no peer experience HACPO's peer term is 0: its trust and the share of prompts its peers may choose stay
    at 0 however its GSPO part fares, which its own trust judges (hindsight on every step after the first)."""
    batch = _HACPO_BATCH
    sharing = make_sharing(sharing_config(mode="hacpo"), LossConfig())
    table = _Table()
    optimizer = torch.optim.AdamW(table.parameters(), lr=0.1)
    stats = []
    for _ in range(4):
        plan = sharing.plan(batch, PeerBatch(), capability=0.5, verify=answer_verifier(batch))
        stats.append(update(table, list(table.parameters()), optimizer, sharing, LossConfig(), batch, plan,
                            max_tokens=8))
    assert sharing.guard.score == 0.0 and sharing.guided_share() == 0.0
    assert all("guard_hindsight" not in s for s in stats)
    assert all(math.isfinite(s["guard_own_hindsight"]) for s in stats[1:]) and sharing.own_guard.score != 0.0
    assert all("guard_own_trust" in s for s in stats)


def test_a_checkpoint_keeps_hacpos_own_trust():
    sharing = make_sharing(sharing_config(mode="hacpo"), LossConfig())
    sharing.own_guard.score, sharing.guard.score = 0.7, -0.2
    resumed = make_sharing(sharing_config(mode="hacpo"), LossConfig())
    resumed.restore(sharing.state())
    assert (resumed.own_guard.score, resumed.guard.score) == (0.7, -0.2)
    older = make_sharing(sharing_config(mode="hacpo", guard={"memory": 4}), LossConfig())   # one τ for both
    older.restore({"guard_trust": 0.4, "guard_score": 0.6, "guard_memory": [[[1, 2], [3]]]})
    assert (older.own_guard.trust, older.guard.trust) == (0.0, 0.0) and list(older.guard.memory) == [(1, 2)]
    assert make_sharing(sharing_config(mode="prp"), LossConfig()).own_guard is None


@pytest.mark.parametrize("name", ["prp", "sgt", "xgrpo", "hacpo"])
def test_at_no_trust_mini_batches_and_passes_step_as_solos_do(name):
    """k = 2 mini-batches, μ = 2 passes, τ = 0 throughout: prompt 0's mini-batch has a solo gradient, prompt 1's
    is uniform (solo takes no step on it) and carries the peers' experience: PRP's and HACPO's rollouts, SGT's
    rescue (XGRPO, which leaves a uniform own group alone by default, has nothing there and is checked only for
    taking no extra step). The guarded update takes solo's optimizer steps and no other (2, not 4), and leaves the
    weights and Adam's moments exactly where solo's does; PRP to float rounding, since its peer rollouts share its
    micro-batches and its g_s sums in another order (seen: 6e-8), where a step more would move w by lr = 0.1.
    A trusted PRP steps on the peers' mini-batch as well."""
    batch = make_batch([[1, 0, 0, 1], [0, 0, 0, 0]], [[1, 2, 3, 2], [3, 1, 2, 2]])
    peers = PeerBatch(rollouts={1: [peer(1, 2, 1.0), peer(1, 3, 0.0)]}, successes={1: [peer(1, 2, 1.0, text="a1")]},
                      group_rewards={1: [1.0] * 4 + [0.0] * 4}, capability={"j": 0.5})
    loss = LossConfig(mini_batches=2, updates_per_step=2, micro_batch_tokens=10)

    def updated(sharing):
        table = _Table()
        optimizer = torch.optim.AdamW(table.parameters(), lr=0.1)
        plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
        stats = update(table, list(table.parameters()), optimizer, sharing, loss, batch, plan, max_tokens=8)
        return table.w.detach(), optimizer.state[table.w], stats

    w_solo, adam_solo, solo = updated(make_sharing(sharing_config(mode="none"), loss))
    untrusting = sharing_config(mode=name, guard={"initial_trust": 0.0, "trust_rate": 0.0})
    w, adam, stats = updated(make_sharing(untrusting, loss))
    assert solo["updates"] == stats["updates"] == 2 and "skipped" not in stats
    assert (stats["extras"] > 0) == (name != "xgrpo")
    assert stats["grad_norm"] == pytest.approx(solo["grad_norm"], rel=1e-6)
    assert torch.equal(adam["step"], adam_solo["step"])
    if name == "prp":
        assert torch.allclose(w, w_solo, rtol=0, atol=1e-6)
        assert all(torch.allclose(adam[k], adam_solo[k], rtol=1e-5, atol=1e-12) for k in ("exp_avg", "exp_avg_sq"))
    else:
        assert torch.equal(w, w_solo) and all(torch.equal(adam[k], adam_solo[k]) for k in ("exp_avg", "exp_avg_sq"))
    if name == "prp":
        trusting = sharing_config(mode=name, guard={"initial_trust": 1.0, "trust_rate": 0.0})
        w, _, stats = updated(make_sharing(trusting, loss))
        assert stats["updates"] == 4 and (w - w_solo).abs().max() > 1e-3


def test_the_probe_gradient_leaves_the_guards_step_direction_alone():
    """gradient() (the testbed's variance probes) combines through the guard without ending a step: the
    direction the step has gathered so far, the next hindsight's evidence, is as it was."""
    guarded = _Contrarian(sharing_config(mode="xgrpo"), LossConfig())
    gathered = [torch.ones(32)]
    guarded.guard._direction = gathered
    _gradients(guarded, make_batch([[1, 0, 0, 1], [0, 0, 1, 0]]))
    assert guarded.guard._direction is gathered and torch.equal(gathered[0], torch.ones(32))


def test_the_guard_changes_nothing_when_peers_send_nothing():
    batch = make_batch([[1, 0, 0, 1], [0, 0, 1, 0]])
    after = []
    for enabled in (True, False):
        table = _Table()
        sharing = make_sharing(sharing_config(mode="xgrpo", guard={"enabled": enabled}), LossConfig())
        plan = sharing.plan(batch, PeerBatch(), capability=0.5, verify=answer_verifier(batch))
        stats = update(table, list(table.parameters()), torch.optim.AdamW(table.parameters(), lr=0.1), sharing,
                       LossConfig(mini_batches=2), batch, plan, max_tokens=8)
        after.append(table.w.detach().clone())
        assert ("guard_trust" in stats) == enabled
    assert torch.equal(after[0], after[1])


@pytest.mark.parametrize("name", list(SHARING_MODES))
def test_every_mode_that_takes_peers_is_guarded_by_default(name):
    sharing = make_sharing(sharing_config(mode=name), LossConfig())
    assert (sharing.guard is not None) == bool(sharing.kinds)
    assert make_sharing(sharing_config(mode=name, guard={"enabled": False}), LossConfig()).guard is None


def test_the_memory_is_off_unless_the_config_sets_it():
    memory = {name: make_sharing(sharing_config(mode=name), LossConfig()).guard.config.memory
              for name in ("prp", "xgrpo", "sgt", "hacpo")}
    assert memory == {"prp": 0, "xgrpo": 0, "sgt": 0, "hacpo": 0}
    for name, size in [("sgt", 16), ("xgrpo", 64)]:
        assert make_sharing(sharing_config(mode=name, guard={"memory": size}), LossConfig()).guard.config.memory == size


def test_the_cap_is_sgts_by_default_and_any_modes_by_the_config():
    kappa = {name: make_sharing(sharing_config(mode=name), LossConfig()).guard.config.max_ratio
             for name in ("prp", "xgrpo", "sgt", "hacpo")}
    assert kappa == {"prp": 0.0, "xgrpo": 0.0, "sgt": 1.0, "hacpo": 0.0}
    for name, value in [("sgt", 0.0), ("xgrpo", 2.0)]:
        guard = make_sharing(sharing_config(mode=name, guard={"max_ratio": value}), LossConfig()).guard
        assert guard.config.max_ratio == value


def test_xgrpos_and_hacpos_trust_is_earned_by_default_and_any_modes_initial_trust_is_the_configs():
    """XGRPO's peer term is a pooled baseline, a shift of each own group's advantages with no direction in
    expectation, and HACPO's mostly its mixed baseline: their guards start at τ_0 = 0. PRP's and SGT's carry the
    peer's samples: τ_0 = 1."""
    start = {name: make_sharing(sharing_config(mode=name), LossConfig()).guard.trust
             for name in ("prp", "xgrpo", "sgt", "hacpo")}
    assert start == {"prp": 1.0, "xgrpo": 0.0, "sgt": 1.0, "hacpo": 0.0}
    assert make_sharing(sharing_config(mode="xgrpo", guard={"initial_trust": 1.0}), LossConfig()).guard.trust == 1.0


def test_a_checkpoint_keeps_the_score_below_zero():
    """τ = max(0, (m − σ_0)/(1 − σ_0)): the state keeps m itself, so a resumed receiver has as much to make up as it
    had; a checkpoint from before the score (guard_trust only) resumes at the m that gives its τ."""
    sharing = make_sharing(sharing_config(mode="xgrpo"), LossConfig())
    sharing.guard.score = -0.4
    resumed = make_sharing(sharing_config(mode="xgrpo"), LossConfig())
    resumed.restore(sharing.state())
    assert resumed.guard.score == -0.4 and resumed.guard.trust == 0.0
    older = make_sharing(sharing_config(mode="xgrpo"), LossConfig())
    older.restore({"guard_trust": 0.3})
    assert older.guard.trust == pytest.approx(0.3)


# --- g_s without a second backward for the samples whose advantage the mode left alone -----------------------
def _guarded_updates(monkeypatch, name, peers, rewards, all_changed=False):
    """Two guarded updates (k = 2 mini-batches, μ = 2, two samples per micro-batch) of the table on one batch:
    its parameters, each update's stats (its timings left out), and the first update's work (micro-batches,
    changed_from, solo_scale).
    `all_changed`: treat every micro-batch as changed (the second backward everywhere, the same micro-batches).
    The guard starts at full trust (τ_0 = 1), so that the update is the mode's whole gradient: at τ = 0 it would be
    g_s alone, which these batches make 0 up to rounding, and Adam would scale the rounding up to whole steps."""
    real, works = update_module._work, []

    def work(*args, **kwargs):
        w = real(*args, **kwargs)
        works.append(w)
        return replace(w, changed_from=[0] * len(w.own_groups)) if all_changed else w

    monkeypatch.setattr(update_module, "_work", work)
    batch = make_batch(rewards, [[1, 2, 3, 2]] * len(rewards))
    table, sharing = _Table(), make_sharing(sharing_config(mode=name, guard={"initial_trust": 1.0}), LossConfig())
    optimizer = torch.optim.AdamW(table.parameters(), lr=0.1)
    loss = LossConfig(mini_batches=2, updates_per_step=2, micro_batch_tokens=10)
    plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
    stats = [update(table, list(table.parameters()), optimizer, sharing, loss, batch, plan, max_tokens=8)
             for _ in range(2)]
    stats = [{k: v for k, v in s.items() if k not in TIMINGS} for s in stats]
    return table.w.detach().clone(), stats, works[0]


def _count_second_backwards(monkeypatch) -> list:
    calls, real = [], torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_sgt_takes_the_solo_gradient_from_its_own_backward_with_the_same_update(monkeypatch):
    """SGT's own term is GRPO's: g_s is the own micro-batches' gradient, moved out before the rescues' backward,
    which then gives d alone — the same parameters and guard statistics as the second backward gives, to float
    rounding (there d = (g_own + d) − g_own)."""
    peers = PeerBatch(successes={0: [peer(0, 3, 1.0, text="a0")], 2: [peer(2, 2, 1.0, text="a2")]})
    rewards = [[0, 0, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 0]]
    calls = _count_second_backwards(monkeypatch)
    w, stats, work = _guarded_updates(monkeypatch, "sgt", peers, rewards)
    assert work.changed_from == [len(g) for g in work.own_groups] and work.solo_scale == 1.0 and not calls
    assert stats[0]["extras"] == 2 and stats[0]["updates"] == 4
    assert all(math.isfinite(s["guard_agreement"]) for s in stats) and math.isfinite(stats[1]["guard_hindsight"])
    w_full, stats_full, _ = _guarded_updates(monkeypatch, "sgt", peers, rewards, all_changed=True)
    assert calls and torch.allclose(w, w_full, rtol=1e-5, atol=1e-6)
    for s, s_full in zip(stats, stats_full):
        assert s.keys() == s_full.keys() and all(s[k] == pytest.approx(s_full[k], rel=1e-4, abs=1e-6) for k in s)


def test_pooled_baselines_keep_the_second_backward_where_they_change_the_advantages(monkeypatch):
    """XGRPO with a peer's stats for prompt 1 only (8 failures: a pooled baseline that conflicts with own
    learning): prompt 1's samples need the solo loss's own backward, prompt 3's do not — and the own gradient
    as g_s on prompt 1 would let the conflict through."""
    peers = PeerBatch(group_rewards={1: [0] * 8})
    rewards = [[0, 0, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 0]]
    w, stats, work = _guarded_updates(monkeypatch, "xgrpo", peers, rewards)
    assert work.changed_from == [0, len(work.own_groups[1])] and work.solo_scale == 1.0
    assert stats[0]["guard_projected"] > 0 and math.isfinite(stats[1]["guard_hindsight"])
    w_full, stats_full, _ = _guarded_updates(monkeypatch, "xgrpo", peers, rewards, all_changed=True)
    assert torch.equal(w, w_full) and stats == stats_full
    real = update_module._work
    monkeypatch.setattr(update_module, "_work", lambda *a, **k: replace(real(*a, **k), changed_from=[9, 9]))
    w_wrong, stats_wrong, _ = _guarded_updates(monkeypatch, "xgrpo", peers, rewards)
    assert not torch.equal(w, w_wrong) and stats_wrong != stats


_ROLLOUTS = PeerBatch(rollouts={1: [peer(1, 2, 0.0), peer(1, 3, 0.0)], 2: [peer(2, 2, 1.0), peer(2, 2, 1.0)]},
                      capability={"j": 0.5})
_REWARDS = [[1, 0, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 1, 0]]


def test_peer_rollouts_cost_a_second_backward_only_on_the_prompts_they_reach(monkeypatch):
    """PRP with peer rollouts for prompts 1 and 2 of 4: its totals count the peer samples (c ≠ 1), prompts 0 and
    3 keep solo's advantages (g_s from c × their gradient), prompts 1 and 2 take the second backward; the update
    is the one the second backward everywhere gives, to float rounding."""
    calls = _count_second_backwards(monkeypatch)
    w, stats, work = _guarded_updates(monkeypatch, "prp", _ROLLOUTS, _REWARDS)
    fast = len(calls)
    assert work.solo_scale == pytest.approx(41 / 32)          # D / D_solo: tokens under token-mean, 32 own + 9 peer
    assert all(0 < first < len(groups) for first, groups in zip(work.changed_from, work.own_groups))
    changed = sorted(i for groups, first in zip(work.own_groups, work.changed_from) for g in groups[first:] for i in g)
    assert changed == list(range(4, 12))                     # prompts 1 and 2's samples, nothing else
    w_full, stats_full, _ = _guarded_updates(monkeypatch, "prp", _ROLLOUTS, _REWARDS, all_changed=True)
    assert 0 < fast < len(calls) - fast
    assert torch.allclose(w, w_full, rtol=1e-5, atol=1e-6)
    for s, s_full in zip(stats, stats_full):
        assert s.keys() == s_full.keys() and all(s[k] == pytest.approx(s_full[k], rel=1e-4, abs=1e-6) for k in s)


def test_hacpos_own_samples_all_take_the_solo_and_own_losss_backwards(monkeypatch):
    """HACPO's own loss is GSPO, solo's is the trainer's (GRPO): no own sample's solo gradient is a copy of its own,
    not even on the prompts no peer reached, so every micro-batch takes the second backward, and a third for g_o
    (GSPO at solo advantages, the own guard's)."""
    calls = _count_second_backwards(monkeypatch)
    _, stats, work = _guarded_updates(monkeypatch, "hacpo", _ROLLOUTS, _REWARDS)
    assert work.changed_from == [0] * len(work.own_groups) and work.solo_scale == 1.0
    assert len(calls) == 2 * 2 * 2 * sum(len(groups) for groups in work.own_groups)    # μ = 2 passes, 2 updates
    assert math.isfinite(stats[1]["guard_hindsight"]) and math.isfinite(stats[1]["guard_own_hindsight"])


# --- what the combination costs (mrl bench guard) ------------------------------------------------------------
def test_the_combination_is_made_in_place_and_keeps_no_copy_of_a_gradient():
    """d⊥ is made in place of g_m (or of d, when p.grad holds the peer term alone), g_s + τ·d⊥ in the g_s buffer,
    which becomes p.grad, and the peer direction beyond the own gradient, r = d⊥ − (⟨d⊥, g_s⟩/‖g_s‖²)·g_s, is
    kept for the next step's hindsight where g_m was: the guard allocates no gradient-sized buffer of its own
    (mrl bench guard measures the memory)."""
    torch.manual_seed(0)
    g_s, g_m, g_r = torch.randn(1000), torch.randn(1000), torch.randn(1000)
    d = g_m - g_s                                                          # the reference, out of place
    d = d - min(0.0, float(d @ g_s)) / float(g_s @ g_s) * g_s
    d = d - min(0.0, float(d @ g_r)) / float(g_r @ g_r) * g_r
    for peer_only, held in ((False, g_m), (True, g_m - g_s)):
        p = _param(held.tolist())
        grad, solo = p.grad, g_s.clone()
        guard = Guard(GuardConfig(memory=4))
        guard.trust = 0.5
        guard.combine([p], [solo], remembered=[g_r.clone()], peer_only=peer_only)
        assert p.grad is solo and guard._direction[0] is grad
        torch.testing.assert_close(p.grad, g_s + 0.5 * d)
        torch.testing.assert_close(grad, d - float(d @ g_s) / float(g_s @ g_s) * g_s)
        assert abs(float(grad @ g_s)) < 1e-3 * float(grad.norm() * g_s.norm())


@pytest.mark.slow
def test_bench_guard_quick_ends_with_one_json_line(tmp_path):
    result = run_quick_bench("guard", tmp_path, timeout_s=300)
    (policy,) = result["policies"].values()
    assert policy["combine_s"] > 0 and policy["optimizer_s"] > 0 and policy["ratio_vs_optimizer"] > 0
    assert policy["memory"] == 64 and policy["parameters"] > 0 and policy["extra_peak_mb"] >= 0
    assert result["ratio_vs_optimizer"] == {name: r["ratio_vs_optimizer"] for name, r in result["policies"].items()}


def test_a_gradient_autograd_shares_between_parameters_is_added_once_to_each():
    """The guard's solo gradient of several changed micro-batches is summed in place: a gradient tensor autograd
    hands to two parameters (a + b) or gives as a broadcast view (a.sum()) must not be summed into twice or
    written through."""
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    x = torch.tensor([1.0, 2.0, 3.0])
    for loss in (lambda: ((a + b) * x).sum(), lambda: a.sum() + (b * x).sum()):
        buffers = [None, None]
        for _ in range(3):
            update_module._add(buffers, torch.autograd.grad(loss(), [a, b]))
        expected = [3 * torch.autograd.grad(loss(), [p])[0] for p in (a, b)]
        assert all(torch.equal(got, want) for got, want in zip(buffers, expected))


@pytest.mark.parametrize("sizes", [(10,), (CHUNK,), (3 * CHUNK + 17, 5, 2 * CHUNK)])
def test_the_guard_sums_its_inner_products_on_the_device_as_it_does_on_the_cpu(sizes):
    """On a GPU the chunked products are formed there and read back once (a read per chunk waits for the GPU
    each time: 5.6 s a step for SmolLM2 on an H200); the sums are the CPU loop's, to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    d, s, r, q = ([torch.randn(n, generator=gen) for n in sizes] for _ in range(4))
    for g_r, previous in ((None, None), (r, q)):
        dots, dd, hind = guard_module._products(d, s, g_r, previous)
        on_device = guard_module._products_on_device(d, s, g_r, previous)
        assert on_device[0] == pytest.approx(dots, rel=1e-5, abs=1e-3)
        assert on_device[1] == pytest.approx(dd, rel=1e-5)
        assert on_device[2] == (None if previous is None else pytest.approx(hind, rel=1e-5, abs=1e-3))
    assert guard_module._dot_on_device(d, s) == pytest.approx(guard_module._dot(d, s), rel=1e-5, abs=1e-3)

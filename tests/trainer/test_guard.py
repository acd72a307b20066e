"""The no-harm guard (mrl_trainer.guard) around the update (mrl_trainer.update): projection of the peer term
against the solo gradient, the size cap, trust learned in hindsight, and solo's update at τ = 0."""
import math

import pytest
import torch

from mrl_trainer.config import LossConfig
from mrl_trainer.guard import Guard, GuardConfig
from mrl_trainer.sharing import SHARING_MODES, PeerBatch, Plan, make_sharing, sharing_config
from mrl_trainer.sharing.base import solo_advantages
from mrl_trainer.sharing.xgrpo import XGRPO
from mrl_trainer.update import TIMINGS, gradient, update
from test_sharing_modes import answer_verifier, make_batch, peer


# --- the combination, on hand-made gradients ----------------------------------------------------------------
def combine(guard: Guard, p: torch.Tensor, g_s: torch.Tensor | None) -> dict:
    """guard.combine with p.grad = g_m on entry (the mode's whole gradient, as the tests write it): the peer term
    d = g_m − g_s is what the update hands the guard."""
    if g_s is not None:
        p.grad = p.grad - g_s
    return guard.combine([p], [None if g_s is None else g_s.clone()])


def _param(grad: list[float]) -> torch.Tensor:
    p = torch.zeros(len(grad), requires_grad=True)
    p.grad = torch.tensor(grad)
    return p


def test_a_peer_term_that_agrees_with_own_learning_passes_unchanged():
    p = _param([2.0, 1.0])                             # g_m
    evidence = combine(Guard(GuardConfig()), p, torch.tensor([1.0, 0.0]))
    assert torch.equal(p.grad, torch.tensor([2.0, 1.0]))   # d = (1, 1), ⟨d, g_s⟩ = 1 ≥ 0: the mode's own update
    assert evidence["projected"] == 0.0 and evidence["agreement"] == pytest.approx(1 / math.sqrt(2))


def test_the_conflicting_part_of_a_peer_term_is_projected_out():
    p = _param([-1.0, 1.0])                            # g_m; g_s = (1, 0): d = (−2, 1) conflicts
    guard = Guard(GuardConfig())
    evidence = combine(guard, p, torch.tensor([1.0, 0.0]))
    assert torch.allclose(p.grad, torch.tensor([1.0, 1.0]))          # g_s + d⊥, d⊥ = (0, 1)
    assert float(p.grad @ torch.tensor([1.0, 0.0])) >= 1.0           # ⟨g, g_s⟩ ≥ ‖g_s‖²: never worse than solo
    assert evidence["projected"] == 1.0 and evidence["agreement"] < 0
    guard.trust = 0.5
    p.grad = torch.tensor([-1.0, 1.0])
    combine(guard, p, torch.tensor([1.0, 0.0]))
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5]))          # g_s + τ·d⊥


def test_without_an_own_gradient_the_peer_term_passes_and_is_no_evidence():
    p = _param([0.0, 3.0])
    evidence = combine(Guard(GuardConfig()), p, None)
    assert torch.equal(p.grad, torch.tensor([0.0, 3.0])) and math.isnan(evidence["agreement"])


def test_a_peer_term_larger_than_kappa_times_the_own_gradient_is_cut_to_that_size():
    """g_s = (1, 0), d = (0, 30): a peer NLL's gradient dwarfs the policy gradient; with κ = 0.5 the peer term
    is cut to 0.5·‖g_s‖, a smaller one passes, and a step with no own gradient takes no peer term."""
    p = _param([1.0, 30.0])
    evidence = combine(Guard(GuardConfig(max_ratio=0.5)), p, torch.tensor([1.0, 0.0]))
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5])) and evidence["capped"] == 1.0
    p = _param([1.0, 0.25])
    evidence = combine(Guard(GuardConfig(max_ratio=0.5)), p, torch.tensor([1.0, 0.0]))
    assert torch.equal(p.grad, torch.tensor([1.0, 0.25])) and evidence["capped"] == 0.0
    p = _param([0.0, 3.0])
    evidence = combine(Guard(GuardConfig(max_ratio=0.5)), p, None)
    assert torch.equal(p.grad, torch.tensor([0.0, 0.0])) and evidence["capped"] == 1.0
    guard = Guard(GuardConfig(max_ratio=0.5))
    guard.trust = 0.1                                   # τ·‖d‖ = 3 > 0.5: the cap, not τ, sets the weight
    p = _param([1.0, 30.0])
    combine(guard, p, torch.tensor([1.0, 0.0]))
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.5]))
    guard.trust = 0.01                                  # τ·‖d‖ = 0.3 < 0.5: τ sets it
    p = _param([1.0, 30.0])
    assert combine(guard, p, torch.tensor([1.0, 0.0]))["capped"] == 0.0
    assert torch.allclose(p.grad, torch.tensor([1.0, 0.3]))


def test_trust_falls_when_the_last_peer_term_conflicts_with_the_next_own_gradient():
    guard = Guard(GuardConfig(trust_rate=0.25))
    p = _param([1.0, 1.0])
    combine(guard, p, torch.tensor([1.0, 0.0]))   # peer term (0, 1)
    assert guard.observe([]) == {"guard_trust": 1.0, "guard_projected": 0.0}   # no evidence: τ unchanged
    # guard.observe above ended the step: its peer term (0, 1) is now `previous`
    p.grad = torch.tensor([1.0, -1.0])
    evidence = combine(guard, p, torch.tensor([0.0, -1.0]))   # own learning now goes the other way; peer (1, 0)
    assert evidence["hindsight"] == pytest.approx(-1.0)
    stats = guard.observe([evidence])
    assert stats["guard_trust"] == 1.0 and stats["guard_hindsight"] == pytest.approx(-1.0)
    chance = math.sqrt(0.25 / 1.75)                              # σ_0 = √(η / (2 − η))
    assert guard.score == pytest.approx(0.5)                     # m = (1 − η)·1 + η·(−1)
    assert guard.trust == pytest.approx((0.5 - chance) / (1 - chance))
    p.grad = torch.tensor([1.0, 0.0])
    guard.observe([combine(guard, p, torch.tensor([1.0, 0.0]))])   # agrees with the last peer term
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
    combine(guard, p, torch.tensor([1.0, 0.0]))
    assert torch.equal(p.grad, torch.tensor([2.0, 1.0]))          # the combination is the mode's own update
    guard.observe([])
    assert torch.equal(guard.previous[0], torch.tensor([0.0, 1.0]))
    p.grad = torch.tensor([1.0, 0.0])
    evidence = combine(guard, p, torch.tensor([1.0, 0.0]))    # own learning keeps its direction
    assert evidence["hindsight"] == 0.0
    guard.observe([evidence])
    assert guard.trust == 1.0


def test_a_peer_term_at_no_trust_is_not_applied_but_still_judged_and_trust_is_earned():
    """A trust at 0 keeps the update solo's while the hindsight of the peer term it did not apply goes on; the
    score m may fall below 0 and must be made up, past chance, before τ is positive again."""
    guard = Guard(GuardConfig(trust_rate=0.25, initial_trust=0.0))
    p = _param([1.0, 1.0])
    combine(guard, p, torch.tensor([1.0, 0.0]))               # peer term (0, 1), not applied
    assert torch.equal(p.grad, torch.tensor([1.0, 0.0]))
    guard.observe([])
    p.grad = torch.tensor([1.0, -1.0])
    guard.observe([combine(guard, p, torch.tensor([0.0, -1.0]))])   # conflicts: m = −0.25; peer (1, 0)
    assert guard.score == pytest.approx(-0.25) and guard.trust == 0.0
    assert torch.equal(p.grad, torch.tensor([0.0, -1.0]))
    for m in (0.0625, 0.296875, 0.47265625):               # agrees: m ← 0.75·m + 0.25
        assert guard.trust == 0.0                           # within chance (σ_0 ≈ 0.378) of a fair coin's
        p.grad = torch.tensor([1.0, 0.0])
        guard.observe([combine(guard, p, torch.tensor([1.0, 0.0]))])
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


def test_a_peer_term_that_only_undoes_own_learning_is_turned_down_to_solo():
    batch = make_batch([[1, 0, 0, 1], [0, 0, 1, 0]])
    solo = _gradients(make_sharing(sharing_config(mode="none"), LossConfig()), batch)
    guarded = _Contrarian(sharing_config(mode="xgrpo"), LossConfig())
    unguarded = _Contrarian(sharing_config(mode="xgrpo", guard={"enabled": False}), LossConfig())
    assert solo.abs().sum() > 0
    assert torch.allclose(_gradients(unguarded, batch), -solo)
    assert torch.allclose(_gradients(guarded, batch), solo)


@pytest.mark.parametrize("name", ["prp", "sgt", "xgrpo", "hacpo"])
def test_at_no_trust_mini_batches_and_passes_step_as_solos_do(name):
    """k = 2 mini-batches, μ = 2 passes, τ = 0 throughout: prompt 0's mini-batch has a solo gradient, prompt 1's
    is uniform (solo takes no step on it) and carries the peers' experience: PRP's and HACPO's rollouts, SGT's
    rescue (XGRPO, which leaves a uniform own group alone by default, has nothing there and is checked only for
    taking no extra step). The guarded update takes solo's optimizer steps and no other (2, not 4), and leaves the
    weights and Adam's moments exactly where solo's does: g_s is the gradient of the solo loss's own pass, as
    none's. A trusted PRP steps on the peers' mini-batch as well."""
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
    had."""
    sharing = make_sharing(sharing_config(mode="xgrpo"), LossConfig())
    sharing.guard.score = -0.4
    resumed = make_sharing(sharing_config(mode="xgrpo"), LossConfig())
    resumed.restore(sharing.state())
    assert resumed.guard.score == -0.4 and resumed.guard.trust == 0.0


# the guard's formula on every mode: three own groups with a spread, peers' experience for two of their prompts
_BATCH = make_batch([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
                    [[1, 2, 3, 2], [3, 1, 2, 2], [2, 2, 1, 3], [2, 2, 2, 2]])
_PEERS = PeerBatch(rollouts={0: [peer(0, 2, 1.0), peer(0, 3, 0.0)], 1: [peer(1, 1, 1.0)]},
                   successes={3: [peer(3, 2, 1.0, text="a3")]}, group_rewards={0: [1.0, 1.0, 1.0], 2: [0.0]},
                   capability={"j": 0.5})


@pytest.mark.parametrize("name", ["prp", "sgt", "xgrpo", "hacpo"])
@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0])
def test_the_guarded_direction_is_solo_plus_trust_times_the_projected_peer_term(name, tau):
    """ĝ = g_s + τ·d⊥ with g_s = none's gradient and d = the unguarded mode's gradient − g_s: the solo gradient
    comes from one place, and the mode's loss is split into solo and peer term exactly."""
    def direction(**guard):
        return _gradients(make_sharing(sharing_config(mode=name, guard=guard), LossConfig()), _BATCH, _PEERS)

    g_s = _gradients(make_sharing(sharing_config(mode="none"), LossConfig()), _BATCH)
    d = direction(enabled=False) - g_s
    assert g_s.abs().sum() > 0 and d.abs().sum() > 0
    projected = d - min(0.0, float(d @ g_s)) / float(g_s @ g_s) * g_s
    guarded = direction(initial_trust=tau, max_ratio=0.0)
    assert torch.allclose(guarded, g_s + tau * projected, rtol=1e-5, atol=1e-7)
    assert float(guarded @ g_s) >= float(g_s @ g_s) * (1 - 1e-6)


def test_the_update_says_where_its_time_went():
    """Seconds per part: a part the update ran took some, a part it did not run took none."""
    batch = make_batch([[1, 0, 0, 1], [0, 0, 0, 0]])
    for name, peers, ran in [
            ("xgrpo", PeerBatch(group_rewards={0: [0, 0, 0, 0]}), {"own", "peer", "guard", "optimizer"}),
            ("sgt", PeerBatch(), {"own", "guard", "optimizer"}),
            ("none", PeerBatch(), {"own", "optimizer"})]:
        table = _Table()
        sharing = make_sharing(sharing_config(mode=name), LossConfig())
        plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
        stats = update(table, list(table.parameters()), torch.optim.AdamW(table.parameters(), lr=0.1), sharing,
                       LossConfig(), batch, plan, max_tokens=8)
        assert {name[len("update_"):-len("_s")] for name in TIMINGS if stats[name] > 0} == ran, name


def test_active_counts_the_own_samples_either_loss_forwards():
    """Guarded, an own sample is forwarded when the solo loss or the mode's differs from 0 on it: XGRPO's pooled
    baseline moves group 1 (all failed, its solo advantages 0) under uniform_groups: pooled."""
    batch = make_batch([[1, 0, 0, 1], [0, 0, 0, 0]])
    peers = PeerBatch(group_rewards={1: [1.0, 1.0]})
    for enabled in (True, False):
        sharing = make_sharing(sharing_config(mode="xgrpo", xgrpo={"uniform_groups": "pooled"},
                                              guard={"enabled": enabled, "initial_trust": 1.0}), LossConfig())
        table = _Table()
        plan = sharing.plan(batch, peers, capability=0.5, verify=answer_verifier(batch))
        stats = update(table, list(table.parameters()), torch.optim.AdamW(table.parameters(), lr=0.1), sharing,
                       LossConfig(), batch, plan, max_tokens=8)
        assert stats["active"] == 1.0, enabled


def test_a_parameter_without_a_gradient_keeps_none_as_under_solo():
    """A parameter no loss reaches has no gradient under `none`, so AdamW leaves it alone (no weight decay, no
    moments); the guard's combination leaves it so."""
    batch = make_batch([[1, 0, 0, 1], [0, 0, 1, 0]])
    for name in ("none", "xgrpo"):
        table = _Table()
        unused = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.AdamW([*table.parameters(), unused], lr=0.1)
        sharing = make_sharing(sharing_config(mode=name), LossConfig())
        plan = sharing.plan(batch, PeerBatch(group_rewards={0: [0.0]}), capability=0.5, verify=answer_verifier(batch))
        update(table, [*table.parameters(), unused], optimizer, sharing, LossConfig(), batch, plan, max_tokens=8)
        assert torch.equal(unused.detach(), torch.ones(3)) and unused not in optimizer.state, name

"""The GRPO-family losses (mrl.algorithms; docs/algorithms.md): hand-computed tiny tensors for each piece, the
micro-batch split, NaN handling, and equality with TRL 1.16's own `GRPOTrainer._compute_loss` (called on an
object built with `__new__`, its model forward replaced by fixed log-probs) for every TRL loss_type that has a
counterpart here, at both importance-sampling levels."""
import math
from collections import defaultdict
from types import SimpleNamespace
from typing import get_args

import pytest
import torch

from mrl.algorithms import (GSPO_EPS_HIGH, GSPO_EPS_LOW, Aggregation, ImportanceLevel, aggregate,
                                clipped_surrogate, group_advantages, kl_k3, policy_loss, sequence_ratio)

AGGREGATIONS = get_args(Aggregation)
LEVELS = get_args(ImportanceLevel)
# TRL 1.16 loss_type -> our aggregation (grpo_trainer.py, the end of `_compute_loss`).
TRL_LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
                  "dr_grpo": "seq-mean-token-sum-norm"}
LENGTHS = [7, 3, 5, 1, 6, 2]  # ragged responses in a (6, 7) batch
T = 7
SEED = 4  # a batch where the clip bites on both sides at both levels (test_the_trl_batch_clips_on_both_sides)


def _mask(lengths=LENGTHS, width=T):
    return (torch.arange(width) < torch.tensor(lengths)[:, None]).float()  # (N, T)


def _batch(seed=0, dtype=torch.float32):
    """Random per-token log-probs (current, old, reference), ragged mask and advantages; padding holds garbage."""
    g = torch.Generator().manual_seed(seed)
    n = len(LENGTHS)
    logp = -3 * torch.rand(n, T, generator=g, dtype=dtype)
    old = logp + 0.3 * torch.randn(n, T, generator=g, dtype=dtype)
    ref = logp + 0.3 * torch.randn(n, T, generator=g, dtype=dtype)
    adv = torch.randn(n, generator=g, dtype=dtype)
    return logp, old, ref, _mask().to(dtype), adv


# --- advantages -------------------------------------------------------------------------------------------

def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    std0 = math.sqrt(4 * 0.25 / 3)  # unbiased: sum (R - 0.5)^2 / (n - 1)
    std1 = math.sqrt((3 * 0.25**2 + 0.75**2) / 3)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    scaled = expected / torch.tensor([[std0 + 1e-4], [std1 + 1e-4]])
    torch.testing.assert_close(group_advantages(rewards), scaled)
    torch.testing.assert_close(group_advantages(rewards, scale=False), expected)  # Dr.GRPO


def test_group_advantages_flat_with_group_ids_of_unequal_sizes():
    rewards = torch.tensor([0.0, 2.0, 5.0, 1.0, 4.0])
    group_ids = torch.tensor([7, 3, 9, 7, 3])  # groups {0, 1}, {2, 4}, {5 alone}
    got = group_advantages(rewards, group_ids, scale=False)
    torch.testing.assert_close(got, torch.tensor([-0.5, -1.0, 0.0, 0.5, 1.0]))
    got = group_advantages(rewards, group_ids)
    assert got[2] == 0  # a one-member group: 0, not NaN
    torch.testing.assert_close(got[[0, 3]], torch.tensor([-0.5, 0.5]) / (math.sqrt(0.5) + 1e-4))


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 0.7])
@pytest.mark.parametrize("scale", [True, False])
def test_all_equal_rewards_give_exactly_zero_advantages(value, scale):
    rewards = torch.full((2, 3), value)  # 0.1 * 3 / 3 != 0.1 in floating point: the mean alone would not do
    assert torch.equal(group_advantages(rewards, scale=scale), torch.zeros(2, 3))


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_group_advantages_equal_trl_formula(trl, scale_rewards):
    """TRL computes advantages inside `_generate_and_score_completions` (generation included); this repeats its
    "sum_then_normalize" lines with TRL's own `nanstd`: mean and std over each group of num_generations."""
    g = torch.Generator().manual_seed(1)
    num_generations = 4
    rewards = torch.rand(20, generator=g)
    rewards[8:12] = 1.0  # one all-equal group
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    std = trl.trainer.utils.nanstd(grouped, dim=1).repeat_interleave(num_generations)
    expected = rewards - mean
    if scale_rewards != "none":
        expected = expected / (std + 1e-4)
    scale = scale_rewards == "group"
    torch.testing.assert_close(group_advantages(grouped, scale=scale).reshape(-1), expected, atol=1e-6, rtol=0)
    perm = torch.randperm(20, generator=g)  # flat, shuffled, with group labels
    flat = group_advantages(rewards[perm], torch.arange(20)[perm] // num_generations, scale=scale)
    torch.testing.assert_close(flat, expected[perm], atol=1e-6, rtol=0)


def test_group_advantages_shape_errors():
    with pytest.raises(ValueError, match="need group_ids"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="must both be flat"):
        group_advantages(torch.zeros(4), torch.zeros(3, dtype=torch.long))


# --- KL, ratios, clipping -----------------------------------------------------------------------------------

def test_kl_k3():
    logp, _, ref, _, _ = _batch()
    kl = kl_k3(logp, ref)
    assert (kl >= 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))
    torch.testing.assert_close(kl_k3(torch.tensor(0.0), torch.tensor(math.log(0.5))),
                               torch.tensor(0.5 - math.log(0.5) - 1))


def test_sequence_ratio_by_hand():
    logp = torch.tensor([[0.1, 0.3, 99.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # a padded token and an empty response
    torch.testing.assert_close(sequence_ratio(logp, torch.zeros(2, 3), mask), torch.tensor([[math.exp(0.2)], [1.0]]))
    assert (GSPO_EPS_LOW, GSPO_EPS_HIGH) == (3e-4, 4e-4)


def test_clipping_on_both_sides():
    ratio = torch.tensor([0.5, 1.0, 1.5], requires_grad=True)
    pos = clipped_surrogate(ratio, torch.tensor(1.0), 0.2, 0.28)  # DAPO clip-higher: eps_high > eps_low
    neg = clipped_surrogate(ratio, torch.tensor(-1.0), 0.2, 0.28)
    torch.testing.assert_close(pos, torch.tensor([-0.5, -1.0, -1.28]))
    torch.testing.assert_close(neg, torch.tensor([0.8, 1.0, 1.5]))
    (grad_pos,) = torch.autograd.grad(pos.sum(), ratio)
    (grad_neg,) = torch.autograd.grad(neg.sum(), ratio)
    assert grad_pos.tolist() == [-1.0, -1.0, 0.0]  # A > 0: no gradient above 1 + eps_high
    assert grad_neg.tolist() == [0.0, 1.0, 1.0]  # A < 0: no gradient below 1 - eps_low


def test_policy_loss_clip_stats_by_hand():
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.5, 7.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    _, stats = policy_loss(logp, old, torch.tensor([-1.0, 1.0]), mask, eps_low=0.2, eps_high=0.28)
    assert stats == pytest.approx({"clip_low": 1 / 5, "clip_high": 1 / 5, "ratio_mean": 5.0 / 5})
    _, stats = policy_loss(logp, old, torch.tensor([-1.0, 1.0]), mask, ref_logp=old, beta=0.1)
    expected_kl = (kl_k3(logp, old) * mask).sum() / 5
    assert stats["kl"] == pytest.approx(expected_kl.item())


# --- aggregation ------------------------------------------------------------------------------------------

def test_aggregations_by_hand():
    per_token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token_loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(per_token_loss, mask, "seq-mean-token-mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)
    got = aggregate(per_token_loss, mask, "seq-mean-token-sum-norm", max_tokens=5)
    assert got.item() == pytest.approx(10 / (2 * 5))
    got = aggregate(per_token_loss, mask, "token-mean", num_tokens=20)  # a whole batch's total
    assert got.item() == pytest.approx(10 / 20)
    got = aggregate(per_token_loss, mask, "seq-mean-token-mean", num_sequences=8)
    assert got.item() == pytest.approx(6 / 8)
    got = aggregate(torch.tensor([[2.0], [3.0]]), mask, "seq-mean-token-mean")  # (N, 1) broadcast
    assert got.item() == pytest.approx(2.5)
    assert aggregate(per_token_loss, torch.zeros(2, 3), "token-mean").item() == 0  # no response tokens at all


@pytest.mark.parametrize("call, match", [
    (lambda: aggregate(torch.zeros(1, 2), torch.ones(1, 2), "mean"), "unknown aggregation 'mean'; valid choices"),
    (lambda: policy_loss(*_batch()[:2], _batch()[4], _batch()[3], level="tokens"),
     "unknown importance level 'tokens'; valid choices: 'token', 'sequence'"),
    (lambda: aggregate(torch.zeros(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm"), r"max_tokens \(None\)"),
    (lambda: aggregate(torch.zeros(1, 2), torch.ones(1, 2), num_sequences=0), r"num_sequences \(0\) must be > 0"),
    (lambda: policy_loss(*_batch()[:2], _batch()[4], _batch()[3], beta=0.1), "needs ref_logp"),
    (lambda: policy_loss(*_batch()[:2], _batch()[4][:3], _batch()[3]), "must be"),
    (lambda: clipped_surrogate(torch.ones(2), torch.ones(2), 1.0, 0.2), "eps_low=1.0"),
], ids=["aggregation-name", "level-name", "dr-grpo-without-max-tokens", "zero-sequences", "beta-without-ref",
        "advantages-shape", "eps-low"])
def test_bad_arguments_raise_with_the_fix(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_every_aggregation_lists_in_its_error():
    with pytest.raises(ValueError) as error:
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), "nope")
    assert all(repr(name) in str(error.value) for name in AGGREGATIONS)


# --- micro-batches and non-finite values ----------------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_sum_to_the_full_batch(aggregation, level):
    logp, old, ref, mask, adv = _batch(dtype=torch.float64)
    kwargs = dict(ref_logp=ref, beta=0.04, eps_low=0.2, eps_high=0.28, level=level, aggregation=aggregation,
                  max_tokens=T)
    full_logp = logp.clone().requires_grad_()
    full, _ = policy_loss(full_logp, old, adv, mask, **kwargs)
    full.backward()
    split_logp = logp.clone().requires_grad_()
    totals = dict(num_sequences=len(LENGTHS), num_tokens=int(mask.sum()))
    parts = [policy_loss(split_logp[rows], old[rows], adv[rows], mask[rows], **{**kwargs, "ref_logp": ref[rows]},
                         **totals)[0] for rows in (slice(0, 1), slice(1, 4), slice(4, 6))]  # uneven splits
    summed = sum(parts)
    summed.backward()
    torch.testing.assert_close(summed, full, atol=1e-12, rtol=0)
    torch.testing.assert_close(split_logp.grad, full_logp.grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
def test_nan_on_a_response_token_makes_the_loss_non_finite(level):
    logp, old, ref, mask, adv = _batch()
    logp[1, 0] = float("nan")
    loss, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.04, level=level)
    assert not torch.isfinite(loss)  # what the trainer checks before backward()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_non_finite_padding_never_reaches_the_loss_or_gradient(aggregation, level):
    logp, old, ref, mask, adv = _batch()
    clean, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.04, level=level, aggregation=aggregation,
                           max_tokens=T)
    pad = mask == 0
    logp, old, ref = logp.masked_fill(pad, float("nan")), old.masked_fill(pad, float("inf")), ref.masked_fill(pad, -1e9)
    logp.requires_grad_()
    loss, stats = policy_loss(logp, old, adv, mask, ref_logp=ref, beta=0.04, level=level, aggregation=aggregation,
                              max_tokens=T)
    loss.backward()
    assert loss.item() == clean.item()
    assert torch.isfinite(logp.grad).all() and (logp.grad[pad] == 0).all()
    assert all(math.isfinite(value) for value in stats.values())


# --- equality with TRL 1.16 ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl():
    """TRL, imported only by the tests that use it (the import takes seconds)."""
    import trl
    import trl.trainer.utils

    assert trl.__version__ == "1.16.0", "these comparisons were written against TRL 1.16's _compute_loss"
    return trl


def _trl_loss(trl, logp, old, ref, mask, adv, *, loss_type, level, beta, eps_low, eps_high, bias_kl):
    """TRL's own GRPOTrainer._compute_loss, on an object with only the attributes that method reads (set as
    GRPOTrainer.__init__ sets them from GRPOConfig), its model forward replaced by the fixed `logp`."""
    args = trl.GRPOConfig(output_dir="unused", report_to=[], use_cpu=True, bf16=False, loss_type=loss_type,
                          importance_sampling_level=level, beta=beta, epsilon=eps_low, epsilon_high=eps_high,
                          max_completion_length=T, use_bias_correction_kl=bias_kl)
    trainer = trl.GRPOTrainer.__new__(trl.GRPOTrainer)
    trainer.args = args
    for name in ("loss_type", "importance_sampling_level", "beta", "max_completion_length", "top_entropy_quantile",
                 "off_policy_mask_threshold", "use_vllm", "vllm_importance_sampling_correction"):
        setattr(trainer, name, getattr(args, name))
    trainer.epsilon_low, trainer.epsilon_high = args.epsilon, args.epsilon_high
    trainer.aux_loss_enabled = False  # not a mixture-of-experts model
    trainer._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
    trainer.current_gradient_accumulation_steps = 1
    trainer.model = SimpleNamespace(training=True)
    trainer.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x)
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    n = len(mask)
    inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
              "completion_ids": torch.zeros(n, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
              "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}
    loss = trainer._compute_loss(None, inputs)
    return loss, {name: values[-1] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("level", LEVELS)
def test_the_trl_batch_clips_on_both_sides(level):
    logp, old, _, mask, adv = _batch(seed=SEED)
    _, stats = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, level=level)
    assert stats["clip_low"] > 0 and stats["clip_high"] > 0


def test_every_aggregation_has_a_trl_counterpart():
    assert set(TRL_LOSS_TYPES.values()) == set(AGGREGATIONS)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")  # GRPOConfig's own
@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.2, 0.28), (GSPO_EPS_LOW, GSPO_EPS_HIGH)],
                         ids=["symmetric", "clip-higher", "gspo-paper"])
@pytest.mark.parametrize("beta, bias_kl", [(0.0, False), (0.04, False), (0.04, True)],
                         ids=["no-kl", "k3", "k3-ratio-weighted"])
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
def test_loss_and_gradient_equal_trl(trl, loss_type, level, beta, bias_kl, eps_low, eps_high):
    logp, old, ref, mask, adv = _batch(seed=SEED)
    trl_logp, our_logp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    expected, metrics = _trl_loss(trl, trl_logp, old, ref, mask, adv, loss_type=loss_type, level=level, beta=beta,
                                  eps_low=eps_low, eps_high=eps_high, bias_kl=bias_kl)
    got, stats = policy_loss(our_logp, old, adv, mask, ref_logp=ref, beta=beta, eps_low=eps_low, eps_high=eps_high,
                             level=level, aggregation=TRL_LOSS_TYPES[loss_type], max_tokens=T,
                             kl_ratio_weight=bias_kl)
    expected.backward()
    got.backward()
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(our_logp.grad, trl_logp.grad, atol=1e-6, rtol=0)
    assert stats["clip_low"] == pytest.approx(metrics["clip_ratio/low_mean"], abs=1e-6)
    assert stats["clip_high"] == pytest.approx(metrics["clip_ratio/high_mean"], abs=1e-6)
    if beta and not bias_kl:  # TRL logs the ratio-weighted KL when it weights it
        assert stats["kl"] == pytest.approx(metrics["kl"], abs=1e-6)

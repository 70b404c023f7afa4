"""Losses on 2–4-token tensors against hand-computed values (torchtune style)."""

import math

import pydantic
import pytest
import torch

from posttrain.algos.advantages import ScoredBatch, make_advantage
from posttrain.algos.losses import LOSSES, LossInputs, k3_kl, make_loss, token_logprobs


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).float(), torch.as_tensor(expected).float(), atol=atol, rtol=0)


def leaf(values):
    return torch.tensor(values, requires_grad=True)


def test_pg_first_step_is_plain_policy_gradient_normalised_by_tokens():
    # old = current (ratio 1, no clipping). A = [1, 1, -2] with the last token masked:
    # loss = -(1·1 + 1·1)/2 = -1; d loss/d logprob_t = -A_t·m_t/2 = [-0.5, -0.5, 0]
    logprobs = leaf([[-1.0, -2.0, -3.0]])
    x = LossInputs(logprobs, torch.tensor([[1, 1, 0]]), advantages_BT=torch.tensor([[1.0, 1.0, -2.0]]))
    out = make_loss("pg", is_mode="none")(x)
    close(out.loss, -1.0)
    out.loss.backward()
    close(logprobs.grad, [[-0.5, -0.5, 0.0]])
    assert out.metrics["clip_frac"] == 0.0 and out.metrics["ratio_mean"] == pytest.approx(1.0)


def test_pg_asymmetric_clipping():
    # ratios r = [1.5, 0.5, 1.5, 0.5], A = [1, 1, -1, -1], ε_low = 0.2, ε_high = 0.28 (band [0.8, 1.28]):
    #   t0: min(1.5·1, 1.28·1)    = 1.28  clipped (no gradient)
    #   t1: min(0.5·1, 0.8·1)     = 0.5   unclipped
    #   t2: min(-1.5, -1.28)      = -1.5  unclipped (clipping never helps a bad token get likelier)
    #   t3: min(-0.5, -0.8)       = -0.8  clipped
    # loss = -(1.28 + 0.5 - 1.5 - 0.8)/4 = 0.52/4 = 0.13; clip_frac = 2/4; mean ratio = 1.0
    # gradients: d(-r·A/4)/d logp = -r·A/4 → t1: -0.5/4 = -0.125, t2: 1.5/4 = 0.375, t0 = t3 = 0
    old = torch.full((1, 4), -1.0)
    logprobs = (old + torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]]))).requires_grad_()
    x = LossInputs(
        logprobs, torch.ones(1, 4, dtype=torch.bool), advantages_BT=torch.tensor([[1.0, 1.0, -1.0, -1.0]]),
        old_logprobs_BT=old,
    )
    out = make_loss("pg", clip_low=0.2, clip_high=0.28, is_mode="none")(x)
    close(out.loss, 0.13)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    out.loss.backward()
    close(logprobs.grad, [[0.0, -0.125, 0.375, 0.0]])


def test_pg_clip_higher_matters():
    # the same r = 1.5, A = 1 token: symmetric ε = 0.2 gives 1.2, clip-higher 0.28 gives 1.28
    old = torch.tensor([[-1.0]])
    x = LossInputs(old + math.log(1.5), torch.ones(1, 1), advantages_BT=torch.ones(1, 1), old_logprobs_BT=old)
    close(make_loss("pg", clip_high=0.2, is_mode="none")(x).loss, -1.2)
    close(make_loss("pg", clip_high=0.28, is_mode="none")(x).loss, -1.28)


def _is_inputs(rho):
    # old = trainer log-probs = current (first step); sampler = old - log ρ, so exp(old - sampler) = ρ
    old = torch.full((len(rho), len(rho[0])), -1.0)
    sampler = old - torch.log(torch.tensor(rho))
    return LossInputs(old.clone(), torch.ones_like(old, dtype=torch.bool), advantages_BT=torch.ones_like(old),
                      old_logprobs_BT=old, sampler_logprobs_BT=sampler)


def test_masked_importance_sampling_token_level():
    # ρ = [1.25, 3.0, 0.25], band [0.5, 2]: keep [yes, no, no]; kept token weighted by ρ = 1.25
    # loss = -(1.25·1)/3 = -0.416667; masked fraction 2/3; mean ρ = 4.5/3 = 1.5
    # |old - sampler| = |log ρ| = [0.223144, 1.098612, 1.386294] → mean 0.902683
    out = make_loss("pg", is_mode="token", is_low=0.5, is_high=2.0)(_is_inputs([[1.25, 3.0, 0.25]]))
    close(out.loss, -1.25 / 3)
    assert out.metrics["is_masked_frac"] == pytest.approx(2 / 3)
    assert out.metrics["is_ratio_mean"] == pytest.approx(1.5)
    assert out.metrics["logprob_abs_err"] == pytest.approx(0.902683, abs=1e-5)


def test_masked_importance_sampling_sequence_level_vs_token_level():
    # row 0: ρ = [2, 0.5] → geometric mean √1 = 1 → kept, weight 1 on both tokens
    # row 1: ρ = [4, 2]   → geometric mean √8 = 2.83 > 2 → the whole rollout is dropped
    # sequence: loss = -(1 + 1 + 0 + 0)/4 = -0.5, masked 2/4
    # token:    row 0 kept with weights [2, 0.5]; row 1: 4 dropped, 2 kept (band is inclusive)
    #           loss = -(2 + 0.5 + 0 + 2)/4 = -1.125, masked 1/4
    rho = [[2.0, 0.5], [4.0, 2.0]]
    seq = make_loss("pg", is_mode="sequence")(_is_inputs(rho))
    close(seq.loss, -0.5)
    assert seq.metrics["is_masked_frac"] == pytest.approx(0.5)
    tok = make_loss("pg", is_mode="token")(_is_inputs(rho))
    close(tok.loss, -1.125)
    assert tok.metrics["is_masked_frac"] == pytest.approx(0.25)


def test_k3_kl_values_and_penalty():
    # d = ref - π = [0, 1]: k3 = [e^0 - 0 - 1, e^1 - 1 - 1] = [0, 0.718282]
    close(k3_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])), [0.0, math.e - 2])
    # with A = 0 the loss is β · mean k3 = 0.1 · 0.718282/2 = 0.0359141
    x = LossInputs(torch.tensor([[-1.0, -2.0]]), torch.ones(1, 2), advantages_BT=torch.zeros(1, 2),
                   ref_logprobs_BT=torch.tensor([[-1.0, -1.0]]))
    out = make_loss("pg", kl_coef=0.1, is_mode="none")(x)
    close(out.loss, 0.1 * (math.e - 2) / 2)
    assert out.metrics["kl"] == pytest.approx((math.e - 2) / 2)
    x.ref_logprobs_BT = None
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        make_loss("pg", kl_coef=0.1, is_mode="none")(x)


def test_num_tokens_sets_the_denominator_for_gradient_accumulation():
    # 2 tokens of A = 1 → local loss -2/2 = -1; over a step of 8 tokens → -2/8 = -0.25
    x = LossInputs(torch.zeros(1, 2), torch.ones(1, 2), advantages_BT=torch.ones(1, 2))
    close(make_loss("pg", is_mode="none")(x).loss, -1.0)
    x.num_tokens = 8
    close(make_loss("pg", is_mode="none")(x).loss, -0.25)


def test_garbage_on_masked_positions_cannot_make_nan():
    # padding positions hold absurd log-probs (exp(1e4) = inf); they must not reach loss or grad
    logprobs = leaf([[-1.0, 1e4]])
    x = LossInputs(logprobs, torch.tensor([[1, 0]]), advantages_BT=torch.tensor([[1.0, 5.0]]),
                   old_logprobs_BT=torch.tensor([[-1.0, -1e4]]), sampler_logprobs_BT=torch.tensor([[-1.0, 1e4]]))
    out = make_loss("pg")(x)
    out.loss.backward()
    close(out.loss, -1.0)
    assert torch.isfinite(logprobs.grad).all()


def test_mopd_advantage_plugs_into_the_pg_loss_unchanged():
    # mopd A = teacher - student = [[0.5, -1]]; first step, no IS mismatch: loss = -(0.5 - 1)/2 = 0.25
    student = torch.tensor([[-1.5, -1.0]])
    batch = ScoredBatch(torch.zeros(1), torch.zeros(1, dtype=torch.long), torch.ones(1, 2),
                        sampler_logprobs_BT=student, teacher_logprobs_BT=torch.tensor([[-1.0, -2.0]]))
    adv = make_advantage("mopd")(batch)
    x = LossInputs(student.clone(), batch.mask_BT, advantages_BT=adv, sampler_logprobs_BT=student)
    close(make_loss("pg")(x).loss, 0.25)


def test_pg_needs_sampler_logprobs_for_importance_sampling():
    x = LossInputs(torch.zeros(1, 2), torch.ones(1, 2), advantages_BT=torch.ones(1, 2))
    with pytest.raises(ValueError, match="sampler_logprobs_BT"):
        make_loss("pg")(x)


def test_cross_entropy_is_mean_nll_over_the_mask():
    # masked log-probs -1, -2, -4 → (1 + 2 + 4)/3 = 7/3
    x = LossInputs(torch.tensor([[-1.0, -2.0], [-3.0, -4.0]]), torch.tensor([[1, 1], [0, 1]]))
    out = make_loss("ce")(x)
    close(out.loss, 7 / 3)
    close(out.metrics["nll"], 7 / 3)


def test_token_logprobs():
    # logits [0, ln 3] → p = [1/4, 3/4]; target 1 → ln 0.75; target -100 (ignored) → 0
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    close(token_logprobs(logits, torch.tensor([[1, -100]])), [[math.log(0.75), 0.0]])


def test_dpo_loss():
    # rows: chosen (tokens -1, -2 → -3), rejected (-5); reference: -4 and -4; β = 0.1
    # implicit rewards: 0.1·(-3 + 4) = 0.1 and 0.1·(-5 + 4) = -0.1 → margin 0.2
    # loss = -log σ(0.2) = log(1 + e^-0.2) = 0.598139
    x = LossInputs(
        torch.tensor([[-1.0, -2.0], [-2.5, -2.5]]), torch.ones(2, 2),
        ref_logprobs_BT=torch.tensor([[-2.0, -2.0], [-2.0, -2.0]]),
    )
    out = make_loss("dpo", beta=0.1)(x)
    close(out.loss, math.log(1 + math.exp(-0.2)))
    assert out.metrics["reward_acc"] == 1.0
    assert out.metrics["margin"] == pytest.approx(0.2)


def test_loss_registry_and_config_bounds():
    assert {"pg", "ce", "dpo"} <= set(LOSSES.names())
    with pytest.raises(pydantic.ValidationError):
        make_loss("pg", is_low=1.5)
    with pytest.raises(pydantic.ValidationError):
        make_loss("pg", is_mode="tokens")
    with pytest.raises(pydantic.ValidationError):
        make_loss("dpo", beta=0)

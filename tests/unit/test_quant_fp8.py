"""FP8 E4M3 numerics against hand-computed values (posttrain/quant/fp8.py)."""

from __future__ import annotations

import math

import torch

from posttrain.quant.fp8 import (
    FP8_MAX,
    amax,
    compute_scale,
    fake_quant,
    fake_quant_dynamic,
    from_fp8,
    scale_from_amax,
    to_fp8,
)


def test_format_constants_match_torch():
    assert torch.finfo(torch.float8_e4m3fn).max == FP8_MAX == 448.0
    assert torch.finfo(torch.float8_e4m3fn).tiny == 2.0 ** -6


def test_rounding_to_the_e4m3_grid_by_hand():
    one = torch.ones(1)
    # between 1 and 2 the grid is 1 + k/8
    x = torch.tensor([1.0, 1.06, 1.07, 1.125, 1.2, 1.3, 1.9375, 1.95, 3.3, 0.3, -0.3])
    want = torch.tensor([1.0, 1.0, 1.125, 1.125, 1.25, 1.25, 2.0, 2.0, 3.25, 0.3125, -0.3125])
    # 1.9375 is halfway between 1.875 and 2.0: round half to even → 2.0 (mantissa 000)
    assert torch.equal(fake_quant(x, one), want)
    # 0.3 = 1.2 × 2^-2 → 1.25 × 2^-2 = 0.3125 ; 3.3 = 1.65 × 2 → 1.625 × 2 = 3.25
    # subnormals: step 2^-9
    sub = torch.tensor([2.0 ** -9, 3 * 2.0 ** -9, 2.0 ** -11])
    assert torch.equal(fake_quant(sub, one), torch.tensor([2.0 ** -9, 3 * 2.0 ** -9, 0.0]))
    # largest grid points below 448: 416, 448 (step 32 in [256, 512))
    assert torch.equal(fake_quant(torch.tensor([430.0, 440.0]), one), torch.tensor([416.0, 448.0]))


def test_saturation_at_448_not_nan():
    one = torch.ones(1)
    x = torch.tensor([448.0, 449.0, 1e6, -1e6, float("inf"), -float("inf")])
    q = fake_quant(x, one)
    assert torch.equal(q, torch.tensor([448.0, 448.0, 448.0, -448.0, 448.0, -448.0]))


def test_zero_and_nan():
    assert torch.equal(scale_from_amax(torch.tensor([0.0])), torch.tensor([1.0]))
    z = torch.zeros(3, 4)
    assert torch.equal(fake_quant(z, compute_scale(z, "tensor")), z)
    assert torch.equal(fake_quant_dynamic(z, "token"), z)
    x = torch.tensor([1.0, float("nan"), -2.0])
    s = compute_scale(x, "tensor")
    assert torch.equal(s, torch.tensor([2.0]) / 448)  # NaN ignored by amax
    q = fake_quant(x, s)
    assert math.isnan(q[1].item()) and q[0].item() != 0 and q[2].item() == -2.0


def test_scales_per_tensor_channel_token():
    w = torch.tensor([[1.0, -4.0], [0.5, 0.25], [0.0, 0.0]])
    assert torch.equal(amax(w, "tensor"), torch.tensor([4.0]))
    assert torch.equal(compute_scale(w, "channel"), torch.tensor([[4.0 / 448], [0.5 / 448], [1.0]]))
    q = to_fp8(w, compute_scale(w, "channel"))
    assert q.dtype == torch.float8_e4m3fn
    # the row max lands on 448 exactly, so it comes back exactly
    back = from_fp8(q, compute_scale(w, "channel"))
    assert back[0, 1].item() == -4.0 and back[1, 0].item() == 0.5 and torch.equal(back[2], torch.zeros(2))
    a = torch.tensor([[[1.0, 2.0], [100.0, -300.0]]])
    assert torch.equal(amax(a, "token"), torch.tensor([[[2.0], [300.0]]]))


def test_relative_error_bounded_by_half_ulp():
    torch.manual_seed(0)
    x = torch.randn(10000) * 3
    s = compute_scale(x, "tensor")
    q = fake_quant(x, s)
    big = x.abs() / s > 2.0 ** -6 * 2  # normal range
    rel = ((q - x).abs() / x.abs())[big]
    assert rel.max().item() <= 1 / 16 + 1e-6

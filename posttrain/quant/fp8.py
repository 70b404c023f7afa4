"""FP8 E4M3 numerics: the format, scales, and exact quantize → dequantize.

What E4M3 is, in plain words
----------------------------
An FP8 E4M3 number is one byte: 1 sign bit, 4 exponent bits, 3 mantissa bits. So every power of
two between 2^-6 and 2^8 is split into only 8 steps: 1.000, 1.125, 1.250, ..., 1.875 (times the
power of two). The relative spacing between neighbours is 1/8 = 12.5% at the bottom of a binade
and 1/16 ≈ 6% at the top; rounding to nearest therefore makes a relative error of at most ~6%.

The "fn" flavour that hardware uses (``torch.float8_e4m3fn``: *f*inite, *n*an only) gives up the
infinities to keep more range: the largest number is 1.75 × 2^8 = **448**; the smallest normal is
2^-6 = 0.015625; below it, subnormals go down to 2^-9 ≈ 0.00195 in steps of 2^-9. There is no
infinity, and a single NaN bit pattern. A cast from float in PyTorch rounds to nearest-even; what
it does beyond ±448 has varied (NaN in older releases and on some back ends, saturation in torch
2.13 on this CPU), so we always *clamp to ±448 first*, then cast: saturation, whatever the version.

Why scales
----------
448 is tiny next to a weight or an activation's natural range, and 2^-9 is coarse next to small
values. So a tensor is stored as ``x ≈ fp8(x / s) * s`` with a float32 *scale* ``s`` chosen so the
largest magnitude lands on 448: ``s = amax / 448``. The scale can be per tensor (one ``s``), per
output channel of a weight (one ``s`` per row: rows with small weights keep their precision), or
per token of an activation (one ``s`` per row of the input, computed on the fly = "dynamic").
A *static* activation scale is fixed after calibration (the max |x| seen on calibration data);
values above it at run time saturate at ±448 × s.

On a CPU there is no FP8 matmul, so posttrain *simulates* FP8: it rounds with the real
``torch.float8_e4m3fn`` cast (bit-exact with the hardware format) and multiplies back by the scale
("fake quantization"), then computes in float32. The accuracy effect is the real one; the speed
and memory gains are not (those come from the exported checkpoint on an FP8 GPU).

Zero amax (an all-zero tensor or channel) gets scale 1, so 0 → 0 instead of 0/0. NaN inputs stay
NaN (the clamp keeps them); they are not silently turned into numbers.
"""

from __future__ import annotations

from typing import Literal

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_NORMAL = 2.0 ** -6
FP8_MIN_SUBNORMAL = 2.0 ** -9

Granularity = Literal["tensor", "channel", "token"]


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` in float32, with 1.0 where amax is 0 (or not finite), so 0 stays 0."""
    amax = amax.detach().to(torch.float32)
    bad = (amax <= 0) | ~torch.isfinite(amax)
    return torch.where(bad, torch.ones_like(amax), amax / FP8_MAX)


def amax(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """Max |x| per tensor (shape [1]), per row of the last two dims' first axis ("channel": a
    weight [out, in] → [out, 1]; a fused [experts, out, in] → [experts, out, 1]), or per token
    (every leading position of an activation [..., hidden] → [..., 1]). NaN is ignored."""
    a = x.detach().abs().to(torch.float32).nan_to_num(nan=0.0)
    if granularity == "tensor":
        return a.amax().reshape(1)
    # channel (weight rows) and token (activation rows) are both "max over the last dim"
    return a.amax(dim=-1, keepdim=True)


def compute_scale(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    return scale_from_amax(amax(x, granularity))


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale``, clamped to ±448 (saturating, NaN kept), cast to ``float8_e4m3fn``."""
    y = x.to(torch.float32) / scale.to(torch.float32)
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def from_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize → dequantize with the exact E4M3 rounding; same dtype as ``x``. The gradient is
    not needed (post-training quantization), so no straight-through estimator."""
    return from_fp8(to_fp8(x, scale), scale, x.dtype)


def fake_quant_dynamic(x: torch.Tensor, granularity: Granularity = "token") -> torch.Tensor:
    """Fake quantization with the scale computed from ``x`` itself (dynamic activations)."""
    return fake_quant(x, compute_scale(x, granularity))

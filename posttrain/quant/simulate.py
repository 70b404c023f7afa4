"""FP8 in the forward pass on a CPU: quantize → dequantize with the exact E4M3 rounding.

``FP8Linear`` replaces an ``nn.Linear``: it keeps the FP8 weight and its scale (what the export
writes) and a float copy of the *dequantized* weight (what the matmul uses), and fake-quantizes
its input (dynamic per-token scales, or a static calibrated per-tensor scale). Fused MoE expert
tensors are replaced by their dequantized FP8 values in place (weight-only in the simulation: the
experts' inputs are not quantized here, see docs/quantization.md). The FP8 KV cache is simulated
by fake-quantizing the outputs of ``k_proj`` / ``v_proj`` with static per-tensor scales (before
RoPE, where the cache holds keys after RoPE: an approximation for K, exact for V).

``apply_plan`` turns a BF16 model into its simulated FP8 version in place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from posttrain.quant.fp8 import (
    compute_scale,
    fake_quant,
    fake_quant_dynamic,
    from_fp8,
    to_fp8,
)


class FP8Linear(nn.Module):
    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 activations: str = "dynamic", input_scale: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight_fp8", weight_fp8, persistent=False)
        self.register_buffer("weight_scale", weight_scale.to(torch.float32), persistent=False)
        self.weight = nn.Parameter(from_fp8(weight_fp8, weight_scale, dtype), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        if activations == "static" and input_scale is None:
            raise ValueError("static activations need an input_scale (calibrate first)")
        self.activations = activations
        self.register_buffer("input_scale", None if input_scale is None else input_scale.to(torch.float32).reshape(1),
                             persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, weights: str = "channel", activations: str = "dynamic",
                    input_scale: torch.Tensor | None = None) -> FP8Linear:
        w = linear.weight.detach()
        scale = compute_scale(w, "channel" if weights == "channel" else "tensor")
        return cls(to_fp8(w, scale), scale, linear.bias, activations, input_scale, w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activations == "dynamic":
            x = fake_quant_dynamic(x, "token")
        elif self.activations == "static":
            x = fake_quant(x, self.input_scale)
        return nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        g = "channel" if self.weight_scale.numel() > 1 else "tensor"
        return f"in={self.in_features}, out={self.out_features}, weights=fp8/{g}, activations={self.activations}"


def get_module(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name)


def set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def round_weights(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """Round every parameter to ``dtype``'s values (kept in the model's dtype): the BF16 model."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype != dtype and p.is_floating_point():
                p.copy_(p.to(dtype).to(p.dtype))


def expert_scale(t: torch.Tensor, weights: str) -> torch.Tensor:
    """Fused experts [E, out, in]: one scale per expert and output channel, or per expert."""
    if weights == "channel":
        return compute_scale(t, "channel")
    return compute_scale(t.flatten(1), "channel").reshape(-1, 1, 1)


def kv_hook(scale: torch.Tensor) -> Any:
    def hook(_mod: nn.Module, _inp: Any, out: torch.Tensor) -> torch.Tensor:
        return fake_quant(out, scale)

    return hook


def apply_plan(model: nn.Module, plan: Any, weights: str = "channel", activations: str = "dynamic",
               input_scales: dict[str, torch.Tensor] | None = None,
               kv_scales: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
               only: set[str] | None = None) -> list[Any]:
    """Quantize ``plan``'s modules in place (``only``: restrict to these linears / expert tensors,
    for the search). Returns the KV hook handles (``.remove()`` them to undo the KV part)."""
    input_scales = input_scales or {}
    with torch.no_grad():
        for name in plan.linears:
            if only is not None and name not in only:
                continue
            lin = get_module(model, name)
            if isinstance(lin, FP8Linear):
                continue
            set_module(model, name, FP8Linear.from_linear(lin, weights, activations, input_scales.get(name)))
        for pname in plan.experts:
            if only is not None and pname not in only:
                continue
            mod_name, _, attr = pname.rpartition(".")
            p = getattr(get_module(model, mod_name), attr)
            p.copy_(fake_quant(p, expert_scale(p, weights)))
    handles = []
    for attn in plan.kv if only is None else []:
        k, v = (kv_scales or {})[attn]
        handles.append(get_module(model, f"{attn}.k_proj").register_forward_hook(kv_hook(k)))
        handles.append(get_module(model, f"{attn}.v_proj").register_forward_hook(kv_hook(v)))
    return handles

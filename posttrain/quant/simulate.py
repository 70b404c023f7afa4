"""FP8 in the forward pass on a CPU: quantize → dequantize with the exact E4M3 rounding.

``FP8Linear`` replaces an ``nn.Linear``: it keeps the FP8 weight and its scale (what the export
writes) and a float copy of the *dequantized* weight (what the matmul uses), and fake-quantizes
its input (dynamic per-token scales, or a static calibrated per-tensor scale). Fused MoE expert
tensors are replaced by their dequantized FP8 values in place (weight-only in the simulation: the
experts' inputs are not quantized here, see docs/quantization.md).

The FP8 KV cache is simulated where a serving engine quantizes it: on the keys and values the
attention reads, **after RoPE** (vLLM writes the rotated K into its FP8 cache with the layer's
``k_scale``). transformers' attention layers (Llama, NemotronH, ...) rotate K and then call the
function registered under ``config._attn_implementation`` with the module, Q, K and V; ``kv``
installs a wrapper there (``posttrain_fp8_kv|sdpa`` or ``|eager``) that rounds K and V with the
module's ``fp8_kv`` scales and then runs the original attention. Rounding the whole cache at every
step equals storing rounded values: the rounding is idempotent. Calibration uses the same wrapper
to observe max |K| after RoPE (``observe_kv``).

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


KV_ATTN = "posttrain_fp8_kv"


def _kv_attention(base: str) -> Any:
    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, **kwargs: Any) -> Any:
        kv = getattr(module, "fp8_kv", None)
        if kv is not None:
            key, value = kv(key, value)
        if base == "eager":
            import sys

            fn = sys.modules[type(module).__module__].eager_attention_forward
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            fn = ALL_ATTENTION_FUNCTIONS[base]
        return fn(module, query, key, value, attention_mask, **kwargs)

    return attention


def _use_kv_attention(model: nn.Module) -> None:
    """Point the model's attention at the K/V-rounding wrapper of its current implementation."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = model.config._attn_implementation or "sdpa"
    if base.startswith(KV_ATTN):
        return
    if base not in ("sdpa", "eager"):
        raise ValueError(f"FP8 KV cache simulation supports sdpa and eager attention, not {base!r}")
    name = f"{KV_ATTN}|{base}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(name, _kv_attention(base))
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    model.config._attn_implementation = name


class KVRound:
    """K and V as an FP8 cache holds them: rounded with static per-tensor scales, after RoPE."""

    def __init__(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        self.k_scale, self.v_scale = k_scale.reshape(1).float(), v_scale.reshape(1).float()
        self.enabled = True

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.enabled:
            return k, v
        return fake_quant(k, self.k_scale), fake_quant(v, self.v_scale)


class _Undo:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def remove(self) -> None:
        if hasattr(self.module, "fp8_kv"):
            del self.module.fp8_kv


def install_kv(model: nn.Module, scales: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[_Undo]:
    """FP8 KV cache on the named attention modules; ``.remove()`` a returned handle to undo one."""
    if not scales:
        return []
    _use_kv_attention(model)
    handles = []
    for attn, (k, v) in scales.items():
        mod = get_module(model, attn)
        mod.fp8_kv = KVRound(k, v)
        handles.append(_Undo(mod))
    return handles


def set_kv_enabled(model: nn.Module, enabled: bool) -> bool:
    """Switch the FP8 KV rounding on or off everywhere; returns whether the model has any."""
    found = False
    for m in model.modules():
        kv = getattr(m, "fp8_kv", None)
        if isinstance(kv, KVRound):
            kv.enabled, found = enabled, True
    return found


class _KVObserver:
    def __init__(self, track: Any, key: str) -> None:
        self.track, self.key = track, key

    def __call__(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.track(f"{self.key}:k", k)
        self.track(f"{self.key}:v", v)
        return k, v


def observe_kv(model: nn.Module, attns: list[str], track: Any) -> list[_Undo]:
    """Call ``track("<attn>:k", K)`` / ``track("<attn>:v", V)`` with the K (after RoPE) and V the
    attention reads, for calibration."""
    if not attns:
        return []
    _use_kv_attention(model)
    handles = []
    for attn in attns:
        mod = get_module(model, attn)
        mod.fp8_kv = _KVObserver(track, attn)
        handles.append(_Undo(mod))
    return handles


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
    if only is not None:
        return []
    return install_kv(model, {attn: (kv_scales or {})[attn] for attn in plan.kv})

"""FP8 in the forward pass on a CPU: quantize → dequantize with the exact E4M3 rounding.

``FP8Linear`` replaces an ``nn.Linear``: it keeps the FP8 weight and its scale (what the export
writes) and a float copy of the *dequantized* weight (what the matmul uses), and fake-quantizes
its input (dynamic per-token scales, or a static calibrated per-tensor scale). ``FP8Experts``
does the same for an MoE layer's fused experts (transformers keeps them as [experts, out, in]
tensors, not ``Linear``s): FP8 weights with one scale per expert and output channel (or per
expert), and the inputs of both projections fake-quantized (dynamic per token, or one static scale
per projection shared by all experts, which is what vLLM's FP8 MoE kernels use: the max of the
per-expert input scales). The export writes them per expert (``experts.E.up_proj.weight``).

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


def expert_mlp(mod: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
               up: torch.Tensor, down: torch.Tensor, q_up: Any = None, q_down: Any = None) -> torch.Tensor:
    """NemotronH's experts (non-gated: ``down(act(up(x)))``) for the routed tokens, with optional
    functions applied to each projection's input (FP8 rounding, or calibration statistics). The
    same loop as transformers' ``NemotronHExperts.forward``: with ``q_up = q_down = None`` and the
    module's own weights it computes the same numbers."""
    out = torch.zeros_like(hidden, dtype=top_k_weights.dtype)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=up.shape[0] + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().squeeze(-1)
    for e in hit.tolist():
        if e >= up.shape[0]:
            continue
        pos, tok = torch.where(mask[e])
        if tok.numel() == 0:
            continue
        x = hidden[tok]
        h = nn.functional.linear(x if q_up is None else q_up(x), up[e])
        h = mod.act_fn(h)
        h = nn.functional.linear(h if q_down is None else q_down(h), down[e])
        out.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(out.dtype))
    return out.to(hidden.dtype)


EXPERT_PROJS = ("up_proj", "down_proj")


def check_experts(mod: nn.Module, name: str) -> None:
    params = {n for n, _ in mod.named_parameters(recurse=False)}
    if params != set(EXPERT_PROJS) or not hasattr(mod, "act_fn"):
        raise ValueError(f"{name} ({type(mod).__name__}): FP8 experts support the non-gated up_proj/down_proj "
                         f"layout (NemotronH); this module has {sorted(params)}")


class FP8Experts(nn.Module):
    """Fused MoE experts in FP8: ``up_fp8`` [E, I, H] and ``down_fp8`` [E, H, I] with scales
    [E, out, 1] (per channel) or [E, 1, 1] (per expert), dequantized copies in ``up_proj`` /
    ``down_proj`` (the names transformers uses), inputs rounded like ``FP8Linear``'s."""

    def __init__(self, act_fn: Any, up_fp8: torch.Tensor, up_scale: torch.Tensor, down_fp8: torch.Tensor,
                 down_scale: torch.Tensor, activations: str = "dynamic", up_input_scale: torch.Tensor | None = None,
                 down_input_scale: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.act_fn = act_fn
        self.num_experts = up_fp8.shape[0]
        for n, t in (("up_fp8", up_fp8), ("up_scale", up_scale.float()), ("down_fp8", down_fp8),
                     ("down_scale", down_scale.float())):
            self.register_buffer(n, t, persistent=False)
        self.up_proj = nn.Parameter(from_fp8(up_fp8, up_scale, dtype), requires_grad=False)
        self.down_proj = nn.Parameter(from_fp8(down_fp8, down_scale, dtype), requires_grad=False)
        if activations == "static" and (up_input_scale is None or down_input_scale is None):
            raise ValueError("static activations need the experts' input scales (calibrate first)")
        self.activations = activations
        self.up_input_scale = None if up_input_scale is None else up_input_scale.float().reshape(1)
        self.down_input_scale = None if down_input_scale is None else down_input_scale.float().reshape(1)

    @classmethod
    def from_experts(cls, mod: nn.Module, weights: str = "channel", activations: str = "dynamic",
                     up_input_scale: torch.Tensor | None = None,
                     down_input_scale: torch.Tensor | None = None) -> FP8Experts:
        up, down = mod.up_proj.detach(), mod.down_proj.detach()
        su, sd = expert_scale(up, weights), expert_scale(down, weights)
        return cls(mod.act_fn, to_fp8(up, su), su, to_fp8(down, sd), sd, activations, up_input_scale,
                   down_input_scale, up.dtype)

    def _q(self, scale: torch.Tensor | None) -> Any:
        if self.activations == "dynamic":
            return lambda x: fake_quant_dynamic(x, "token")
        if self.activations == "static":
            return lambda x: fake_quant(x, scale)
        return None

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        return expert_mlp(self, hidden_states, top_k_index, top_k_weights, self.up_proj, self.down_proj,
                          self._q(self.up_input_scale), self._q(self.down_input_scale))

    def per_expert(self, proj: str, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ``e``'s FP8 weight [out, in] and its scale ([out, 1] per channel, [1] per expert)."""
        w, s = (self.up_fp8, self.up_scale) if proj == "up_proj" else (self.down_fp8, self.down_scale)
        sc = s[e] if s.shape[1] > 1 else s[e].reshape(1)
        return w[e].contiguous(), sc.contiguous()

    def extra_repr(self) -> str:
        g = "channel" if self.up_scale.shape[1] > 1 else "expert"
        return f"experts={self.num_experts}, weights=fp8/{g}, activations={self.activations}"


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


def expert_modules(expert_params: list[str]) -> list[str]:
    """The fused-experts modules named by a plan's expert parameters, in order."""
    return list(dict.fromkeys(p.rpartition(".")[0] for p in expert_params))


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
        for mod_name in expert_modules(plan.experts):
            if only is not None and not any(f"{mod_name}.{p}" in only for p in EXPERT_PROJS):
                continue
            mod = get_module(model, mod_name)
            if isinstance(mod, FP8Experts):
                continue
            check_experts(mod, mod_name)
            set_module(model, mod_name, FP8Experts.from_experts(
                mod, weights, activations, input_scales.get(f"{mod_name}.up_proj"),
                input_scales.get(f"{mod_name}.down_proj")))
    if only is not None:
        return []
    return install_kv(model, {attn: (kv_scales or {})[attn] for attn in plan.kv})

"""Importance of every prunable unit, from activations on calibration rows (Minitron).

One forward pass per row with hooks; each row runs alone, so no padding has to be masked out.
Per unit, a per-token magnitude is aggregated over the row's tokens (``mean`` of |a|, or ``l2``:
sqrt of the mean square) and summed over rows:

* MLP hidden channel: the input of ``down_proj`` (the activation after the gate / squared ReLU);
  NemotronH: each routed expert's channels over the tokens routed to it, and the shared expert's.
* attention head: the L2 norm of the head's slice of ``o_proj``'s input (its context vector).
* embedding channel: the output of every RMSNorm that reads the residual stream, summed over norms.
* Mamba head: the L2 norm of the head's slice of ``out_proj``'s input (after the gated norm).
* MoE expert: Σ over routed tokens of router weight × ‖expert output‖ (routed load × output norm).
* layer (depth): ``cosine``: 1 − cos(block input, block output), token mean (a block that barely
  turns the residual stream matters little); ``loglik``: the drop in calibration log-likelihood
  when the block is skipped (one extra pass per block; exact, slower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass
class Importance:
    """Scores per unit; lists are per layer (None where the layer has no such unit)."""

    mlp_hidden: list[Tensor | None] = field(default_factory=list)  # [I] (Llama) or [E, I] (routed experts)
    shared_hidden: list[Tensor | None] = field(default_factory=list)  # NemotronH shared expert [Is]
    heads: list[Tensor | None] = field(default_factory=list)  # [H]
    mamba_heads: list[Tensor | None] = field(default_factory=list)  # [nh]
    experts: list[Tensor | None] = field(default_factory=list)  # [E]
    hidden: Tensor | None = None  # [D]
    layers: Tensor | None = None  # [L], higher = more important
    rows: int = 0
    tokens: int = 0


def _agg(a: Tensor, how: str) -> Tensor:
    """[..., T, C] → [C]: per-channel magnitude over tokens."""
    a = a.detach().float().reshape(-1, a.shape[-1])
    return a.abs().mean(0) if how == "mean" else a.square().mean(0).sqrt()


def _head_agg(a: Tensor, n_heads: int, how: str) -> Tensor:
    """[..., T, n*d] → [n]: per-head L2 norm of the head's slice, aggregated over tokens."""
    a = a.detach().float().reshape(-1, n_heads, a.shape[-1] // n_heads).norm(dim=-1)
    return a.mean(0) if how == "mean" else a.square().mean(0).sqrt()


def _add(store: list[Any], i: int, x: Tensor) -> None:
    store[i] = x if store[i] is None else store[i] + x


def kind(model: Any) -> str:
    t = model.config.model_type
    if t in ("llama", "mistral", "qwen2"):
        return "llama"
    if t == "nemotron_h":
        return "nemotron_h"
    from posttrain.errors import UserError

    raise UserError(f"pruning supports Llama-style and NemotronH models, not model_type={t!r}")


def layers_of(model: Any) -> Any:
    return model.model.layers


def block_types(model: Any) -> list[str]:
    if kind(model) == "llama":
        return ["llama"] * len(layers_of(model))
    return list(model.config.layers_block_type)


@torch.no_grad()
def activation_importance(model: Any, rows: list[list[int]], aggregation: str = "mean",
                          depth_metric: str = "cosine") -> Importance:
    """Scores of every unit of ``model`` on ``rows`` (token-id lists); see the module docstring."""
    cfg, L = model.config, len(layers_of(model))
    imp = Importance(*[[None] * L for _ in range(5)])
    hid: list[Tensor | None] = [None]
    cos = torch.zeros(L)
    hooks = []

    def on_norm(_m: Any, _i: Any, out: Tensor) -> None:
        _add(hid, 0, _agg(out, aggregation))

    def mlp_hook(i: int, store: list[Any]) -> Any:
        return lambda _m, inp: _add(store, i, _agg(inp[0], aggregation))

    def head_hook(i: int, n: int, store: list[Any]) -> Any:
        return lambda _m, inp: _add(store, i, _head_agg(inp[0], n, aggregation))

    def block_hook(i: int) -> Any:
        def f(_m: Any, args: Any, kwargs: Any, out: Any) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            y = out[0] if isinstance(out, tuple) else out
            cos[i] += float(1 - torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1).mean())
        return f

    def expert_hook(i: int) -> Any:
        def f(m: Any, inp: Any, _out: Any) -> None:
            x, idx, w = inp
            E = m.num_experts
            load, ch = torch.zeros(E), torch.zeros(E, m.intermediate_dim)
            for e in range(E):
                tok, slot = torch.where(idx == e)
                if not len(tok):
                    continue
                h = m.act_fn(torch.nn.functional.linear(x[tok], m.up_proj[e]))
                y = torch.nn.functional.linear(h, m.down_proj[e])
                load[e] = float((w[tok, slot].float() * y.float().norm(dim=-1)).sum())
                ch[e] = _agg(h, aggregation) * len(tok)  # weighted by tokens routed
            _add(imp.experts, i, load)
            _add(imp.mlp_hidden, i, ch)
        return f

    for mod in model.modules():
        name = type(mod).__name__
        if name.endswith("RMSNorm") and getattr(mod, "weight", None) is not None \
                and mod.weight.shape[0] == cfg.hidden_size and "Gated" not in name:
            hooks.append(mod.register_forward_hook(on_norm))
    for i, (blk, t) in enumerate(zip(layers_of(model), block_types(model))):
        hooks.append(blk.register_forward_hook(block_hook(i), with_kwargs=True))
        if t == "llama":
            hooks.append(blk.mlp.down_proj.register_forward_pre_hook(mlp_hook(i, imp.mlp_hidden)))
            hooks.append(blk.self_attn.o_proj.register_forward_pre_hook(
                head_hook(i, cfg.num_attention_heads, imp.heads)))
        elif t in ("attention", "full_attention"):
            hooks.append(blk.mixer.o_proj.register_forward_pre_hook(head_hook(i, cfg.num_attention_heads, imp.heads)))
        elif t in ("mamba", "linear_attention"):
            hooks.append(blk.mixer.out_proj.register_forward_pre_hook(head_hook(i, cfg.mamba_num_heads, imp.mamba_heads)))
        elif t == "moe":
            hooks.append(blk.mixer.experts.register_forward_hook(expert_hook(i)))
            hooks.append(blk.mixer.shared_experts.down_proj.register_forward_pre_hook(mlp_hook(i, imp.shared_hidden)))
        elif t == "mlp":
            hooks.append(blk.mixer.down_proj.register_forward_pre_hook(mlp_hook(i, imp.mlp_hidden)))
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    try:
        for r in rows:
            ids = torch.tensor([r], device=dev)
            model(input_ids=ids, use_cache=False)
            imp.rows += 1
            imp.tokens += len(r)
    finally:
        for h in hooks:
            h.remove()
    imp.hidden = hid[0]
    if depth_metric == "cosine":
        imp.layers = cos / max(imp.rows, 1)
    else:
        imp.layers = skip_loglik_drop(model, rows)
    model.train(was)
    return imp


@torch.no_grad()
def mean_loglik(model: Any, rows: list[list[int]]) -> float:
    """Token-mean log-likelihood of ``rows`` (next-token, every position)."""
    dev = next(model.parameters()).device
    total, n = 0.0, 0
    for r in rows:
        ids = torch.tensor([r], device=dev)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        total -= float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        n += len(r) - 1
    return total / max(n, 1)


@torch.no_grad()
def skip_loglik_drop(model: Any, rows: list[list[int]]) -> Tensor:
    """Per block: calibration log-likelihood of the full model minus that with the block skipped
    (its output replaced by its input)."""
    full = mean_loglik(model, rows)
    drops = []
    for blk in layers_of(model):
        def skip(_m: Any, args: Any, kwargs: Any, out: Any) -> Any:
            x = args[0] if args else kwargs["hidden_states"]
            return (x, *out[1:]) if isinstance(out, tuple) else x
        h = blk.register_forward_hook(skip, with_kwargs=True)
        try:
            drops.append(full - mean_loglik(model, rows))
        finally:
            h.remove()
    return torch.tensor(drops)

"""The smaller architecture: its config from the target sizes, its weights cut from the big model.

Width is uniform across layers (plain ``transformers`` configs have one ``intermediate_size``,
one head count), but *which* channels, heads and experts survive is chosen per layer from that
layer's importance (``importance.py``). Heads are pruned inside KV groups: the kept KV groups are
the most important by the sum of their query heads, then each keeps its best query heads, so every
group keeps the same count (GQA intact). Mamba heads are pruned the same way inside each of the
layer's ``n_groups`` groups (group-aware SSM pruning: B/C and the gated norm's groups stay whole).

``check_target`` compares a target with the config alone, so an impossible one fails in one line
before any weight is read.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.compress.importance import Importance, block_types, kind
from posttrain.errors import UserError

Tensor = torch.Tensor


class PruneError(UserError):
    """A target the model cannot be cut to."""


@dataclass
class Sizes:
    mlp_hidden: int
    heads: int
    kv_heads: int
    hidden: int
    layers: int
    mamba_heads: int | None = None
    experts: int | None = None


def current_sizes(cfg: Any) -> Sizes:
    if cfg.model_type == "nemotron_h":
        return Sizes(cfg.moe_intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size,
                     len(cfg.layers_block_type), cfg.mamba_num_heads, cfg.n_routed_experts)
    return Sizes(cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size,
                 cfg.num_hidden_layers)


def check_target(cfg: Any, t: Any) -> Sizes:
    """The target's sizes (unset axes kept), or a one-line :class:`PruneError` naming the field."""
    now = current_sizes(cfg)
    heads = t.heads if t.heads is not None else now.heads
    kv = t.kv_heads if t.kv_heads is not None else now.kv_heads
    want = Sizes(t.mlp_hidden or now.mlp_hidden, heads, kv, t.hidden or now.hidden, t.layers or now.layers,
                 t.mamba_heads or now.mamba_heads, t.experts or now.experts)
    for axis in ("mlp_hidden", "heads", "kv_heads", "hidden", "layers", "mamba_heads", "experts"):
        new, old = getattr(want, axis), getattr(now, axis)
        if new is not None and old is None:
            raise PruneError(f"target.{axis}: this {cfg.model_type} model has no such axis")
        if new is not None and new > old:
            raise PruneError(f"target.{axis}={new} is larger than the model's {old}: pruning only removes")
    if heads % kv:
        raise PruneError(f"target.heads={heads} does not split into {kv} KV groups (GQA): give a multiple of "
                         f"{kv}, or set target.kv_heads to a divisor of {heads} (≤ {now.kv_heads})")
    if heads // kv > now.heads // now.kv_heads:
        raise PruneError(f"target.heads={heads} with kv_heads={kv} needs {heads // kv} query heads per KV group; "
                         f"the model has {now.heads // now.kv_heads}: raise target.kv_heads")
    head_dim = getattr(cfg, "head_dim", None) or now.hidden // now.heads
    if cfg.model_type != "nemotron_h" and getattr(cfg, "head_dim", None) is None and want.hidden != now.hidden:
        raise PruneError(f"target.hidden={want.hidden}: the model derives head_dim from hidden_size; set head_dim "
                         "in its config first")
    if cfg.model_type != "nemotron_h" and want.hidden % want.heads and (want.hidden, want.heads) != (now.hidden, now.heads):
        raise PruneError(f"target.hidden={want.hidden} is not a multiple of the {want.heads} attention heads kept: "
                         f"transformers' {cfg.model_type} config refuses it; give a multiple of "
                         f"{math.lcm(8, want.heads) if want.hidden != now.hidden else want.heads}")
    if want.hidden % 8 and want.hidden != now.hidden:
        raise PruneError(f"target.hidden={want.hidden} must be a multiple of 8 (the embedding rows and every norm "
                         "are cut to it; kernels and vLLM want aligned widths)")
    if want.mamba_heads is not None and want.mamba_heads % cfg.n_groups:
        raise PruneError(f"target.mamba_heads={want.mamba_heads} is not a multiple of n_groups={cfg.n_groups}: "
                         "Mamba heads are pruned inside each group, every group keeps the same count")
    if want.experts is not None:
        if want.experts < cfg.num_experts_per_tok:
            raise PruneError(f"target.experts={want.experts} is below num_experts_per_tok={cfg.num_experts_per_tok}")
        if want.experts % cfg.n_group:
            raise PruneError(f"target.experts={want.experts} is not a multiple of the router's n_group={cfg.n_group}")
    del head_dim
    return want


def new_config(cfg: Any, s: Sizes, keep_layers: list[int]) -> Any:
    c = copy.deepcopy(cfg)
    c.hidden_size, c.num_attention_heads, c.num_key_value_heads = s.hidden, s.heads, s.kv_heads
    if cfg.model_type == "nemotron_h":
        f = s.mlp_hidden / cfg.moe_intermediate_size
        c.moe_intermediate_size = s.mlp_hidden
        c.moe_shared_expert_intermediate_size = max(1, round(cfg.moe_shared_expert_intermediate_size * f))
        c.intermediate_size = max(1, round(cfg.intermediate_size * f))
        c.mamba_num_heads, c.n_routed_experts = s.mamba_heads, s.experts
        c.layers_block_type = [cfg.layers_block_type[i] for i in keep_layers]
        c.num_hidden_layers = len(keep_layers)
    else:
        c.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        c.intermediate_size, c.num_hidden_layers = s.mlp_hidden, len(keep_layers)
        if getattr(c, "layer_types", None) is not None:
            c.layer_types = [cfg.layer_types[i] for i in keep_layers]
    return c


def count_params(cfg: Any) -> int:
    """Parameters of a model with this config (built on the meta device: no memory, ~50 ms)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in m.parameters())


# --------------------------------------------------------------------------- which units survive


def top(scores: Tensor, k: int) -> Tensor:
    """Indices of the k highest scores, in their original order (so kept units keep their order)."""
    return torch.topk(scores.float(), k).indices.sort().values


def grouped_top(scores: Tensor, groups: int, keep_groups: int, per_group: int) -> tuple[Tensor, Tensor]:
    """(kept unit indices, kept group indices) for units laid out group-major: the best
    ``keep_groups`` groups by total score, then the best ``per_group`` units inside each."""
    g = scores.float().view(groups, -1)
    kept_g = top(g.sum(1), keep_groups)
    size = g.shape[1]
    units = [int(gi) * size + top(g[gi], per_group) for gi in kept_g]
    return torch.cat(units), kept_g


def _heads_channels(heads: Tensor, dim: int) -> Tensor:
    return (heads[:, None] * dim + torch.arange(dim)).flatten()


def _or_ones(x: Tensor | None, n: int) -> Tensor:
    return x if x is not None else torch.ones(n)


# --------------------------------------------------------------------------- the cut


@torch.no_grad()
def prune_model(model: Any, imp: Importance, s: Sizes) -> Any:
    """A new model of sizes ``s`` whose weights are the big model's surviving slices."""
    from transformers import AutoModelForCausalLM

    cfg = model.config
    types = block_types(model)
    keep_layers = top(imp.layers if imp.layers is not None else torch.arange(len(types), dtype=torch.float),
                      s.layers).tolist()
    hid = top(_or_ones(imp.hidden, cfg.hidden_size), s.hidden)
    ncfg = new_config(cfg, s, keep_layers)
    old = model.state_dict()
    new: dict[str, Tensor] = {}
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def take(name: str, *idx: Tensor | None) -> Tensor:
        w = old[name]
        for dim, ix in enumerate(idx):
            if ix is not None:
                w = w.index_select(dim, ix.to(w.device))
        return w.clone()

    def attention(src: str, dst: str, i: int) -> None:
        h = _or_ones(imp.heads[i], cfg.num_attention_heads)
        q_heads, kv_groups = grouped_top(h, cfg.num_key_value_heads, s.kv_heads, s.heads // s.kv_heads)
        q, kv = _heads_channels(q_heads, hd), _heads_channels(kv_groups, hd)
        for p, rows, cols in (("q_proj", q, hid), ("k_proj", kv, hid), ("v_proj", kv, hid), ("o_proj", hid, q)):
            new[f"{dst}.{p}.weight"] = take(f"{src}.{p}.weight", rows, cols)
            if f"{src}.{p}.bias" in old:
                new[f"{dst}.{p}.bias"] = take(f"{src}.{p}.bias", rows)

    def mlp(src: str, dst: str, scores: Tensor | None, n_old: int, n_new: int, gated: bool) -> None:
        m = top(_or_ones(scores, n_old), n_new)
        for p in (("gate_proj", "up_proj") if gated else ("up_proj",)):
            new[f"{dst}.{p}.weight"] = take(f"{src}.{p}.weight", m, hid)
        new[f"{dst}.down_proj.weight"] = take(f"{src}.down_proj.weight", hid, m)

    if kind(model) == "llama":
        new["model.embed_tokens.weight"] = take("model.embed_tokens.weight", None, hid)
        for j, i in enumerate(keep_layers):
            src, dst = f"model.layers.{i}", f"model.layers.{j}"
            attention(src + ".self_attn", dst + ".self_attn", i)
            mlp(src + ".mlp", dst + ".mlp", imp.mlp_hidden[i], cfg.intermediate_size, s.mlp_hidden, True)
            for n in ("input_layernorm", "post_attention_layernorm"):
                new[f"{dst}.{n}.weight"] = take(f"{src}.{n}.weight", hid)
        new["model.norm.weight"] = take("model.norm.weight", hid)
    else:
        new["model.embeddings.weight"] = take("model.embeddings.weight", None, hid)
        for j, i in enumerate(keep_layers):
            src, dst, t = f"model.layers.{i}.mixer", f"model.layers.{j}.mixer", types[i]
            new[f"model.layers.{j}.norm.weight"] = take(f"model.layers.{i}.norm.weight", hid)
            if t in ("attention", "full_attention"):
                attention(src, dst, i)
            elif t in ("mamba", "linear_attention"):
                _mamba(cfg, ncfg, src, dst, imp.mamba_heads[i], hid, take, new)
            elif t == "moe":
                _moe(cfg, ncfg, src, dst, imp.experts[i], imp.mlp_hidden[i], imp.shared_hidden[i], hid, take, new)
            elif t == "mlp":
                mlp(src, dst, imp.mlp_hidden[i], cfg.intermediate_size, ncfg.intermediate_size, False)
        new["model.norm_f.weight"] = take("model.norm_f.weight", hid)
    if "lm_head.weight" in old and not cfg.tie_word_embeddings:
        new["lm_head.weight"] = take("lm_head.weight", None, hid)
    small = AutoModelForCausalLM.from_config(ncfg).to(dtype=next(model.parameters()).dtype)
    missing, unexpected = small.load_state_dict(new, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and ncfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"pruned state dict does not match the new architecture: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    if ncfg.tie_word_embeddings:
        small.tie_weights()
    return small


def _mamba(cfg: Any, ncfg: Any, src: str, dst: str, scores: Tensor | None, hid: Tensor, take: Any,
           new: dict[str, Tensor]) -> None:
    nh, d, G, N = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size
    I = nh * d
    heads, _ = grouped_top(_or_ones(scores, nh), G, G, ncfg.mamba_num_heads // G)
    ch = _heads_channels(heads, d)
    bc = torch.arange(2 * G * N)
    # in_proj rows: [z (I) | x (I) | B, C (2GN) | dt (nh)]; conv1d channels: [x (I) | B, C (2GN)]
    rows = torch.cat([ch, I + ch, 2 * I + bc, 2 * I + 2 * G * N + heads])
    new[f"{dst}.in_proj.weight"] = take(f"{src}.in_proj.weight", rows, hid)
    conv = torch.cat([ch, I + bc])
    new[f"{dst}.conv1d.weight"] = take(f"{src}.conv1d.weight", conv)
    try:  # use_conv_bias
        new[f"{dst}.conv1d.bias"] = take(f"{src}.conv1d.bias", conv)
    except KeyError:
        pass
    for p in ("dt_bias", "A_log", "D"):
        new[f"{dst}.{p}"] = take(f"{src}.{p}", heads)
    new[f"{dst}.norm.weight"] = take(f"{src}.norm.weight", ch)
    new[f"{dst}.out_proj.weight"] = take(f"{src}.out_proj.weight", hid, ch)


def _moe(cfg: Any, ncfg: Any, src: str, dst: str, experts: Tensor | None, channels: Tensor | None,
         shared: Tensor | None, hid: Tensor, take: Any, new: dict[str, Tensor]) -> None:
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    ex = top(_or_ones(experts, E), ncfg.n_routed_experts)
    new[f"{dst}.gate.weight"] = take(f"{src}.gate.weight", ex, hid)
    new[f"{dst}.gate.e_score_correction_bias"] = take(f"{src}.gate.e_score_correction_bias", ex)
    ch = channels if channels is not None else torch.ones(E, I)
    up, down = take(f"{src}.experts.up_proj", ex, None, hid), take(f"{src}.experts.down_proj", ex, hid)
    keep = torch.stack([top(ch[int(e)], ncfg.moe_intermediate_size) for e in ex])  # [E', I'] per expert
    new[f"{dst}.experts.up_proj"] = torch.stack([up[k].index_select(0, keep[k]) for k in range(len(ex))])
    new[f"{dst}.experts.down_proj"] = torch.stack([down[k].index_select(1, keep[k]) for k in range(len(ex))])
    m = top(_or_ones(shared, cfg.moe_shared_expert_intermediate_size), ncfg.moe_shared_expert_intermediate_size)
    new[f"{dst}.shared_experts.up_proj.weight"] = take(f"{src}.shared_experts.up_proj.weight", m, hid)
    new[f"{dst}.shared_experts.down_proj.weight"] = take(f"{src}.shared_experts.down_proj.weight", hid, m)

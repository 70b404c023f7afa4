"""A decode loop over a preallocated KV cache for Llama-architecture HF modules (SmolLM2 is one).

``HFGenerator`` drives the model one token per step. Through ``model.forward`` each step also builds
a 4-D attention mask, recomputes the rotary tables, grows a ``DynamicCache`` by concatenation (every
layer's K and V copied, every step) and runs 30 layers of small ops. This module runs the same
layers with that bookkeeping done once; on the embedded model in bf16 on one core it decodes 1.48x
as many tokens/s at batch 32 and 1.87x at batch 1 (bench/rollout_throughput.py, docs/benchmarks.md
"Static KV cache and prepacked weights"):

* one K and one V buffer per layer, ``[rows, kv_heads, capacity, head_dim]``, written in place at
  the step's slot. The capacity
  starts at the prompt width + 32 slots and grows by 32 (or an eighth) when a long generation needs
  it; attention runs over the whole contiguous buffer with unwritten slots masked, because a
  ``[:t]`` slice made every batched matmul copy it;
* one key-validity mask ``[rows, capacity]`` (left padding and unwritten slots False) replaces the
  causal 4-D mask: every row writes the same slot each step, so causality is the slot order itself;
* the rotary table is computed once per call for every position a row can reach, by the model's
  own ``rotary_emb`` (so any RoPE scaling the config asks for is the model's);
* in decode, the ``G`` query heads that share one KV head attend as ``G`` query positions of it
  (``[rows, kv_heads, G, head_dim]``): grouped-query attention without repeating K and V.

Two ways through a layer. By default the layer modules themselves are called (norms, projections,
the MLP, the LM head), so adapters, hooks and an fp32 policy's live weights apply as they would in
``model.forward``, and the logits match it to float rounding (tests/unit/test_static_llama.py
teacher-forces against it). A bf16 model with stock modules and no hooks (the RL stage's bf16
sampling copy) takes ``PackedWeights``: its weights prepacked for oneDNN, Q/K/V and gate/up as one
matmul each, one fused RMSNorm kernel and one rotary pass; the logits then match to bf16 rounding.

Finished rows are not removed each step (that is a copy of the whole cache): they ride along until
an eighth of the rows are finished, then the cache is compacted. Other architectures (the hybrid
NemotronH with its Mamba states) keep the ``DynamicCache`` loop.
"""

from __future__ import annotations

from typing import Any

GROW_SLOTS = 32  # decode slots added at a time (at least; an eighth of the capacity when that is more)


def supports(model: Any) -> bool:
    """True for a transformers ``LlamaForCausalLM`` whose layers are the stock Llama modules."""
    try:
        from transformers.models.llama import modeling_llama as ml
    except ImportError:  # pragma: no cover - transformers always ships Llama
        return False
    if not isinstance(model, ml.LlamaForCausalLM):
        return False
    layers = model.model.layers
    return all(type(layer) is ml.LlamaDecoderLayer and type(layer.self_attn) is ml.LlamaAttention for layer in layers)


def _rotate(x_BHTD: Any, cos_B1TD: Any, sin_B1TD: Any) -> Any:
    """Rotary embedding, the HF convention (``rotate_half``: the two halves of each head swap)."""
    import torch

    half = x_BHTD.shape[-1] // 2
    rotated = torch.cat((-x_BHTD[..., half:], x_BHTD[..., :half]), dim=-1)
    return x_BHTD * cos_B1TD + rotated * sin_B1TD


class StaticCacheDecoder:
    """Prefill then single-token steps of one ``LlamaForCausalLM`` for a fixed set of rows.

    ``prefill(ids, valid, positions, expand)`` runs the (left-padded, unique) prompts once and
    writes their K/V into the cache rows ``expand`` names (row r takes prompt ``expand[r]``);
    ``step(tokens, positions)`` decodes one token for every cache row; ``keep(rows)`` compacts.
    Both return fp32 logits ``[rows, vocab]`` of the last position.
    """

    def __init__(self, model: Any, rows: int, width: int, max_new_tokens: int,
                 packed: "PackedWeights | None" = None) -> None:
        import torch

        self.model = model
        self.packed = packed
        cfg = model.config
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = cfg.num_key_value_heads
        self.heads = cfg.num_attention_heads
        self.scaling = attn.scaling
        self.limit = width + max_new_tokens  # the most slots any row can use
        capacity = min(self.limit, width + GROW_SLOTS)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in model.model.layers]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in model.model.layers]
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, device=self.device)
        self.filled = 0  # slots written so far (the same for every row)
        # cos/sin for every position a row can reach: the model's own rotary module, once
        positions = torch.arange(self.limit, device=self.device)[None]
        cos, sin = model.model.rotary_emb(torch.empty(0, dtype=self.dtype, device=self.device), positions)
        self.cos, self.sin = cos[0], sin[0]  # [limit, head_dim]
        half = self.head_dim // 2
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def _grow(self, need: int) -> None:
        import torch

        if need <= self.capacity:
            return
        new = min(self.limit, max(need, self.capacity + max(GROW_SLOTS, self.capacity // 8)))
        pad = new - self.capacity
        self.k = [torch.nn.functional.pad(k, (0, 0, 0, pad)) for k in self.k]
        self.v = [torch.nn.functional.pad(v, (0, 0, 0, pad)) for v in self.v]
        self.valid = torch.nn.functional.pad(self.valid, (0, pad))

    def keep(self, rows: Any) -> None:
        """Keep only cache rows ``rows`` (a LongTensor), in that order."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.valid = self.valid.index_select(0, rows)

    def prefill(self, ids_UT: Any, valid_UT: Any, positions_UT: Any, expand_R: Any) -> Any:
        """Run U unique left-padded prompts; cache row r gets prompt ``expand_R[r]``. Logits [R, V]."""
        import torch
        import torch.nn.functional as F

        U, T = ids_UT.shape
        model = self.model.model
        x = model.embed_tokens(ids_UT)
        cos, sin = self.cos[positions_UT][:, None], self.sin[positions_UT][:, None]  # [U, 1, T, D]
        causal = torch.ones((T, T), dtype=torch.bool, device=self.device).tril()
        # a padding query sees only itself (an all-False row would give NaN, and NaN K/V at padded
        # slots would poison later rows through 0 * NaN); real queries never see padding keys
        mask = (causal[None] & valid_UT[:, None, :]) | torch.eye(T, dtype=torch.bool, device=self.device)[None]
        mask = mask[:, None]  # [U, 1, T, T]
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(U, T, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(U, T, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(U, T, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            self.k[i][:, :, :T] = k[expand_R]
            self.v[i][:, :, :T] = v[expand_R]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(U, T, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.valid[:, :T] = valid_UT[expand_R]
        self.filled = T
        last = model.norm(x[:, -1:])
        return self.model.lm_head(last)[:, 0].float()[expand_R]

    def step(self, tokens_R: Any, positions_R: Any) -> Any:
        """One token for every cache row at its own position; logits [R, V]."""
        import torch

        R = tokens_R.shape[0]
        slot = self.filled
        self._grow(slot + 1)
        self.valid[:, slot] = True
        self.filled = slot + 1
        G, D, Hkv, cap = self.heads // self.kv_heads, self.head_dim, self.kv_heads, self.capacity
        # one additive mask for every layer, laid out as the scores: [R * kv_heads, G, capacity];
        # attention runs over the whole (contiguous) buffer with unwritten slots masked: a strided
        # [:t] slice made each batched matmul copy it, which cost more than the masked slots do
        mask = torch.zeros((R, 1, 1, cap), dtype=self.dtype, device=self.device)
        mask.masked_fill_(~self.valid[:, None, None, :], torch.finfo(self.dtype).min)
        mask = mask.expand(R, Hkv, G, cap).reshape(R * Hkv, G, cap)
        x = self.model.model.embed_tokens(tokens_R[:, None])  # [R, 1, hidden]
        if self.packed is not None:
            return self._layers_packed(x, positions_R, mask, slot)
        cos, sin = self.cos[positions_R][:, None, None], self.sin[positions_R][:, None, None]  # [R, 1, 1, D]
        for i, layer in enumerate(self.model.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            # the G query heads of one KV head stand as G query positions of it: [R, kv_heads, G, D]
            q = _rotate(attn.q_proj(h).view(R, Hkv, G, D), cos, sin)
            self.k[i][:, :, slot] = _rotate(attn.k_proj(h).view(R, Hkv, 1, D), cos, sin)[:, :, 0]
            self.v[i][:, :, slot] = attn.v_proj(h).view(R, Hkv, D)
            x = x + attn.o_proj(self._attend(i, q, mask))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(self.model.model.norm(x))[:, 0].float()

    def _attend(self, i: int, q_RHGD: Any, mask: Any) -> Any:
        """Eager attention of layer ``i`` (HF's eager path: fp32 softmax) as batched matmuls over
        ``R * kv_heads`` views of the cache. At these sizes it is ~3x faster on a CPU core than
        ``scaled_dot_product_attention``'s flash kernel (93 vs 285 us a layer at batch 32)."""
        import torch

        R, Hkv, G, D = q_RHGD.shape
        keys = self.k[i].view(R * Hkv, self.capacity, D).transpose(1, 2)
        scores = torch.baddbmm(mask, q_RHGD.reshape(R * Hkv, G, D), keys, alpha=self.scaling)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
        return torch.bmm(probs, self.v[i].view(R * Hkv, self.capacity, D)).reshape(R, 1, Hkv * G * D)

    def _layers_packed(self, x: Any, positions_R: Any, mask: Any, slot: int) -> Any:
        """``step``'s layers on prepacked weights with fused small ops (half the op count): one
        Q/K/V and one gate/up matmul, one RMSNorm kernel, one rotary pass over Q and K together."""
        import torch
        import torch.nn.functional as F

        R, packed = x.shape[0], self.packed
        G, D, Hkv = self.heads // self.kv_heads, self.head_dim, self.kv_heads
        nq = Hkv * G + Hkv  # query heads then key heads, rotated together
        cos = self.cos[positions_R][:, None]  # [R, 1, D]
        sin = self.sin_signed[positions_R][:, None]
        for i, layer in enumerate(self.model.model.layers):
            norm = layer.input_layernorm
            qkv = packed.linear(i, "qkv", F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon))
            qk = qkv[:, 0, : nq * D].view(R, nq, D)
            # rotate_half(x) * sin == flip(halves of x) * (sin with its first half negated)
            qk = torch.addcmul(qk * cos, qk.view(R, nq, 2, D // 2).flip(-2).view(R, nq, D), sin)
            self.k[i][:, :, slot] = qk[:, Hkv * G:]
            self.v[i][:, :, slot] = qkv[:, 0, nq * D:].view(R, Hkv, D)
            x = x + packed.linear(i, "o", self._attend(i, qk[:, : Hkv * G].view(R, Hkv, G, D), mask))
            norm = layer.post_attention_layernorm
            gate, up = packed.linear(i, "gate_up", F.rms_norm(x, norm.weight.shape, norm.weight,
                                                              norm.variance_epsilon)).chunk(2, dim=-1)
            x = x + packed.linear(i, "down", layer.mlp.act_fn(gate) * up)
        norm = self.model.model.norm
        h = F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
        return packed.linear(-1, "head", h)[:, 0].float()


class PackedWeights:
    """The decoder's bf16 linear weights, reordered once into oneDNN's blocked layout, with the Q/K/V
    and gate/up projections concatenated (one matmul each instead of three and two).

    ``F.linear`` on a plain bf16 weight reorders it on every call; at batch 32 on the embedded
    model's shapes a prepacked weight runs the same kernel ~25% faster with bit-identical outputs
    (576x1536: 0.158 -> 0.127 ms; LM head 6.5 -> 4.9 ms; measured 2026-12-05, one AVX-512-bf16 core).
    Only bf16 modules on the CPU, with plain ``nn.Linear`` projections, no hooks and no biases qualify; ``fresh`` tells a stale pack (any weight
    changed in place since packing, e.g. by an optimizer step or ``update_weights``, or replaced)
    by the parameters' version counters and storage addresses.
    """

    def __init__(self, model: Any, rows_hint: int = 32) -> None:
        import torch

        pack = torch.ops.mkldnn._reorder_linear_weight
        self.signature = self.versions(model)
        self.layers: list[dict[str, Any]] = []
        with torch.no_grad():
            for layer in model.model.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append({
                    "qkv": pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), rows_hint),
                    "o": pack(a.o_proj.weight, rows_hint),
                    "gate_up": pack(torch.cat([m.gate_proj.weight, m.up_proj.weight]), rows_hint),
                    "down": pack(m.down_proj.weight, rows_hint),
                })
            self.head = pack(model.lm_head.weight, rows_hint)

    @staticmethod
    def eligible(model: Any) -> bool:
        import torch

        p = next(model.parameters())
        if not torch.backends.mkldnn.is_available() or p.dtype != torch.bfloat16 or p.device.type != "cpu":
            return False  # oneDNN's packed layout is a CPU one
        if not supports(model):
            return False
        # the projections packed must be the plain Linear modules themselves: a wrapper around one
        # (an adapter, e.g. peft's LoRA layer) would be skipped by reading its base weight
        projections = [model.lm_head] + [m for layer in model.model.layers for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        if any(type(m) is not torch.nn.Linear for m in projections):
            return False
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        norms = [m for layer in model.model.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)]
        if any(type(n) is not LlamaRMSNorm for n in [*norms, model.model.norm]):
            return False
        for mod in model.modules():
            if mod._forward_hooks or mod._forward_pre_hooks:
                return False
            if isinstance(mod, torch.nn.Linear) and (mod.bias is not None or type(mod) is not torch.nn.Linear):
                return False
        return True

    @staticmethod
    def versions(model: Any) -> tuple[tuple[int, int], ...]:
        """Each parameter's storage address and in-place version: an optimizer step or ``copy_``
        bumps the version, ``p.data = new`` (train/master_weights.py) changes the address."""
        return tuple((p.data_ptr(), p._version) for p in model.parameters())

    def fresh(self, model: Any) -> bool:
        return self.versions(model) == self.signature

    def linear(self, layer: int, name: str, x: Any) -> Any:
        import torch

        w = self.head if name == "head" else self.layers[layer][name]
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

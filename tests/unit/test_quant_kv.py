"""The simulated FP8 KV cache rounds K after RoPE, as a serving engine's FP8 cache does."""

from __future__ import annotations

import torch

from posttrain.quant.fp8 import fake_quant


def _tiny_llama():
    from posttrain.models.loading import load_model

    model = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.eval()
    return model


def test_k_is_rounded_after_rope_not_before(one_thread):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from posttrain.quant.simulate import KVRound, install_kv

    model = _tiny_llama()
    attn_name = "model.layers.0.self_attn"
    attn = model.get_submodule(attn_name)
    ids = torch.tensor([[5, 17, 33, 101, 7, 9, 250, 3]])
    with torch.no_grad():
        ref_logits = model(ids, use_cache=False).logits
    # what k_proj produces, and the rotated keys computed by hand from the model's own RoPE
    seen: dict[str, torch.Tensor] = {}
    h = attn.k_proj.register_forward_hook(lambda _m, _i, out: seen.__setitem__("k_proj", out.detach()))
    k_scale, v_scale = torch.tensor([0.01]), torch.tensor([0.02])
    rounder = KVRound(k_scale, v_scale)

    def spy(k, v):
        seen["k_in"], seen["v_in"] = k.detach(), v.detach()
        k2, v2 = rounder(k, v)
        seen["k_out"] = k2.detach()
        return k2, v2

    handles = install_kv(model, {attn_name: (k_scale, v_scale)})
    attn.fp8_kv = spy
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    h.remove()
    b, t = ids.shape
    k_heads = seen["k_proj"].view(b, t, -1, attn.head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(k_heads, torch.arange(t).unsqueeze(0))
    _, k_rot = apply_rotary_pos_emb(k_heads, k_heads, cos, sin)
    assert not torch.allclose(k_rot, k_heads)  # RoPE moved the keys (positions 1..7)
    # the attention's keys are the rotated ones, and they are rounded on the rotated values
    torch.testing.assert_close(seen["k_in"], k_rot, rtol=1e-6, atol=1e-6)
    assert torch.equal(seen["k_out"], fake_quant(seen["k_in"], k_scale))
    on_grid = (seen["k_out"] / k_scale).to(torch.float8_e4m3fn).float() * k_scale
    assert torch.equal(on_grid, seen["k_out"])  # every cached key value is an FP8 value × scale
    # rounding before RoPE (the old approximation) gives different keys
    _, k_pre = apply_rotary_pos_emb(fake_quant(k_heads, k_scale), fake_quant(k_heads, k_scale), cos, sin)
    assert not torch.allclose(k_pre, seen["k_out"], atol=1e-7)
    assert not torch.equal(logits, ref_logits)
    for hd in handles:
        hd.remove()
    assert not hasattr(attn, "fp8_kv")
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, ref_logits)


def test_kv_rounding_off_is_the_plain_model_and_cache_matches_full_pass(one_thread):
    from posttrain.quant.simulate import install_kv, set_kv_enabled

    model = _tiny_llama()
    ids = torch.tensor([[5, 17, 33, 101, 7, 9, 250, 3]])
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    attns = [f"model.layers.{i}.self_attn" for i in range(model.config.num_hidden_layers)]
    install_kv(model, {a: (torch.tensor([0.01]), torch.tensor([0.01])) for a in attns})
    assert set_kv_enabled(model, False)
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, ref)
    set_kv_enabled(model, True)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        # incremental decoding with the cache: rounding the cache at every step = storing it rounded
        out = model(ids[:, :5], use_cache=True)
        step = model(ids[:, 5:], cache=out.past_key_values, use_cache=True).logits
    torch.testing.assert_close(step, full[:, 5:], rtol=1e-4, atol=1e-4)


def test_calibrated_k_scale_is_the_max_of_rotated_keys(one_thread):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from posttrain.quant.calibrate import collect_amax
    from posttrain.quant.fp8 import scale_from_amax

    model = _tiny_llama()
    attn_name = "model.layers.1.self_attn"
    attn = model.get_submodule(attn_name)
    ids = torch.tensor([[5, 17, 33, 101, 7, 9, 250, 3, 44, 45, 46, 47]])
    seen = {}
    h = attn.k_proj.register_forward_hook(lambda _m, _i, out: seen.__setitem__("k", out.detach()))
    _, kv = collect_amax(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}], [], [attn_name])
    h.remove()
    b, t = ids.shape
    k_heads = seen["k"].view(b, t, -1, attn.head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(k_heads, torch.arange(t).unsqueeze(0))
    _, k_rot = apply_rotary_pos_emb(k_heads, k_heads, cos, sin)
    torch.testing.assert_close(kv[attn_name][0], scale_from_amax(k_rot.abs().amax().reshape(1)))
    assert not torch.allclose(kv[attn_name][0], scale_from_amax(k_heads.abs().amax().reshape(1)))

"""Selective FP8 on tiny models: the recipe's rule, the search, export → load round trips."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.configs.quant import QuantConfig
from tests.require import require


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
    from posttrain.data.synthetic import arithmetic_rows

    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(40, seed=0)))
    return str(path)


def _cfg(tmp_path, model, sft_file, **kw):
    base = {"model": model, "out": str(tmp_path / "fp8"), "threads": 1,
            "calibration": {"data": [sft_file], "samples": 16, "max_seq_len": 64, "batch_size": 8},
            "search": {"samples": 8}}
    for k, v in kw.items():
        if isinstance(v, dict):
            base.setdefault(k, {}).update(v)
        else:
            base[k] = v
    return QuantConfig.model_validate(base)


def test_recipe_rule_on_tiny_nemotronh(one_thread):
    from posttrain.models.loading import load_model
    from posttrain.quant.policy import find_units, make_plan

    model = load_model("tiny-nemotronh", device="cpu").model
    units = find_units(model)
    assert [(u.name, u.kind) for u in units] == [
        ("model.layers.0.mixer", "mamba"), ("model.layers.1.mixer", "moe"),
        ("model.layers.2.mixer", "attention"), ("model.layers.3.mixer", "moe")]
    plan = make_plan(model, "recipe")
    # attention (layer 2) and the Mamba layer feeding it (layer 0) stay BF16; both MoE layers FP8
    assert plan.bf16_units == ["model.layers.0.mixer", "model.layers.2.mixer"]
    assert plan.linears == [f"model.layers.{i}.mixer.shared_experts.{p}" for i in (1, 3) for p in ("up_proj", "down_proj")]
    assert plan.experts == [f"model.layers.{i}.mixer.experts.{p}" for i in (1, 3) for p in ("up_proj", "down_proj")]
    assert plan.kv == ["model.layers.2.mixer"]
    # never quantized: embeddings, LM head, conv1d, routers — under any policy
    everything = make_plan(model, "all")
    fp8 = set(everything.linears) | set(everything.experts)
    for name, _ in model.named_parameters():
        if any(s in name for s in ("embeddings", "lm_head", "conv1d", "mixer.gate", "norm")):
            assert name.rpartition(".")[0] not in fp8 and name not in fp8, name
    assert "model.layers.0.mixer.in_proj" in everything.linears and "lm_head" in everything.ignore
    assert everything.kv == []
    # patterns: keep every in_proj and the attention's o_proj
    pat = make_plan(model, "patterns", keep_bf16=[r"in_proj$", r"o_proj$"])
    assert "model.layers.0.mixer.in_proj" in pat.ignore and "model.layers.0.mixer.out_proj" in pat.linears
    assert "model.layers.2.mixer.o_proj" in pat.ignore and "model.layers.2.mixer.q_proj" in pat.linears


@pytest.mark.parametrize("model,activations,weights", [("tiny-nemotronh", "static", "channel"),
                                                        ("tiny-llama", "dynamic", "tensor")])
def test_quantize_export_load_round_trip(tmp_path, sft_file, one_thread, model, activations, weights):
    from safetensors import safe_open

    from posttrain.quant import calibrate
    from posttrain.quant.checkpoint import is_fp8_checkpoint, load_fp8
    from posttrain.quant.run import prepare, quantize
    from posttrain.quant.simulate import apply_plan

    cfg = _cfg(tmp_path, model, sft_file, activations=activations, weights=weights, kv_cache="on",
               policy={"type": "recipe"})
    rep = quantize(cfg)
    out = tmp_path / "fp8"
    assert is_fp8_checkpoint(out)
    assert rep["fp8_heldout"]["kl"] > 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
    g = qc["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"] and g["weights"]["strategy"] == weights and g["weights"]["type"] == "float"
    assert g["input_activations"]["dynamic"] is (activations == "dynamic")
    assert qc["kv_cache_scheme"]["strategy"] == "tensor" and "lm_head" in qc["ignore"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for name in rep["plan"]["fp8_linears"]:
            w, s = f.get_tensor(f"{name}.weight"), f.get_tensor(f"{name}.weight_scale")
            assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
            assert s.shape == ((w.shape[0], 1) if weights == "channel" else (1,))
            assert (f"{name}.input_scale" in keys) is (activations == "static")
        for attn in rep["plan"]["fp8_kv"]:
            assert f.get_tensor(f"{attn}.k_scale").shape == (1,) and f"{attn}.v_scale" in keys
        for name in rep["plan"]["ignore"]:
            if f"{name}.weight" in keys:
                assert f.get_tensor(f"{name}.weight").dtype == torch.bfloat16
        # MoE experts per expert (vLLM's layout), FP8 with their scales, never as fused tensors
        for mod in {p.rpartition(".")[0] for p in rep["plan"]["fp8_experts"]}:
            assert f"{mod}.up_proj" not in keys and f"{mod}.down_proj" not in keys
            for e in range(4):
                for proj, shape in (("up_proj", (32, 64)), ("down_proj", (64, 32))):
                    key = f"{mod}.{e}.{proj}"
                    w, s = f.get_tensor(f"{key}.weight"), f.get_tensor(f"{key}.weight_scale")
                    assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == shape
                    assert tuple(s.shape) == ((shape[0], 1) if weights == "channel" else (1,))
                    assert (f"{key}.input_scale" in keys) is (activations == "static")
    # the reloaded checkpoint computes exactly what the in-process simulation computed
    st = prepare(cfg)
    apply_plan(st["model"], st["plan"], cfg.weights, cfg.activations, st["input_scales"], st["kv_scales"])
    loaded = load_fp8(out)
    ids = st["held_out"][0]
    with torch.no_grad():
        a = st["model"](**ids, use_cache=False).logits
        b = loaded(**ids, use_cache=False).logits
    assert torch.equal(a, b)
    # and it differs from the BF16 model (the quantization did something)
    ref = calibrate.score(st["model"], st["held_out"])
    assert ref["loss"] == pytest.approx(rep["fp8_heldout"]["loss"], rel=1e-5)


def test_search_ranks_units_and_feeds_the_searched_policy(tmp_path, sft_file, one_thread):
    from posttrain.quant.run import quantize

    cfg = _cfg(tmp_path, "tiny-nemotronh", sft_file, policy={"type": "all"})
    rep = quantize(cfg, search=True)
    rank_file = tmp_path / "fp8-search" / "sensitivity.json"
    rows = json.loads(rank_file.read_text())["ranking"]
    assert len(rows) == 4 and [r["rank"] for r in rows] == [1, 2, 3, 4]
    # the search leaves the model as it found it: scoring a unit twice gives the same KL
    from posttrain.quant.run import prepare
    from posttrain.quant.search import sensitivity
    from posttrain.quant.simulate import FP8Experts, FP8Linear

    st = prepare(cfg)
    twice = sensitivity(st["model"], st["units"] * 2, st["held_out"], cfg.weights, cfg.activations,
                        st["input_scales"], progress=False)
    kl = {}
    for r in twice:
        kl.setdefault(r["unit"], []).append(r["kl"])
    assert all(a == b for a, b in kl.values())
    assert not any(isinstance(m, (FP8Linear, FP8Experts)) for m in st["model"].modules())
    assert all(rows[i]["kl"] >= rows[i + 1]["kl"] > 0 for i in range(3))
    assert (tmp_path / "fp8-search" / "sensitivity.png").stat().st_size > 0
    assert "| rank |" in (tmp_path / "fp8-search" / "sensitivity.md").read_text()
    cfg2 = _cfg(tmp_path, "tiny-nemotronh", sft_file, out=str(tmp_path / "searched"),
                policy={"type": "searched", "ranking": str(rank_file), "budget": 2})
    rep2 = quantize(cfg2)
    assert rep2["plan"]["bf16_units"] == sorted([r["unit"] for r in rows[:2]], key=lambda u: int(u.split(".")[2]))
    # keeping the two most sensitive units in BF16 cannot be worse (on KL) than all-FP8... on these data
    assert rep2["fp8_heldout"]["kl"] < rep["fp8_heldout"]["kl"]


def test_generic_calibration_texts_are_deterministic():
    from posttrain.quant.calibrate import generic_texts

    a, b = generic_texts(50, seed=1), generic_texts(50, seed=1)
    assert a == b and len(a) == 50 and all(len(t) >= 200 for t in a)
    assert len(generic_texts(5000)) >= 1024 + 16  # the recipe's ~1K calibration texts + held-out ones


def test_sft_source_without_data_is_one_clear_error(tmp_path):
    from posttrain.errors import UserError
    from posttrain.quant.calibrate import calibration_texts

    with pytest.raises(UserError, match="calibration.data"):
        calibration_texts("sft", 4, [], "tiny-llama")


def test_export_loads_in_transformers_with_compressed_tensors(tmp_path, sft_file, one_thread):
    """Where compressed-tensors is installed (`pip install -e '.[quant]'`): its config schema accepts
    the export, and transformers' loader computes the same logits as posttrain's simulation."""
    ct = require("compressed_tensors", "quant")
    from transformers import AutoModelForCausalLM

    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.run import quantize

    cfg = _cfg(tmp_path, "tiny-llama", sft_file, activations="static", policy={"type": "all"})
    quantize(cfg, evaluate_loss=False)
    out = tmp_path / "fp8"
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    ct.QuantizationConfig.model_validate(qc)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ours = load_fp8(out)
    ids = torch.tensor([[5, 17, 33, 101, 7, 9, 250, 3]])
    with torch.no_grad():
        assert torch.equal(theirs(ids, use_cache=False).logits, ours(ids, use_cache=False).logits)


def test_per_expert_fp8_export_in_transformers(tmp_path, sft_file, one_thread):
    """transformers (compressed-tensors 0.20.1) reads the per-expert FP8 experts of the tiny
    NemotronH: it dequantizes each expert with its scales and fuses them, bit-identical to ours,
    but runs the experts' matmuls on unrounded inputs (it has no FP8 MoE path; static input
    scales are reported as unexpected keys). With our expert input rounding off, the logits match."""
    require("compressed_tensors", "quant")
    from transformers import AutoModelForCausalLM

    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.run import quantize
    from posttrain.quant.simulate import FP8Experts

    cfg = _cfg(tmp_path, "tiny-nemotronh", sft_file, activations="dynamic", kv_cache="off", policy={"type": "all"})
    quantize(cfg, evaluate_loss=False)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "fp8", dtype=torch.float32)
    ours = load_fp8(tmp_path / "fp8")
    for i in (1, 3):
        a, b = theirs.model.layers[i].mixer.experts, ours.model.layers[i].mixer.experts
        assert isinstance(b, FP8Experts)
        assert torch.equal(a.up_proj, b.up_proj) and torch.equal(a.down_proj, b.down_proj)
        b.activations = "none"
    ids = torch.tensor([[5, 17, 33, 101, 7, 9, 250, 3]])
    with torch.no_grad():
        assert torch.equal(theirs(ids, use_cache=False).logits, ours(ids, use_cache=False).logits)


def test_kl_of_the_reference_against_itself_is_zero(one_thread):
    from posttrain.models.loading import load_model
    from posttrain.quant import calibrate

    loaded = load_model("tiny-nemotronh", device="cpu")
    data = calibrate.batches(loaded.tokenizer, calibrate.generic_texts(8), 32, 4)
    ref = calibrate.reference_logprobs(loaded.model, data)
    assert calibrate.score(loaded.model, data, ref)["kl"] == pytest.approx(0.0, abs=1e-9)


def test_calibrated_scales_are_reused_across_policies(tmp_path, sft_file, one_thread):
    from posttrain.errors import UserError
    from posttrain.quant.run import prepare

    scales = str(tmp_path / "scales.safetensors")
    first = prepare(_cfg(tmp_path, "tiny-nemotronh", sft_file, activations="dynamic", policy={"type": "recipe"},
                         calibration={"scales": scales}))
    assert not first["scales_reused"]
    fresh = prepare(_cfg(tmp_path, "tiny-nemotronh", sft_file, activations="static", kv_cache="on",
                         policy={"type": "all"}))
    again = prepare(_cfg(tmp_path, "tiny-nemotronh", sft_file, activations="static", kv_cache="on",
                         policy={"type": "all"}, calibration={"scales": scales}))
    assert again["scales_reused"]
    assert set(again["input_scales"]) == set(fresh["input_scales"])
    assert "model.layers.1.mixer.experts.down_proj" in again["input_scales"]
    for k, v in fresh["input_scales"].items():
        assert torch.equal(again["input_scales"][k], v), k
    for k, (ks, vs) in fresh["kv_scales"].items():
        assert torch.equal(again["kv_scales"][k][0], ks) and torch.equal(again["kv_scales"][k][1], vs)
    with pytest.raises(UserError, match="other settings"):
        prepare(_cfg(tmp_path, "tiny-nemotronh", sft_file, activations="static", policy={"type": "all"},
                     calibration={"scales": scales, "samples": 8}))


def test_searched_at_equal_memory_keeps_what_fits(one_thread):
    from posttrain.models.loading import load_model
    from posttrain.quant.policy import (
        find_units,
        make_plan,
        recipe_bf16_units,
        unit_params,
    )

    model = load_model("tiny-nemotronh", device="cpu").model
    units = find_units(model)
    by = {u.name: u for u in units}
    sizes = {u.name: unit_params(model, u) for u in units}
    recipe = sum(sizes[n] for n in recipe_bf16_units(units))
    # a ranking whose first unit is too big for the recipe's budget: it is skipped, later ones fit
    ranking = sorted(sizes, key=lambda n: -sizes[n])
    plan = make_plan(model, "searched", ranking=ranking, units=units, budget_params="recipe")
    kept = plan.bf16_units
    assert sum(sizes[n] for n in kept) <= recipe
    want, used = [], 0
    for n in ranking:
        if used + sizes[n] <= recipe:
            want.append(n)
            used += sizes[n]
    assert sorted(kept) == sorted(want) and by[kept[0]] is not None
    assert make_plan(model, "searched", ranking=ranking, units=units, budget_params=0).bf16_units == []


def test_moe_layer_kept_bf16_is_written_per_expert_and_reloads(tmp_path, sft_file, one_thread):
    from safetensors import safe_open

    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.run import prepare, quantize
    from posttrain.quant.simulate import FP8Experts, apply_plan

    cfg = _cfg(tmp_path, "tiny-nemotronh", sft_file, activations="static", kv_cache="off",
               policy={"type": "patterns", "keep_bf16": [r"layers\.1\.mixer$"]})
    quantize(cfg, evaluate_loss=False)
    out = tmp_path / "fp8"
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.mixer.experts.0.up_proj" in qc["ignore"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.1.mixer.experts.3.down_proj.weight").dtype == torch.bfloat16
        assert f.get_tensor("model.layers.3.mixer.experts.3.down_proj.weight").dtype == torch.float8_e4m3fn
    loaded = load_fp8(out)
    assert not isinstance(loaded.model.layers[1].mixer.experts, FP8Experts)
    assert isinstance(loaded.model.layers[3].mixer.experts, FP8Experts)
    st = prepare(cfg)
    apply_plan(st["model"], st["plan"], cfg.weights, cfg.activations, st["input_scales"], st["kv_scales"])
    ids = st["held_out"][0]
    with torch.no_grad():
        assert torch.equal(st["model"](**ids, use_cache=False).logits, loaded(**ids, use_cache=False).logits)

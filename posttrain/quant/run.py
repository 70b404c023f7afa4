"""The quantization pipeline behind ``posttrain quantize`` (one function, ``quantize``).

1. load the model and round every weight to BF16 (the reference every comparison is made to);
2. find the units and make the plan (``policy.make_plan``);
3. calibration texts → batches; static input scales and KV scales from their max |x|;
4. optionally the sensitivity search on held-out calibration texts (``search.sensitivity``);
5. apply the plan in place (simulated FP8), export the compressed-tensors checkpoint, and write a
   report (``quant_report.json``: plan, timings, checkpoint sizes against BF16).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from posttrain.configs.quant import QuantConfig


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def bf16_bytes(model: Any) -> int:
    """Size of the same model's weights stored all in BF16 (tied tensors once)."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * (2 if t.is_floating_point() else t.element_size())
    return total


def prepare(cfg: QuantConfig) -> dict[str, Any]:
    """Steps 1–3: the BF16 model, its units, the plan, calibration (and search) batches, scales."""
    import torch

    from posttrain.models.loading import load_model
    from posttrain.quant import calibrate, policy
    from posttrain.quant.simulate import expert_modules, round_weights

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    loaded = load_model(cfg.model, device="cpu", dtype=torch.float32)
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    round_weights(model, torch.bfloat16)
    units = policy.find_units(model)
    ranking = policy.read_ranking(cfg.policy.ranking) if cfg.policy.type == "searched" else None
    plan = policy.make_plan(model, cfg.policy.type, cfg.policy.keep_bf16, ranking, cfg.policy.budget,
                            cfg.kv_cache, units, cfg.policy.budget_params)
    c = cfg.calibration
    texts = calibrate.calibration_texts(c.source, c.samples + cfg.search.samples, c.data, cfg.model, c.seed)
    calib_texts, search_texts = texts[:c.samples], texts[c.samples:]
    if not search_texts:  # too few texts for a separate held-out set
        search_texts = texts[: cfg.search.samples]
        print(f"warning: only {len(texts)} calibration texts: the held-out scoring reuses {len(search_texts)} of them")
    calib = calibrate.batches(tok, calib_texts, c.max_seq_len, c.batch_size)
    held_out = calibrate.batches(tok, search_texts, c.max_seq_len, c.batch_size)
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    input_scales, kv_scales = {}, {}
    static = cfg.activations == "static"
    kv_units = [u.name for u in units if u.kind == "attention"]
    experts = expert_modules([p for u in units for p in u.experts])
    in_keys = [n for u in units for n in u.linears] + [f"{e}.{p}" for e in experts for p in ("up_proj", "down_proj")]
    need_in, need_kv = (in_keys if static else []), (kv_units if plan.kv else [])
    fingerprint = json.dumps({"model": cfg.model, **c.model_dump(mode="json", exclude={"scales"})}, sort_keys=True)
    reused = bool(c.scales and Path(c.scales).exists())
    if reused:
        input_scales, kv_scales = calibrate.load_scales(c.scales, fingerprint, need_in, need_kv)
        print(f"calibration: scales from {c.scales}")
    elif need_in or need_kv or c.scales:
        every = c.scales is not None  # a reusable file holds every scale any policy may need
        input_scales, kv_scales = calibrate.collect_amax(
            model, calib, [n for u in units for n in u.linears] if (static or every) else [],
            kv_units if (need_kv or every) else [], experts if (static or every) else [])
        if c.scales:
            calibrate.save_scales(c.scales, fingerprint, input_scales, kv_scales)
    return {"model": model, "tokenizer": tok, "units": units, "plan": plan, "calib": calib, "held_out": held_out,
            "input_scales": input_scales, "kv_scales": kv_scales, "seconds_load": t_load,
            "seconds_calibrate": time.perf_counter() - t1, "scales_reused": reused, "calib_texts": len(calib_texts),
            "calib_tokens": int(sum(int(b["attention_mask"].sum()) for b in calib))}


def quantize(cfg: QuantConfig, search: bool = False, evaluate_loss: bool = True) -> dict[str, Any]:
    """Run the whole pipeline; returns the report (also written to ``<out>/quant_report.json``)."""
    from posttrain.quant import calibrate, checkpoint
    from posttrain.quant import search as search_mod
    from posttrain.quant.simulate import apply_plan

    out = Path(cfg.out)
    st = prepare(cfg)
    model, plan = st["model"], st["plan"]
    report: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "plan": plan.to_dict(),
                              "units": [{"unit": u.name, "kind": u.kind, "layer": u.layer} for u in st["units"]],
                              "calibration_texts": st["calib_texts"], "calibration_tokens": st["calib_tokens"],
                              "seconds_load": st["seconds_load"], "seconds_calibrate": st["seconds_calibrate"],
                              "calibration_scales_reused": st["scales_reused"]}
    print(f"{len(st['units'])} units; FP8: {len(plan.linears)} linears, {len(plan.experts)} expert tensors, "
          f"KV in {len(plan.kv)} attention layers; BF16 units: {', '.join(plan.bf16_units) or 'none'}")
    ref = None
    if evaluate_loss or search:
        ref = calibrate.reference_logprobs(model, st["held_out"])
        report["bf16_heldout"] = calibrate.score(model, st["held_out"])
    if search:
        t = time.perf_counter()
        print(f"sensitivity search over {len(st['units'])} units ({len(st['held_out'])} held-out batches):")
        rows = search_mod.sensitivity(model, st["units"], st["held_out"], cfg.weights, cfg.activations,
                                      st["input_scales"])
        report["seconds_search"] = time.perf_counter() - t
        files = search_mod.write(rows, out.parent / f"{out.name}-search",
                                 {"model": cfg.model, "weights": cfg.weights, "activations": cfg.activations,
                                  "calibration": cfg.calibration.source})
        report["search_files"] = [str(f) for f in files]
        print(f"ranking: {files[0]}; table {files[1]}; plot {files[2]}")
    apply_plan(model, plan, cfg.weights, cfg.activations, st["input_scales"], st["kv_scales"])
    if ref is not None:
        s = calibrate.score(model, st["held_out"], ref)
        report["fp8_heldout"] = s
        print(f"held-out loss: BF16 {report['bf16_heldout']['loss']:.4f} → FP8 {s['loss']:.4f}; "
              f"KL(BF16‖FP8) {s['kl']:.3e} per token")
    t = time.perf_counter()
    checkpoint.export(model, st["tokenizer"], plan, out, cfg.weights, cfg.activations, st["kv_scales"],
                      cfg.rest_dtype, extra={"source_model": cfg.model})
    report["seconds_export"] = time.perf_counter() - t
    report["checkpoint_bytes"] = dir_bytes(out)
    report["bf16_bytes"] = bf16_bytes(model)
    (out / "quant_report.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out} ({report['checkpoint_bytes'] / 2**20:.1f} MiB; the same weights in BF16: "
          f"{report['bf16_bytes'] / 2**20:.1f} MiB)")
    return report

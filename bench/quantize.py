"""FP8 quantization cost: time to calibrate and export the embedded model, and checkpoint memory
against BF16, printed side by side.

For each setting (weights per channel; activations dynamic per token or static; all linears FP8 vs
the recipe's rule with the FP8 KV cache), it runs ``posttrain.quant.run.quantize`` on the embedded
model (SmolLM2-135M) with generic calibration text (so it needs no SFT run), and reports: model
load + BF16 rounding, calibration (static scales: a forward pass over the calibration texts),
export (FP8 cast + safetensors write), the checkpoint's size on disk and the same model's size
with every weight in BF16. The exported checkpoint is deleted afterwards (weights are never kept).

Run: ``python bench/quantize.py [--samples 1024] [--seq 128] [--threads 1] [--scales FILE]``. Ends
with one RESULT line and appends a JSON row (with the load average before and after) to
bench/results/quantize.jsonl. The calibration pass runs once, in the ``all/static`` setting; the
``recipe/static+kv`` setting reuses its scales (``calibration.scales``: the same pass would give the
same numbers), so its calibrate column is the time to read them. ``--scales FILE`` keeps that file
for a later ``posttrain quantize ... calibration.source=generic calibration.scales=FILE``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "quantize.jsonl"

SETTINGS = {
    "all/dynamic": {"activations": "dynamic", "policy": {"type": "all"}, "kv_cache": "off"},
    "all/static": {"activations": "static", "policy": {"type": "all"}, "kv_cache": "off"},
    "recipe/static+kv": {"activations": "static", "policy": {"type": "recipe"}, "kv_cache": "on"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--samples", type=int, default=1024, help="calibration texts (the recipe's ~1K, the default)")
    ap.add_argument("--seq", type=int, default=128, help="max tokens per calibration text")
    ap.add_argument("--scales", default=None, help="keep the calibrated scales in this file (default: a temp file)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from posttrain.configs.quant import QuantConfig
    from posttrain.quant.run import quantize

    torch.set_num_threads(args.threads)
    import os

    rows = {}
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-quant-"))
    scales = args.scales or str(tmp / "scales.safetensors")
    if args.scales and Path(args.scales).exists():
        sys.exit(f"--scales {args.scales} exists: the bench must calibrate, give a new path")
    try:
        for name, s in SETTINGS.items():
            calib = {"source": "generic", "samples": args.samples, "max_seq_len": args.seq}
            if name != "all/dynamic":
                calib["scales"] = scales
            cfg = QuantConfig.model_validate({
                "model": args.model, "out": str(tmp / name.replace("/", "_")), "threads": args.threads, **s,
                "calibration": calib, "search": {"samples": 1}})
            t0 = time.perf_counter()
            rep = quantize(cfg, evaluate_loss=False)
            rows[name] = {"seconds_total": time.perf_counter() - t0, "seconds_load": rep["seconds_load"],
                          "seconds_calibrate": rep["seconds_calibrate"], "seconds_export": rep["seconds_export"],
                          "checkpoint_bytes": rep["checkpoint_bytes"], "bf16_bytes": rep["bf16_bytes"],
                          "calibration_tokens": rep["calibration_tokens"],
                          "scales_reused": rep["calibration_scales_reused"],
                          "fp8_linears": len(rep["plan"]["fp8_linears"])}
            shutil.rmtree(tmp / name.replace("/", "_"), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mib = 2 ** 20
    load_after = os.getloadavg()
    print(f"\nmodel {args.model}; {args.samples} generic calibration texts × ≤{args.seq} tokens; "
          f"{args.threads} thread(s); load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"(2 cores, shared)")
    print(f"{'setting':18s} {'FP8 lin':>7s} {'load s':>7s} {'calib s':>8s} {'export s':>9s} "
          f"{'FP8 ckpt MiB':>13s} {'BF16 MiB':>9s} {'ratio':>6s}")
    for name, r in rows.items():
        print(f"{name:18s} {r['fp8_linears']:7d} {r['seconds_load']:7.1f} {r['seconds_calibrate']:8.1f} "
              f"{r['seconds_export']:9.1f} {r['checkpoint_bytes'] / mib:13.1f} {r['bf16_bytes'] / mib:9.1f} "
              f"{r['checkpoint_bytes'] / r['bf16_bytes']:6.3f}" + ("  (scales reused)" if r["scales_reused"] else ""))
    append_row(RESULTS, {"bench": "quantize", "model": args.model, "samples": args.samples, "seq": args.seq,
                         "threads": args.threads, "loadavg_before": load_before, "loadavg_after": load_after,
                         "results": rows,  # times and sizes of generic-text calibration: nothing graded
                         **provenance("none", machine(load_before[0], load_after[0], threads=args.threads))})
    st = rows["all/static"]
    print(f"RESULT quantize_embedded: {st['seconds_calibrate'] + st['seconds_export']:.1f} s "
          f"(calibrate {args.samples} texts + export, all linears FP8 static; checkpoint "
          f"{st['checkpoint_bytes'] / mib:.1f} MiB vs {st['bf16_bytes'] / mib:.1f} MiB BF16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The precision probe and the numerics behind ``precision: auto``'s per-stage rule.

    python bench/precision.py

Prints this machine's probe (``models/precision.py``: fp32 and bf16 GFLOP/s, re-measured), the
decision per stage, and the per-token log-prob error of bf16 against fp32 on the embedded model
(one packed 512-token row of the arithmetic SFT set, target tokens only): bf16 autocast (what SFT
would train in) and bf16 weights (what a bf16 sampler decodes with), as mean / p99 / max |dlogp| and
the mean and max |ratio − 1| an on-policy PG ratio would show. Appends one row to
bench/results/precision.jsonl and ends with
``RESULT precision: <x> nat/token (mean |dlogp| of bf16 autocast vs fp32; ...)``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
from pathlib import Path

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "precision.jsonl"
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    import torch

    from posttrain.data.packing import pack_examples
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.models.loading import load_model
    from posttrain.models.precision import BF16_SAFE, decide, machine_probe
    from posttrain.data.examples import tokenize_rows
    from posttrain.train.supervised import row_logprobs

    load_before = os.getloadavg()[0]
    probe = machine_probe(refresh=True)
    decisions = {s: decide(probe, s).precision for s in BF16_SAFE}  # type: ignore[arg-type]
    torch.set_num_threads(1)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    model.config.use_cache = False
    examples, _ = tokenize_rows(tok, list(arithmetic_rows(16, seed=0, max_digits=3)))
    batch = pack_examples(examples, 512, tok.pad_token_id or 0)[0].to_tensors()
    with torch.no_grad():
        ref = row_logprobs(model, batch)[0].float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = row_logprobs(model, batch)[0].float()
        weights = row_logprobs(copy.deepcopy(model).to(torch.bfloat16), batch)[0].float()
    errors = {}
    for name, lp in (("bf16_autocast", autocast), ("bf16_weights", weights)):
        d = (lp - ref).abs()
        r = ((lp - ref).exp() - 1).abs()
        errors[name] = {"mean": float(d.mean()), "p99": float(d.quantile(0.99)), "max": float(d.max()),
                        "ratio_mean": float(r.mean()), "ratio_max": float(r.max()), "tokens": d.numel()}
    load_after = os.getloadavg()[0]
    print(f"probe ({probe.machine}): fp32 {probe.fp32_gflops:.1f}, bf16 {probe.bf16_gflops:.1f} GFLOP/s "
          f"({probe.bf16_speedup:.2f}x); decisions: {decisions}; load {load_before:.1f} -> {load_after:.1f}")
    for name, e in errors.items():
        print(f"{name:14s} |dlogp| mean {e['mean']:.4f} p99 {e['p99']:.4f} max {e['max']:.4f}; |ratio-1| mean "
              f"{e['ratio_mean']:.4f} max {e['ratio_max']:.4f} ({e['tokens']} tokens)")
    row = {"bench": "precision",
           "model": args.model, "probe": {"fp32_gflops": probe.fp32_gflops, "bf16_gflops": probe.bf16_gflops,
                                          "machine": probe.machine}, "decisions": decisions, "errors": errors,
           **provenance("train", machine(load_before, load_after))}  # the errors: on 16 SFT (train) rows
    if not args.no_save:
        append_row(RESULTS, row)
    a = errors["bf16_autocast"]
    print(f"RESULT precision: {a['mean']:.4f} nat/token (mean |dlogp| of bf16 autocast vs fp32, p99 {a['p99']:.3f}; "
          f"probe bf16/fp32 {probe.bf16_speedup:.2f}x -> sft {decisions['sft']}, rl {decisions['rl']})")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()

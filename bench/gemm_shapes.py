"""Why the same command takes 4 min on one CPU and 15 on another: the embedded model's own matmuls.

    python bench/gemm_shapes.py [--threads 1 2] [--rows 32 96 512] [--mkl-amd-compare]

``torch.nn.functional.linear`` in fp32 and bf16 on SmolLM2-135M's shapes (hidden 576, MLP 1536,
vocabulary 49,152): an MLP projection and the output layer, at the row counts of a decode step (32
or 96 problems at once) and of an SFT step (~512 packed tokens). The precision probe
(``models/precision.py``) measures square 512 x 512 matmuls; these are the shapes the stages run, and
on an AVX2-only EPYC the output layer at 32 rows ran at 34.5 GFLOP/s on 2 threads where the probe
gave 54 on one. The dtypes and
shapes alternate rep by rep, so load from other processes hits them alike; each figure is the mean of
``--reps`` rounds (each the average of ``--inner`` back-to-back calls) ± its standard error. Appends one row to bench/results/gemm_shapes.jsonl and ends
with ``RESULT gemm_shapes: <GFLOP/s> GFLOP/s (fp32 output layer, 32 rows, <threads> threads; ...)``.

It imports posttrain first, so it measures what posttrain runs: on an AMD CPU, MKL with its vendor
check lifted (models/blas.py). ``--mkl-amd-compare`` measures fp32 with and without that shim: each
round runs one child process per setting (the shim is fixed for a process's life), in alternating
order, and the row holds both; its RESULT line is the shim's speedup on the output layer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import posttrain  # noqa: F401  (first: on AMD CPUs it loads models/blas.py's shim before torch)
from posttrain.models import blas
from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/)

RESULTS = Path(__file__).resolve().parent / "results" / "gemm_shapes.jsonl"
HIDDEN, MLP, VOCAB = 576, 1536, 49152


def time_linear(x: object, w: object, calls: int) -> float:
    """Mean seconds of ``calls`` back-to-back ``linear(x, w)`` (weights stored [out, HIDDEN], as HF's):
    the steady state a decode loop sees, not one call's thread wake-up."""
    import torch

    torch.nn.functional.linear(x, w)  # warm-up: oneDNN/MKL pick their kernels on the first call
    t = time.perf_counter()
    for _ in range(calls):
        torch.nn.functional.linear(x, w)
    return (time.perf_counter() - t) / calls


def compare_mkl_amd(args: argparse.Namespace) -> None:
    """fp32 with and without the MKL shim, one child process per setting and round, alternating."""
    load_before = os.getloadavg()[0]
    child = [sys.executable, __file__, "--child", "--reps", "1", "--inner", str(args.inner), "--dtypes", "fp32",
             "--threads", *map(str, args.threads), "--rows", *map(str, args.rows)]
    times: dict[tuple, list[float]] = {}
    states: dict[str, str] = {}
    for rep in range(args.reps):
        for setting in (("1", "0") if rep % 2 == 0 else ("0", "1")):
            out = subprocess.run(child, env={**os.environ, blas.ENV: setting}, capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            states[setting] = res["blas"]
            for f in res["figures"]:
                times.setdefault((setting, f["threads"], f["rows"], f["layer"]), []).append(f["gflops"])
    if states.get("1") != "on":
        sys.exit(f"the shim did not load in the child ({states.get('1')}): nothing to compare")
    figures = []
    for (setting, t, r, layer), g in sorted(times.items()):
        m, se = mean_se(g)
        figures.append({"mkl_amd": setting == "1", "threads": t, "rows": r, "layer": layer, "dtype": "fp32",
                        "gflops": round(m, 1), "gflops_se": round(se, 1)})
    by = {(f["mkl_amd"], f["threads"], f["rows"], f["layer"]): f for f in figures}
    for (on, t, r, layer), f in by.items():
        if on:
            off = by[False, t, r, layer]
            print(f"{t} thread(s) {r:4d} rows {layer:6s} fp32: MKL default {off['gflops']:6.1f} ± {off['gflops_se']:4.1f}"
                  f"  shim {f['gflops']:6.1f} ± {f['gflops_se']:4.1f} GFLOP/s  ({f['gflops'] / off['gflops']:.2f}x)")
    import torch

    row = {"bench": "gemm_shapes", "mode": "mkl_amd_compare", "torch": torch.__version__, "figures": figures,
           **provenance("none", machine(load_before, os.getloadavg()[0]))}  # random operands: nothing graded
    if not args.no_save:
        append_row(RESULTS, row)
    t, r = max(args.threads), (32 if 32 in args.rows else args.rows[0])
    on, off = by[True, t, r, "output"], by[False, t, r, "output"]
    print(f"RESULT gemm_shapes_mkl_amd: {on['gflops'] / off['gflops']:.2f} x (fp32 output layer, {r} rows, {t} threads: "
          f"{off['gflops']} ± {off['gflops_se']} -> {on['gflops']} ± {on['gflops_se']} GFLOP/s with the MKL shim, "
          f"{args.reps} rounds; {row['machine']['cpu']['model']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 96, 512])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (the ± is over these)")
    ap.add_argument("--inner", type=int, default=4, help="back-to-back calls per cell and round, averaged")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--mkl-amd-compare", action="store_true",
                    help="fp32 with and without the MKL shim of models/blas.py (AMD CPUs), side by side")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one round, JSON to stdout
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    if args.mkl_amd_compare:
        return compare_mkl_amd(args)
    import torch

    load_before = os.getloadavg()[0]
    cells = [(t, r, name, out, dt) for t in args.threads for r in args.rows
             for name, out in (("mlp", MLP), ("output", VOCAB)) for dt in args.dtypes]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    # operands made once per shape and dtype (the output layer's weight is 113 MB in fp32), shared by
    # the thread counts
    operands = {(r, out, dt): (torch.randn(r, HIDDEN, dtype=dtypes[dt]), torch.randn(out, HIDDEN, dtype=dtypes[dt]))
                for _, r, _, out, dt in cells}
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    for _ in range(args.reps):  # interleaved: every cell sees the same load
        for c in cells:
            torch.set_num_threads(c[0])
            times[c].append(time_linear(*operands[c[1], c[3], c[4]], args.inner))
    figures = []
    for (t, r, name, out, dt), ts in times.items():
        gflops = [2 * r * HIDDEN * out / s / 1e9 for s in ts]
        m, se = mean_se(gflops)
        figures.append({"threads": t, "rows": r, "layer": name, "dtype": dt, "gflops": round(m, 1),
                        "gflops_se": round(se, 1), "ms": round(1e3 * sum(ts) / len(ts), 2)})
        if args.child:
            continue
        print(f"{t} thread(s)  {r:4d} rows  {name:6s} {dt}: {m:7.1f} ± {se:5.1f} GFLOP/s  ({figures[-1]['ms']:.1f} ms)")
    if args.child:
        print(json.dumps({"blas": blas.STATE, "figures": figures}))
        return
    row = {"bench": "gemm_shapes", "torch": torch.__version__, "figures": figures,
           **provenance("none", machine(load_before, os.getloadavg()[0]))}  # random operands: nothing graded
    if not args.no_save:
        append_row(RESULTS, row)
    outputs = [f for f in figures if f["layer"] == "output" and f["dtype"] == "fp32" and f["threads"] == max(args.threads)]
    key = next((f for f in outputs if f["rows"] == 32), outputs[0])
    mlp = next((f for f in figures if f["layer"] == "mlp" and f["dtype"] == "fp32" and f["rows"] == key["rows"]
                and f["threads"] == key["threads"]), key)
    cpu = row["machine"]["cpu"]
    print(f"RESULT gemm_shapes: {key['gflops']} GFLOP/s (fp32 output layer, {key['rows']} rows, {key['threads']} "
          f"threads, ± {key['gflops_se']}; MLP projection {mlp['gflops']}; {cpu['model']} "
          f"{'/'.join(cpu['vector']) or 'no AVX2'})")


if __name__ == "__main__":
    main()

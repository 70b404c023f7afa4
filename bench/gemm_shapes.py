"""Why the same command takes 4 min on one CPU and 15 on another: the embedded model's own matmuls.

    python bench/gemm_shapes.py [--threads 1 2] [--rows 32 96 512]

``torch.nn.functional.linear`` in fp32 and bf16 on SmolLM2-135M's shapes (hidden 576, MLP 1536,
vocabulary 49,152): an MLP projection and the output layer, at the row counts of a decode step (32
or 96 problems at once) and of an SFT step (~512 packed tokens). The precision probe
(``models/precision.py``) measures square 512 x 512 matmuls; these are the shapes the stages run, and
on an AVX2-only EPYC the output layer at 32 rows ran at 34.5 GFLOP/s on 2 threads where the probe
gave 54 on one. The dtypes and
shapes alternate rep by rep, so load from other processes hits them alike; each figure is the mean of
``--reps`` rounds (each the average of ``--inner`` back-to-back calls) ± its standard error. Appends one row to bench/results/gemm_shapes.jsonl and ends
with ``RESULT gemm_shapes: <GFLOP/s> GFLOP/s (fp32 output layer, 32 rows, <threads> threads; ...)``.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from results_row import append_row, commit, machine, mean_se  # bench/results_row.py (sys.path[0] is bench/)

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 96, 512])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (the ± is over these)")
    ap.add_argument("--inner", type=int, default=4, help="back-to-back calls per cell and round, averaged")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    import torch

    load_before = os.getloadavg()[0]
    cells = [(t, r, name, out, dt) for t in args.threads for r in args.rows
             for name, out in (("mlp", MLP), ("output", VOCAB)) for dt in ("fp32", "bf16")]
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
        print(f"{t} thread(s)  {r:4d} rows  {name:6s} {dt}: {m:7.1f} ± {se:5.1f} GFLOP/s  ({figures[-1]['ms']:.1f} ms)")
    row = {"bench": "gemm_shapes", "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": commit(), "torch": torch.__version__, **machine(load_before, os.getloadavg()[0]),
           "figures": figures}
    if not args.no_save:
        append_row(RESULTS, row)
    outputs = [f for f in figures if f["layer"] == "output" and f["dtype"] == "fp32" and f["threads"] == max(args.threads)]
    key = next((f for f in outputs if f["rows"] == 32), outputs[0])
    mlp = next((f for f in figures if f["layer"] == "mlp" and f["dtype"] == "fp32" and f["rows"] == key["rows"]
                and f["threads"] == key["threads"]), key)
    cpu = row["cpu"]
    print(f"RESULT gemm_shapes: {key['gflops']} GFLOP/s (fp32 output layer, {key['rows']} rows, {key['threads']} "
          f"threads, ± {key['gflops_se']}; MLP projection {mlp['gflops']}; {cpu['model']} "
          f"{'/'.join(cpu['vector']) or 'no AVX2'})")


if __name__ == "__main__":
    main()

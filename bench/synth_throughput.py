"""Synthetic-data throughput: rows/s and accepted rows/s of ``posttrain synth`` on a shipped config.

    python bench/synth_throughput.py                                   # embedded model, 16 rows
    python bench/synth_throughput.py --config recipes/synth/instruction_personas.yaml --rows 32

Runs ``data/synth.py:synthesize`` end to end (real generation, real validators, final filters and
dedup) into a temporary file, timing everything after the model has loaded. The vLLM engine is not
measured here (it needs a GPU; this machine has none). Prints ``RESULT synth_throughput: ...`` and
appends one row to bench/results/synth_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/)

RESULTS = Path(__file__).parent / "results" / "synth_throughput.jsonl"
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "recipes/synth/two_step_qa.yaml"))
    p.add_argument("--model", default="embedded")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--batch-rows", type=int, default=8)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()

    from posttrain.configs.base import load_config
    from posttrain.configs.synth import SynthConfig
    from posttrain.data.curate import make_teacher
    from posttrain.data.synth import build_context, synthesize

    cfg = load_config(SynthConfig, args.config, [f"rows={args.rows}", f"generation.model={args.model}",
                                                 f"generation.batch_rows={args.batch_rows}"])
    base = Path(args.config).resolve().parent
    name, gen = make_teacher(cfg.generation.model)
    ctx = build_context(cfg, base)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        s = synthesize(cfg, gen, Path(d) / "out.jsonl", base_dir=base, model_name=name, progress=False, ctx=ctx)
        elapsed = time.time() - t0
    rows_s, acc_s = s["rows_processed"] / elapsed, s["accepted"] / elapsed
    what = (f"{Path(args.config).name}, {args.model}, {args.rows} rows, batch {args.batch_rows}, "
            f"{s['accepted']} accepted, {s['completions']} completions, CPU")
    print(f"RESULT synth_throughput: {rows_s:.3f} rows/s ({what}; accepted {acc_s:.3f} rows/s)")
    if not args.no_record:
        append_row(RESULTS, {
            "config": str(Path(args.config).resolve().relative_to(ROOT)) if ROOT in Path(args.config).resolve().parents else args.config,
            "model": args.model, "engine": "hf", "rows": args.rows, "batch_rows": args.batch_rows,
            "rows_per_s": round(rows_s, 4), "accepted_per_s": round(acc_s, 4), "accepted": s["accepted"],
            "rejected": s["rejected"], "final_dropped": s["final_dropped"], "failures": s["failures"],
            "completions": s["completions"], "elapsed_s": round(elapsed, 2),
            "threads": os.environ.get("OMP_NUM_THREADS"),
            **provenance("none", machine(load_before, os.getloadavg()[0])),
        })
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()

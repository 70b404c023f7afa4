"""One external benchmark (HumanEval, BFCL, IFEval/IFBench agreement, IFBench test) on a model, recorded.

    python bench/external_benchmarks.py humaneval                       # all 164, greedy, 256 new tokens
    python bench/external_benchmarks.py bfcl --n 50                     # 50 each of simple_python, multiple, parallel
    python bench/external_benchmarks.py ifeval --n 64                   # 64 held-out instruction replies (split test)
    python bench/external_benchmarks.py ifbench --n 64 --replies runs/bench/external_ifeval.json   # the same replies, IFBench checkers
    python bench/external_benchmarks.py humaneval --model runs/sft/best --k 5 --temperature 0.8
    python bench/external_benchmarks.py ifbench-test --n 100 --threads 1 --max-new-tokens 512   # IFBench, 100 prompts

Runs ``posttrain eval --benchmark NAME``'s code (``posttrain/eval/benchmarks/``) in-process, writes
every item's record and the summary to ``--out`` (default ``runs/bench/external_<name>.json``),
appends one row to bench/results/external_benchmarks.jsonl (the command, commit, machine and load,
split, settings, summary, wall time) and ends with ``RESULT <name>: <figure> <unit> (<what>)``.
Figures are reported on the test split (our instruction tasks' ``--split``, by default; HumanEval
and BFCL are public test sets of their own) and chosen on nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import posttrain  # noqa: F401  (before torch: the MKL shim of models/blas.py)
from posttrain.envs.splits import SPLITS
from results_row import append_row, machine, provenance, speed_env  # bench/results_row.py

RESULTS = Path(__file__).resolve().parent / "results" / "external_benchmarks.jsonl"


def row_summary(name: str, summary: dict) -> dict:
    """The summary as recorded in the row: everything but the disagreement texts of ifeval, ifbench
    and ifbench-test (counted; the --out file has them)."""
    if "disagreements" in summary:
        return {**{k: v for k, v in summary.items() if k != "disagreements"},
                "disagreements": len(summary["disagreements"])}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benchmark", choices=["humaneval", "bfcl", "ifeval", "ifbench", "ifbench-test"])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--n", type=int, default=None,
                    help="items (per bfcl category; ifbench-test: the first N prompts); default all (ifeval: 64)")
    ap.add_argument("--category", action="append", help="bfcl categories (default all three)")
    ap.add_argument("--split", default="test", choices=SPLITS,
                    help="split of our instruction environment (ifeval/ifbench)")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replies", metavar="FILE",
                    help="ifeval/ifbench: grade the model replies of an earlier run's --out file (same --split, --n, "
                         "--seed) instead of generating")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-save", action="store_true", help="append no row")
    args = ap.parse_args()

    from tqdm.auto import tqdm

    from posttrain.engines.hf import HFGenerator
    from posttrain.eval.benchmarks import BENCHMARKS, run_benchmark
    from posttrain.eval.benchmarks.base import BenchmarkOptions

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    options = BenchmarkOptions(split=args.split, n=args.n, k=args.k, temperature=args.temperature,
                               max_new_tokens=args.max_new_tokens, seed=args.seed,
                               categories=tuple(args.category or ()))
    if args.replies:
        if args.benchmark not in ("ifeval", "ifbench"):
            raise SystemExit("--replies is for ifeval and ifbench")
        from posttrain.eval.benchmarks.ifeval import grade_replies, replies_from

        start = time.perf_counter()
        result = grade_replies(args.benchmark, options, replies_from(args.replies))
        result.seconds = time.perf_counter() - start
        result.settings["replies_from"] = args.replies
    else:
        generator = HFGenerator.from_spec(args.model, batch_size=args.batch_size, num_threads=args.threads)
        with tqdm(desc=args.benchmark, unit="completion") as bar:
            options.progress = bar
            result = run_benchmark(args.benchmark, generator, options)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    line = BENCHMARKS.get(args.benchmark).result_line(result)
    out = Path(args.out or f"runs/bench/external_{args.benchmark}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": shlex.join([sys.executable, *sys.argv]), **result.to_dict()}, indent=1))
    print(f"wrote {out}")
    if not args.no_save:
        # HumanEval and BFCL are public test sets of their own; ifeval/ifbench read our --split
        split = args.split if args.benchmark in ("ifeval", "ifbench") else "test"
        append_row(RESULTS, {
            "bench": "external_benchmarks", "benchmark": args.benchmark,
            "args": vars(args), "settings": result.settings, "summary": row_summary(args.benchmark, result.summary),
            "result": line, "seconds": {"benchmark": result.seconds, "wall": wall}, "speed_env": speed_env(),
            **provenance(split, machine(load_before, load_after, threads=args.threads)),
        })
    print(f"RESULT {args.benchmark}: {line}")


if __name__ == "__main__":
    main()

"""Greedy evaluation of the pipeline's held-out problems at two batch sizes, side by side.

    python bench/eval_batch.py [--n 96] [--batches 32 96] [--rounds 2] [--threads 2]

What ``posttrain pipeline`` spends on each measurement (experiments/stages.py: ``measure``): the
embedded model (fp32, the live module as every greedy measurement is) answers ``--n`` held-out
arithmetic problems, up to 80 new tokens each, through ``HFGenerator`` at each ``eval_batch_size``
in turn, rounds alternating the order. A larger batch runs fewer decode loops over wider matmuls
(docs/benchmarks.md, "The model's own matmuls"); padded shapes can in principle flip a greedy
near-tie, so the bench also says whether every answer came out the same at every batch size.
Appends one row to bench/results/eval_batch.jsonl and ends with
``RESULT eval_batch: <x> x (time at the first batch size / at the last)``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import posttrain  # noqa: F401  (before torch: the MKL shim of models/blas.py)
from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py

RESULTS = Path(__file__).resolve().parent / "results" / "eval_batch.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=96, help="held-out problems (the --quick pipeline's 96)")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 96])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    import torch

    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.models.loading import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model("embedded")
    tasks = arithmetic_tasks(args.n, 2, max_digits=2)  # the seed-0 pipeline's held-out set (its default split)
    prompts = [t.messages for t in tasks]
    times: dict[int, list[float]] = {b: [] for b in args.batches}
    answers: dict[int, list[str]] = {}
    tokens: dict[int, int] = {}
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        for b in (args.batches if r % 2 == 0 else list(reversed(args.batches))):
            gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=b)
            t0 = time.perf_counter()
            out = gen.generate(prompts, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0))
            times[b].append(time.perf_counter() - t0)
            answers[b] = [c[0].text for c in out]
            tokens[b] = sum(len(c[0].token_ids) for c in out)
            print(f"  round {r}, batch {b}: {times[b][-1]:.1f} s, {tokens[b]} tokens", flush=True)
    load_after = os.getloadavg()[0]
    same = all(answers[b] == answers[args.batches[0]] for b in args.batches)
    stats = {b: mean_se(v) for b, v in times.items()}
    for b, (m, se) in stats.items():
        print(f"batch {b:4d}: {m:6.1f} ± {se:.1f} s for {args.n} problems ({tokens[b]} tokens)")
    print(f"every answer identical across batch sizes: {same}; load {load_before:.2f} -> {load_after:.2f}")
    first, last = args.batches[0], args.batches[-1]
    if not args.no_save:
        append_row(RESULTS, {"bench": "eval_batch", "args": vars(args), "seconds": {str(b): times[b] for b in times},
                             "mean_se": {str(b): stats[b] for b in stats}, "tokens": {str(b): tokens[b] for b in tokens},
                             "identical_answers": same,
                             **provenance("none", machine(load_before, load_after))})  # timed, not graded
    print(f"RESULT eval_batch: {stats[first][0] / stats[last][0]:.2f} x (greedy measurement of {args.n} problems, "
          f"batch {first} {stats[first][0]:.1f} ± {stats[first][1]:.1f} s / batch {last} {stats[last][0]:.1f} ± "
          f"{stats[last][1]:.1f} s, {args.threads} threads, {args.rounds} rounds; identical answers: {same})")


if __name__ == "__main__":
    main()

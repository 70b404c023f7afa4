"""Threads on a shared CPU: 1 vs 2 torch threads, OpenMP wait policy, with and without a competing load.

    python bench/threads.py [--tokens 24] [--batch 8] [--repeats 2]

Workload: the embedded model decoding ``--batch`` rows for ``--tokens`` tokens with ``HFGenerator``
(fp32), the small-op, latency-bound kind of work where OpenMP threads wait on each other most.
Each configuration runs in a fresh subprocess (``OMP_WAIT_POLICY`` is read when OpenMP starts):

* threads 1 or 2 (``torch.set_num_threads``);
* ``OMP_WAIT_POLICY``: unset (libgomp's default: spin a while, then sleep) or ``PASSIVE`` (sleep at
  once: a waiting thread gives its core back);
* competing load: none, or one extra process doing fp32 matmuls on one thread for the whole
  measurement (what another engineer's job does to a 2-core machine).

Configurations are interleaved (repeat 1 of every config, then repeat 2, ...) so a change in the
machine's other load hits all of them. Prints decode tokens/s per configuration (mean ± standard
error over repeats), the slowdown each suffers from the competing load, and appends one row to
bench/results/threads.jsonl. Ends with
``RESULT threads: <x> tokens/s ratio (default policy under load / best config under load)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from results_row import append_row, commit, machine  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "threads.jsonl"
ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from posttrain.models.loading import load_model
from posttrain.engines.hf import HFGenerator
from posttrain.engines.base import SamplingParams
loaded = load_model("embedded", device="cpu", dtype=torch.float32)
gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=int(sys.argv[2]))
gen.stop_ids = frozenset()  # every row runs to the limit: the batch stays full
prompts = [[{"role": "user", "content": f"Tell me fact number {i} about the sea."}] for i in range(int(sys.argv[2]))]
gen.generate(prompts[:1], SamplingParams(max_new_tokens=2, seed=0))
t = time.perf_counter()
out = gen.generate(prompts, SamplingParams(max_new_tokens=int(sys.argv[3]), seed=0))
dt = time.perf_counter() - t
print(json.dumps({"tokens_per_s": sum(len(c[0].token_ids) for c in out) / dt, "seconds": dt,
                  "cpu_s": time.process_time()}))
"""

LOAD = "import torch\ntorch.set_num_threads(1)\na=torch.randn(1024,1024)\nwhile True: a@a\n"


def run_one(threads: int, policy: str | None, batch: int, tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", WORKER, str(threads), str(batch), str(tokens)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    configs = [(t, p, load) for load in (False, True) for t in (1, 2) for p in (None, "PASSIVE")]
    rates: dict[tuple, list[float]] = {c: [] for c in configs}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for c in configs:
            threads, policy, load = c
            hog = subprocess.Popen([sys.executable, "-c", LOAD], env={**os.environ, "OMP_NUM_THREADS": "1"}) if load else None
            try:
                if hog:
                    time.sleep(0.5)  # let it start multiplying
                rates[c].append(run_one(threads, policy, args.batch, args.tokens)["tokens_per_s"])
                print(f"  threads {threads}, OMP_WAIT_POLICY {policy or 'default'}, "
                      f"{'competing load' if load else 'no extra load'}: {rates[c][-1]:.1f} tokens/s", flush=True)
            finally:
                if hog:
                    hog.terminate()
                    hog.wait()
    load_after = os.getloadavg()[0]

    def stat(v: list[float]) -> tuple[float, float]:
        return statistics.mean(v), (statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan"))

    print(f"embedded model, fp32 decode, batch {args.batch}, {args.tokens} tokens, {args.repeats} repeats; "
          f"{os.cpu_count()} cores, load average {load_before:.1f} -> {load_after:.1f}")
    print(f"{'threads':>7s} {'OMP_WAIT_POLICY':>15s} {'no extra load':>14s} {'+1 matmul proc':>14s} {'ratio':>6s}  (tokens/s)")
    table = []
    for t in (1, 2):
        for p in (None, "PASSIVE"):
            (a, sa), (b, sb) = stat(rates[(t, p, False)]), stat(rates[(t, p, True)])
            table.append({"threads": t, "omp_wait_policy": p or "default", "no_extra_load": [a, sa], "loaded": [b, sb]})
            print(f"{t:7d} {p or 'default':>15s} {a:7.1f} ± {sa:4.1f} {b:7.1f} ± {sb:4.1f} {b / a:6.2f}")
    best_loaded = max(table, key=lambda r: r["loaded"][0])
    default_loaded = next(r for r in table if r["threads"] == 2 and r["omp_wait_policy"] == "default")
    ratio = default_loaded["loaded"][0] / best_loaded["loaded"][0]
    print(f"best under a competing load: {best_loaded['threads']} thread(s), OMP_WAIT_POLICY="
          f"{best_loaded['omp_wait_policy']}")
    row = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "bench": "threads",
           "args": vars(args), "table": table, "raw": {str(k): v for k, v in rates.items()},
           "machine": machine(load_before, load_after),
           "commit": commit()}
    if not args.no_save:
        append_row(RESULTS, row)
    print(f"RESULT threads: {ratio:.2f} ratio (torch default 2 threads + default OpenMP wait under a competing "
          f"load / best config under that load: {best_loaded['threads']} thread(s), "
          f"{best_loaded['omp_wait_policy']})")


if __name__ == "__main__":
    main()

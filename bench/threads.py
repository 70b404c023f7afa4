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
import subprocess
import sys
import time
from pathlib import Path

from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "threads.jsonl"
ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time
import posttrain  # before torch: the MKL shim of models/blas.py, as every posttrain command has it
import torch
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

IDLE_WORKER = r"""
import json, sys, tempfile, time
from pathlib import Path
import posttrain
import torch
from posttrain.algos.losses import make_loss
from posttrain.configs import load_config
from posttrain.configs.sft import SFTConfig
from posttrain.configs.pipeline import PipelineConfig
from posttrain.data.synthetic import arithmetic_tasks
from posttrain.experiments.stages import make_data
from posttrain.engines.base import SamplingParams
from posttrain.engines.hf import HFGenerator
from posttrain.train import loop
from posttrain.train.sft import SFTStage
from posttrain.models import threads

if len(sys.argv) > 1 and sys.argv[1] == "govern":  # what the CLI sets up on a machine idle at start
    threads.GOVERNOR = threads.Governor(2)
work = Path(tempfile.mkdtemp())
data = make_data(PipelineConfig(n_train=64, n_val_rows=8), work)  # the pipeline's own SFT rows
# the SFT stage of ``posttrain pipeline --quick``: 16 conversations a step, packed rows of 512, auto precision
cfg = load_config(SFTConfig, None, [f"run_dir={work / 'sft'}", "train.steps=4", "train.batch_size=16",
                                     "train.save_every=0", "data.max_seq_len=512",
                                     f"data.train=[{{path: {data['train']}}}]",
                                     f"data.validation=[{data['validation']}]"])
t = loop.setup(cfg, lora=cfg.lora)
stage, ce = SFTStage(cfg, t), make_loss("ce")
loop.update(t, stage, stage.prepare(0).micro, ce)  # warm-up
t0 = time.perf_counter()
for step in (1, 2, 3):
    loop.update(t, stage, stage.prepare(step).micro, ce)
sft_step_s = (time.perf_counter() - t0) / 3
# greedy decoding as the pipeline measures: 32 problems, every row to 40 tokens
gen = HFGenerator(t.model, t.tokenizer, batch_size=32)
gen.stop_ids = frozenset({-1})
tasks = arithmetic_tasks(32, 2, "dev", max_digits=2)
t0 = time.perf_counter()
gen.generate([x.messages for x in tasks], SamplingParams(max_new_tokens=40, temperature=0.0))
print(json.dumps({"sft_step_s": sft_step_s, "decode_s": time.perf_counter() - t0, "precision": t.precision.precision,
                  "thread_changes": threads.GOVERNOR.changes if threads.GOVERNOR else 0,
                  "threads_end": torch.get_num_threads()}))
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


POLICIES = {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "default": {}, "governed": {},
            "spin 10k": {"GOMP_SPINCOUNT": "10000"}}
"""2-thread settings: passive waits; libgomp's default (spin, then sleep); the default governed as the
CLI runs it on an idle machine (models/threads.py: fewer threads while other processes use the cores)."""


def idle_policies(repeats: int, save: bool, with_load: bool) -> None:
    """2 threads: what each OpenMP wait setting costs the pipeline's SFT step and greedy decoding on
    an idle machine, and (``with_load``) beside one competing matmul process (docs/benchmarks.md)."""
    load_before = os.getloadavg()[0]
    cells = [(name, False) for name in POLICIES] + ([(n, True) for n in ("PASSIVE", "default", "governed")]
                                                    if with_load else [])
    res: dict[str, list[dict]] = {f"{n}{' + load' if ld else ''}": [] for n, ld in cells}
    for r in range(repeats):
        for name, load in (cells if r % 2 == 0 else list(reversed(cells))):
            key = f"{name}{' + load' if load else ''}"
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update({"OMP_NUM_THREADS": "2", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                        **POLICIES[name]})
            hog = subprocess.Popen([sys.executable, "-c", LOAD], env={**os.environ, "OMP_NUM_THREADS": "1"}) if load else None
            try:
                out = subprocess.run([sys.executable, "-c", IDLE_WORKER, "govern" if name == "governed" else ""],
                                     env=env, capture_output=True, text=True, check=True, cwd=ROOT)
            finally:
                if hog:
                    hog.terminate()
                    hog.wait()
            res[key].append(json.loads(out.stdout.strip().splitlines()[-1]))
            x = res[key][-1]
            print(f"  {key:16s} SFT step {x['sft_step_s']:.2f} s, decode {x['decode_s']:.2f} s, "
                  f"thread changes {x['thread_changes']}", flush=True)
    load_after = os.getloadavg()[0]

    table = []
    print(f"2 threads, {repeats} interleaved repeats; load {load_before:.2f} -> {load_after:.2f}")
    for key, runs in res.items():
        (a, sa), (b, sb) = mean_se([x["sft_step_s"] for x in runs]), mean_se([x["decode_s"] for x in runs])
        table.append({"setting": key, "sft_step_s": [a, sa], "decode_s": [b, sb],
                      "thread_changes": [x["thread_changes"] for x in runs]})
        print(f"  {key:16s} SFT step ({runs[0]['precision']}) {a:5.2f} ± {sa:.2f} s   decode 32 x 40 {b:5.2f} ± {sb:.2f} s")
    t = {x["setting"]: x for x in table}
    if save:
        append_row(RESULTS, {"bench": "threads", "mode": "idle_policies", "repeats": repeats, "policies": POLICIES,
                             "table": table, "raw": res,
                             **provenance("none", machine(load_before, load_after))})  # timed, not graded
    print(f"RESULT threads_idle_policy: {t['PASSIVE']['sft_step_s'][0] / t['governed']['sft_step_s'][0]:.2f} x "
          f"(SFT step time, OMP_WAIT_POLICY=PASSIVE / governed spinning, 2 threads, idle, {repeats} repeats)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--idle-policies", action="store_true",
                    help="2 threads on an idle machine: OpenMP wait settings on the pipeline's SFT step and decode")
    ap.add_argument("--with-load", action="store_true", help="--idle-policies: also beside a competing process")
    args = ap.parse_args()
    if args.idle_policies:
        idle_policies(args.repeats, not args.no_save, args.with_load)
        return

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

    print(f"embedded model, fp32 decode, batch {args.batch}, {args.tokens} tokens, {args.repeats} repeats; "
          f"{os.cpu_count()} cores, load average {load_before:.1f} -> {load_after:.1f}")
    print(f"{'threads':>7s} {'OMP_WAIT_POLICY':>15s} {'no extra load':>14s} {'+1 matmul proc':>14s} {'ratio':>6s}  (tokens/s)")
    table = []
    for t in (1, 2):
        for p in (None, "PASSIVE"):
            (a, sa), (b, sb) = mean_se(rates[(t, p, False)]), mean_se(rates[(t, p, True)])
            table.append({"threads": t, "omp_wait_policy": p or "default", "no_extra_load": [a, sa], "loaded": [b, sb]})
            print(f"{t:7d} {p or 'default':>15s} {a:7.1f} ± {sa:4.1f} {b:7.1f} ± {sb:4.1f} {b / a:6.2f}")
    best_loaded = max(table, key=lambda r: r["loaded"][0])
    default_loaded = next(r for r in table if r["threads"] == 2 and r["omp_wait_policy"] == "default")
    ratio = default_loaded["loaded"][0] / best_loaded["loaded"][0]
    print(f"best under a competing load: {best_loaded['threads']} thread(s), OMP_WAIT_POLICY="
          f"{best_loaded['omp_wait_policy']}")
    row = {"bench": "threads", "args": vars(args), "table": table, "raw": {str(k): v for k, v in rates.items()},
           **provenance("none", machine(load_before, load_after))}  # timed, not graded
    if not args.no_save:
        append_row(RESULTS, row)
    print(f"RESULT threads: {ratio:.2f} ratio (torch default 2 threads + default OpenMP wait under a competing "
          f"load / best config under that load: {best_loaded['threads']} thread(s), "
          f"{best_loaded['omp_wait_policy']})")


if __name__ == "__main__":
    main()

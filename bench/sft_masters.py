"""bf16 weights with fp32 masters against bf16 autocast, as whole SFT runs: the same data, steps and
seed in both, the two arms of a seed side by side (two processes, one thread each, started
together, so the machine's load falls on both alike).

    python bench/sft_masters.py [--seeds 0 1] [--steps 60] [--n 2000] [--work runs/sft_masters]

What it decides: whether ``precision: auto`` may train the SFT stage in ``bf16_master`` where it
would autocast (``train/autocast.py: masters_where_they_apply``). The rule, fixed before the first
run: it may if the masters arm is faster in every seed and its held-out loss is within 2 paired se
of autocast's (or lower). Speed is the stage's own ``tokens_per_s`` (metrics.jsonl, every step
after the first two, whose allocator warm-up differs); quality is the stage's held-out loss at the
end (``data.val_frac`` of the training rows, the same rows in every run: ``data.split_seed 0``). The
data is ``posttrain make-data arithmetic`` (train split), so the row's split is ``train``.
Appends one row to bench/results/sft_masters.jsonl.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from results_row import ROOT, append_row, machine, mean_se, provenance

ARMS = ("bf16", "bf16_master")


def run_arm(work: Path, data: Path, precision: str, seed: int, steps: int) -> subprocess.Popen:
    """Start one arm's SFT run; its output goes to ``<work>/seed<S>_<precision>.log``."""
    run_dir = work / f"seed{seed}_{precision}"
    args = [sys.executable, "-m", "posttrain.cli", "sft", "--config", str(ROOT / "recipes/sft.yaml"),
            f"run_dir={run_dir}", f"train.precision={precision}", f"train.seed={seed}", f"train.steps={steps}",
            "train.threads=1", "train.save_every=0", "train.keep_last=1", f"train.eval_every={steps}",
            "data.split_seed=0", f"data.train=[{{path: {data}}}]"]
    with open(work / f"seed{seed}_{precision}.log", "w") as log:  # the child keeps its own copy of the handle
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def read_run(run_dir: Path) -> dict[str, float]:
    from posttrain.train.metrics import read_metrics

    rows = read_metrics(run_dir)
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 2]
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    if not speeds or not vals:
        raise SystemExit(f"{run_dir}: no tokens_per_s / val_loss in metrics.jsonl (did the run finish?)")
    return {"tokens_per_s": statistics.mean(speeds), "val_loss_before": vals[0], "val_loss": vals[-1],
            "steps": max(r.get("step", 0) for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--n", type=int, default=2000, help="training conversations (make-data arithmetic)")
    ap.add_argument("--work", default="runs/sft_masters")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    work = ROOT / args.work
    work.mkdir(parents=True, exist_ok=True)
    data = work / "arith_train.jsonl"
    if not data.exists():
        subprocess.run([sys.executable, "-m", "posttrain.cli", "make-data", "arithmetic", "--n", str(args.n),
                        "--split", "train", "--out", str(data)], check=True, cwd=ROOT)
    load_before = os.getloadavg()[0]
    per_seed: dict[int, dict[str, dict[str, float]]] = {}
    for seed in args.seeds:
        procs = {p: run_arm(work, data, p, seed, args.steps) for p in ARMS}  # side by side
        for p, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"seed {seed} {p}: the SFT run failed; see {work}/seed{seed}_{p}.log")
        per_seed[seed] = {p: read_run(work / f"seed{seed}_{p}") for p in ARMS}
        r = per_seed[seed]
        print(f"seed {seed}: tokens/s autocast {r['bf16']['tokens_per_s']:.1f}, masters "
              f"{r['bf16_master']['tokens_per_s']:.1f} ({r['bf16_master']['tokens_per_s'] / r['bf16']['tokens_per_s']:.3f}x); "
              f"held-out loss {r['bf16']['val_loss']:.4f} vs {r['bf16_master']['val_loss']:.4f} "
              f"(start {r['bf16']['val_loss_before']:.4f})", flush=True)
    load_after = os.getloadavg()[0]
    ratios = [r["bf16_master"]["tokens_per_s"] / r["bf16"]["tokens_per_s"] for r in per_seed.values()]
    diffs = [r["bf16_master"]["val_loss"] - r["bf16"]["val_loss"] for r in per_seed.values()]
    d_mean, d_se = mean_se(diffs)
    faster = all(x > 1 for x in ratios)
    same_loss = d_mean <= 2 * d_se if len(diffs) > 1 else d_mean <= 0
    verdict = "masters kept" if faster and same_loss else "masters not kept"
    print(f"tokens/s masters / autocast: {', '.join(f'{x:.3f}' for x in ratios)}; held-out loss masters − autocast "
          f"{d_mean:+.4f} ± {d_se:.4f} (paired over {len(diffs)} seeds); rule: {verdict}")
    if not args.no_save:
        append_row(ROOT / "bench/results/sft_masters.jsonl", {
            "bench": "sft_masters", "seeds": args.seeds, "steps": args.steps, "n": args.n,
            "per_seed": {str(k): v for k, v in per_seed.items()}, "speed_ratio": ratios,
            "val_loss_diff": diffs, "val_loss_diff_mean": d_mean, "val_loss_diff_se": d_se, "verdict": verdict,
            **provenance("train", machine(load_before, load_after, threads=1))})
    print(f"RESULT sft_masters: {statistics.mean(ratios):.3f} x (bf16_master / bf16 autocast tokens/s, SFT stage, "
          f"{len(ratios)} seeds side by side; held-out loss diff {d_mean:+.4f} ± {d_se:.4f}; {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

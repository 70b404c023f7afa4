"""Judge cost in RLHF: judge tokens/s and the share of an RLHF step spent judging, with the step's
comparisons in one batched generate call versus one call per comparison, side by side in one run.

Workload: ``posttrain rlhf`` (``train_rlhf``) with the policy ``--model`` (the embedded
SmolLM2-135M-Instruct by default) and the judge ``--judge`` (by default a second copy of the same
model: an untrained GenRM, so most verdicts fail the format and are retried; ``--retries 0`` keeps
the judge's work to one pass), on the math environment, ``--prompts`` × ``--group`` responses a step
(``--group`` ring comparisons per prompt), fp32 on the CPU. For each mode (batched, then one call
per comparison) a fresh run: one warm-up step, then ``--steps`` timed steps.

Per step the run logs (metrics.jsonl): ``time_judge_s`` (the scorer: prompts, judge generation,
parsing, retries, length control), ``genrm_judge_tokens``, ``genrm_comparisons``, ``step_s``.
Reported per mode: judge tokens/s = Σ tokens / Σ time_judge_s, judge share of the step =
Σ time_judge_s / Σ step_s, seconds a step; and the batched speed-up.

Prints the figures and appends one JSON line to bench/results/rlhf_step.jsonl.
Run: ``python bench/rlhf_step.py [--model embedded] [--steps 2] [--threads 1]``; a smoke run:
``python bench/rlhf_step.py --model tiny-llama --judge tiny-llama --no-save``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "rlhf_step.jsonl"


def run_rlhf(args: argparse.Namespace, run_dir: Path, batched: bool) -> list[dict[str, Any]]:
    from posttrain.configs import load_config
    from posttrain.configs.rlhf import RLHFConfig
    from posttrain.train.metrics import read_metrics
    from posttrain.train.rlhf import train_rlhf

    cfg = load_config(RLHFConfig, None, [
        f"model={args.model}", f"run_dir={run_dir}", f"train.steps={args.steps + 1}", "train.eval_every=0",
        "train.save_every=0", "train.plot=false", "train.precision=fp32", f"train.threads={args.threads}",
        f"envs=[{{name: math, train_tasks: {args.prompts * (args.steps + 1)}, val_tasks: 0}}]",
        "curriculum.kind=random", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "algo.overlong_filter=false", "optim.lr=1e-6",
        f"judge.model={args.judge or args.model}", f"judge.max_new_tokens={args.judge_tokens}",
        f"judge.retries={args.retries}", f"judge.batched={str(batched).lower()}",
        f"judge.batch_size={args.prompts * args.group}",
    ])
    train_rlhf(cfg, progress=False)
    return [r for r in read_metrics(run_dir) if "step_s" in r][1:]  # drop the warm-up step


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total = lambda k: sum(r[k] for r in rows)  # noqa: E731
    judge_s, step_s, tokens = total("time_judge_s"), total("step_s"), total("genrm_judge_tokens")
    return {"steps": len(rows), "judge_tokens_per_step": round(tokens / len(rows), 1),
            "comparisons_per_step": round(total("genrm_comparisons") / len(rows), 1),
            "judge_tokens_per_s": round(tokens / judge_s, 1), "judge_share_of_step": round(judge_s / step_s, 4),
            "judge_s_per_step": round(judge_s / len(rows), 2), "s_per_step": round(step_s / len(rows), 2),
            "fallback_frac": round(total("genrm_fallback_frac") / len(rows), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="policy model spec")
    ap.add_argument("--judge", default=None, help="judge model spec (default: a second copy of --model)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per mode (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--judge-tokens", type=int, default=64, help="judge.max_new_tokens")
    ap.add_argument("--retries", type=int, default=0, help="judge.retries")
    ap.add_argument("--no-save", action="store_true", help="print only, do not append to the results file")
    args = ap.parse_args()

    import torch

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    modes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, batched in (("batched", True), ("per_comparison", False)):
            modes[name] = figures(run_rlhf(args, Path(tmp) / name, batched))
    record = {
        "bench": "rlhf_step", "model": args.model,
        "judge": args.judge or args.model, "dtype": "float32", "prompts": args.prompts, "group": args.group,
        "max_new_tokens": args.max_new_tokens, "judge_tokens": args.judge_tokens, "retries": args.retries,
        "threads": torch.get_num_threads(),
        "load_avg_before": round(load_before, 2), "load_avg_after": round(os.getloadavg()[0], 2),
        **{f"{m}/{k}": v for m, f in modes.items() for k, v in f.items()},
        "batched_speedup_judge": round(modes["per_comparison"]["judge_s_per_step"] / modes["batched"]["judge_s_per_step"], 2),
        "wall_s": round(time.perf_counter() - t0, 1),
        **provenance("none", machine(load_before, os.getloadavg()[0], threads=torch.get_num_threads())),  # speed
    }
    print(f"{'':16s}{'judge tok/s':>12s}{'judge share':>12s}{'judge s':>9s}{'step s':>9s}{'fallback':>10s}")
    for m, f in modes.items():
        print(f"{m:16s}{f['judge_tokens_per_s']:12.1f}{100 * f['judge_share_of_step']:11.1f}%"
              f"{f['judge_s_per_step']:9.2f}{f['s_per_step']:9.2f}{100 * f['fallback_frac']:9.0f}%")
    print(f"batched judging is {record['batched_speedup_judge']}x faster per step "
          f"({modes['batched']['comparisons_per_step']:.0f} comparisons a step); load average "
          f"{load_before:.1f} -> {record['load_avg_after']:.1f}, {record['threads']} threads")
    if not args.no_save:
        append_row(RESULTS, record)
    b = modes["batched"]
    print(f"RESULT rlhf_step: {record['batched_speedup_judge']} x (judge seconds a step, one call per comparison / "
          f"batched; batched judge {b['judge_tokens_per_s']:.1f} tok/s, {100 * b['judge_share_of_step']:.0f}% of the step)")


if __name__ == "__main__":
    main()

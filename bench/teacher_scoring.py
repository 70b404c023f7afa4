"""Teacher-scoring cost in MOPD: tokens/s of teacher scoring and its share of a distillation step.

Workload: ``posttrain distill`` (``train_distill``) with the student ``--model`` (the embedded
SmolLM2-135M-Instruct by default) in fp32 on the CPU and one teacher, ``--teacher`` (by default a
second copy of the same model, loaded by the teacher pool: same size, so the figure is the cost
of a same-size teacher); the math environment, ``--prompts`` tasks × ``--group`` rollouts a step,
``--max-new-tokens`` at temperature 1, no overlong filter (short limits truncate most replies).
One warm-up step (it also pays the teacher's lazy load), then ``--steps`` timed steps.

Per step the run logs (metrics.jsonl): ``time_teacher_s`` (routing + the teacher's no-grad packed
forward passes + writing the batch tensor), ``teacher_tokens`` (sampled tokens scored),
``step_s``, ``time_generate_s`` and ``time_train_s`` (which includes the teacher scoring). Reported:

* teacher tokens/s = Σ teacher_tokens / Σ time_teacher_s;
* teacher share of the step = Σ time_teacher_s / Σ step_s;
* for scale, the update's tokens/s (forward + backward over the same tokens) =
  Σ teacher_tokens / Σ (time_train_s − time_teacher_s).

Prints the figures and appends one JSON line to bench/results/teacher_scoring.jsonl.
Run: ``python bench/teacher_scoring.py [--model embedded] [--steps 3] [--threads 1]``.
The machine may be shared: the load average before and after is recorded with the figures.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "teacher_scoring.jsonl"


def run_distill(args: argparse.Namespace, run_dir: Path) -> list[dict[str, Any]]:
    from posttrain.configs import load_config
    from posttrain.configs.distill import DistillConfig
    from posttrain.distill.stage import train_distill
    from posttrain.train.metrics import read_metrics

    teacher = args.teacher or args.model
    cfg = load_config(DistillConfig, None, [
        f"model={args.model}", f"run_dir={run_dir}", f"train.steps={args.steps + 1}", "train.eval_every=0",
        "train.save_every=0", "train.plot=false", "train.precision=fp32", f"train.threads={args.threads}",
        f"envs=[{{name: math, train_tasks: {args.prompts * (args.steps + 1)}, val_tasks: 0}}]",
        "curriculum.kind=random", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "algo.overlong_filter=false", "optim.lr=1e-6",
        f"teachers.models=[{{name: teacher, model: '{teacher}'}}]", "teachers.default=teacher",
    ])
    train_distill(cfg, progress=False)
    return [r for r in read_metrics(run_dir) if "step_s" in r][1:]  # drop the warm-up step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="student model spec")
    ap.add_argument("--teacher", default=None, help="teacher model spec (default: a second copy of --model)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-save", action="store_true", help="print only, do not append to the results file")
    args = ap.parse_args()

    import torch

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_distill(args, Path(tmp) / "run")
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    total = lambda k: sum(r[k] for r in rows)  # noqa: E731
    tokens, teacher_s, step_s = total("teacher_tokens"), total("time_teacher_s"), total("step_s")
    update_s = total("time_train_s") - teacher_s
    record = {
        "bench": "teacher_scoring", "model": args.model, "teacher": args.teacher or args.model, "dtype": "float32", "steps": len(rows),
        "prompts": args.prompts, "group": args.group, "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "load_avg_before": round(load_before, 2), "load_avg_after": round(load_after, 2),
        "teacher_tokens_per_step": round(tokens / len(rows), 1),
        "teacher_tokens_per_s": round(tokens / teacher_s, 1),
        "update_tokens_per_s": round(tokens / update_s, 1) if update_s > 0 else None,
        "teacher_share_of_step": round(teacher_s / step_s, 4),
        "s_per_step": round(step_s / len(rows), 2), "teacher_s_per_step": round(teacher_s / len(rows), 3),
        "generate_s_per_step": round(total("time_generate_s") / len(rows), 2),
        "update_s_per_step": round(update_s / len(rows), 2), "wall_s": round(wall, 1),
        **provenance("none", machine(load_before, load_after, threads=torch.get_num_threads())),  # speed only
    }
    print(f"teacher scoring: {record['teacher_tokens_per_s']:.1f} tokens/s "
          f"({record['teacher_tokens_per_step']:.0f} tokens, {record['teacher_s_per_step']:.3f} s a step)")
    print(f"share of a MOPD step: {100 * record['teacher_share_of_step']:.1f}% of {record['s_per_step']:.2f} s "
          f"(generate {record['generate_s_per_step']:.2f} s, update {record['update_s_per_step']:.2f} s "
          f"= {record['update_tokens_per_s']} tokens/s)")
    print(f"load average {load_before:.1f} -> {load_after:.1f}, {record['threads']} threads")
    if not args.no_save:
        append_row(RESULTS, record)


if __name__ == "__main__":
    main()

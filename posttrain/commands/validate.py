"""``posttrain validate``: score any model on an RL run's held-out tasks, exactly as the run does.

    posttrain validate -c recipes/rlvr_cpu.yaml --model embedded --out runs/x/base.jsonl
    posttrain validate -c runs/x/config.yaml --model runs/x/best --out runs/x/best.jsonl \\
        --against runs/x/base.jsonl

The recipe (plus ``key=value`` overrides) gives the environments, their arguments, validation
sizes and seeds, the token limit and reasoning mode, so the tasks are the run's validation tasks
and the score is the one its ``val_reward/<env>`` metric would show (greedy, one sample per task).
``--split test`` scores as many tasks of the test split instead, for a report.
Writes one JSONL row per task (``env, task_id, reward, reason, response_tokens, finish_reason,
reasoning_tokens, answer_tokens``),
the same rows the RL stage writes to ``<run_dir>/validation/step_N.jsonl``.

``--against`` another such file: prints, per environment, the gain over it with the *paired*
standard error (``eval.compare``): both were scored on the same tasks, so the error of the
difference comes from the tasks that flipped, not from two independent binomial errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="RL recipe (or a run's config.yaml) whose validation tasks to score")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of --config")
    p.add_argument("--model", default=None, help="model spec or checkpoint directory (default: the recipe's)")
    p.add_argument("--out", required=True, help="per-task JSONL to write")
    p.add_argument("--against", default=None, help="a per-task JSONL of another model: print paired gains over it")
    p.add_argument("--split", default="dev", choices=("dev", "test"),
                   help="dev (the run's validation tasks, for choosing) or test (the same number of test tasks, "
                        "for reporting only)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def format_gains(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> str:
    """One table row per environment present in both: before, after, gain ± paired se, flips."""
    from posttrain.eval.compare import paired_gain

    lines = ["| env | tasks | before | after | gain ± paired se | gained / lost |", "|---|---|---|---|---|---|"]
    for env in [e for e in after if e in before]:
        g = paired_gain(before[env], after[env])
        lines.append(f"| {env} | {g.n} | {g.before:.3f} | {g.after:.3f} | {g.gain:+.3f} ± {g.se:.3f} | "
                     f"{g.gained} / {g.lost} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.eval.compare import read_task_rewards
    from posttrain.engines.hf import HFGenerator
    from posttrain.configs.rl import RLConfig
    from posttrain.serving.build import build_envs
    from posttrain.train.validation import validate

    if args.against and not Path(args.against).is_file():
        raise UserError(f"--against {args.against}: no such file (write it first with posttrain validate --out)")
    cfg = load_config(RLConfig, args.config, args.overrides)
    if not any(s.val_tasks for s in cfg.envs):
        raise UserError("no environment of the recipe has val_tasks > 0: nothing to validate")
    r = cfg.rollout
    generator = HFGenerator.from_spec(args.model or cfg.model, batch_size=r.batch_size, num_threads=args.threads)
    scores = validate(generator, build_envs(cfg.envs), cfg, Path(args.out), progress=not args.no_progress,
                      split=args.split)
    for key, value in scores.items():
        print(f"{key}: {value:.3f}")
    print(f"wrote {args.out}")
    if args.against:
        try:
            print(format_gains(read_task_rewards(args.against), read_task_rewards(args.out)))
        except ValueError as e:  # a malformed or unrelated --against file: the scores above are kept
            raise UserError(f"--against: {e}") from e
    return 0

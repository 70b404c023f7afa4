"""``posttrain profile``: the pass-rate profile the RL curriculum samples from (RECIPE.md §2).

    posttrain profile --model runs/sft/final --env math --env mcq --n 256 --k 8 --out profile.jsonl

For each environment, samples ``k`` rollouts (temperature 1 by default: the distribution RL will
sample from) on each of the first ``n`` training tasks drawn with ``--seed``, grades them, and
writes one line per task, ``{"task_id", "domain", "pass_rate", "k"}``, where ``pass_rate`` is the
mean reward of the k samples and ``domain`` is the *environment name* (the RL stage mixes
environments; two environments may share a domain). ``--n`` and ``--seed`` must equal the RL
config's ``envs[].train_tasks`` and ``task_seed`` so the ids match its task pool.

Rollout and grading are ``eval.evaluate`` on the train split, so profiling, evaluation and RL roll
out and grade the same way. Prints, per environment, the mean pass rate and the share of tasks
always solved (the curriculum drops them) and never solved.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", action="append", required=True, metavar="NAME", help="environment (repeatable)")
    p.add_argument("--model", default="embedded", help="model spec or checkpoint directory (default embedded)")
    p.add_argument("--out", required=True, help="profile JSONL to write")
    p.add_argument("--n", type=int, default=256, help="training tasks per environment (= envs[].train_tasks)")
    p.add_argument("--k", type=int, default=8, help="samples per task (default 8)")
    p.add_argument("--seed", type=int, default=0, help="task draw and sampling seed (= envs[].task_seed)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0, as in RL)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per model turn (default 256)")
    p.add_argument("--max-turns", type=int, default=8, help="model turns per multi-turn episode (default 8)")
    p.add_argument("--batch-size", type=int, default=32, help="rows decoded together (default 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    p.add_argument("--judge", default="policy", help="policy (default) | none | a make_judge spec")
    p.add_argument("--no-think", action="store_true", help="reasoning off (/no_think prompt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def profile_rows(env_name: str, tasks: Sequence[Any]) -> list[Any]:
    """One ``TaskProfile`` per evaluated task (``eval.evaluate``'s ``TaskResult``s)."""
    from posttrain.algos.curriculum import profile_row

    return [profile_row(t.task_id, env_name, t.rewards) for t in tasks]


def describe(env_name: str, rows: Sequence[Any]) -> str:
    """One summary line: mean pass rate, always-solved and never-solved shares."""
    n = len(rows)
    solved = sum(r.pass_rate >= 1.0 for r in rows)
    never = sum(r.pass_rate <= 0.0 for r in rows)
    mean = sum(r.pass_rate for r in rows) / n
    return (f"{env_name}: {n} tasks, mean pass rate {mean:.3f}, always solved {solved} ({solved / n:.0%}, "
            f"dropped by the curriculum), never solved {never} ({never / n:.0%})")


def run(args: argparse.Namespace) -> int:
    if args.n < 1 or args.k < 1:
        raise UserError("--n and --k must be >= 1")
    if args.temperature <= 0:
        raise UserError("--temperature must be > 0: a greedy profile has pass rates of only 0 or 1")
    from tqdm.auto import tqdm

    from posttrain.algos.curriculum import write_profile
    from posttrain.eval.evaluate import evaluate
    from posttrain.eval.run import build_env, env_names, make_eval_judge
    from posttrain.rollout.hf import HFGenerator

    names = env_names(args.env)
    generator = HFGenerator.from_spec(args.model, batch_size=args.batch_size, num_threads=args.threads)
    judge = make_eval_judge(args.judge, generator)
    rows: list[Any] = []
    for name in names:
        with tqdm(total=args.n * args.k, desc=f"profile {name}", unit="rollout", disable=args.no_progress) as bar:
            result = evaluate(generator, build_env(name, judge), split="train", n_tasks=args.n, k=args.k,
                              temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                              reasoning=not args.no_think, max_turns=args.max_turns, progress=bar)
        mine = profile_rows(name, result.tasks)
        print(describe(name, mine))
        rows += mine
        write_profile(args.out, rows)  # after each environment: a late failure keeps the finished ones
    print(f"wrote {args.out} ({len(rows)} tasks)")
    return 0

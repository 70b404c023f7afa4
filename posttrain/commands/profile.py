"""``posttrain profile``: the pass-rate profile the RL curriculum samples from (docs/recipe.md §2).

    posttrain profile --model runs/sft/final --env math --env mcq --n 256 --k 8 --out profile.jsonl
    posttrain profile --config recipes/rl.yaml --k 8 --out runs/rl/profile.jsonl   # the RL run's pools

With ``--config`` (an RL recipe, plus ``key=value`` overrides) the environments, their constructor
arguments, pool sizes and seeds, the temperature, token limit, reasoning mode and model come from
that recipe, so the profile's task ids are exactly the run's training pool; ``--env``, ``--n``,
``--seed``, ``--temperature``, ``--max-new-tokens``, ``--no-think`` are then not used (``--model``
still overrides the recipe's model). The RL stage's automatic re-profiling calls the same
:func:`profile_envs` on its live policy.

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

from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="RL recipe whose envs / pools / sampling settings to profile (see above)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of --config")
    p.add_argument("--env", action="append", metavar="NAME", help="environment (repeatable; without --config)")
    p.add_argument("--model", default=None, help="model spec or checkpoint directory (default: the recipe's, "
                                                  "else embedded)")
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


def _run_from_config(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.engines.registry import engine_for_spec
    from posttrain.eval.pass_rate_profile import profile_envs
    from posttrain.models import threads
    from posttrain.serving.build import build_envs

    cfg = load_config(RLConfig, args.config, args.overrides)
    r = cfg.rollout
    if args.threads is not None:
        threads.set_exact(args.threads)
    generator = engine_for_spec(args.model or cfg.model, r.engine, r.batch_size)  # the recipe's sampler precision
    envs = build_envs(cfg.envs)
    rows = profile_envs(generator, envs, [(s.name, s.train_tasks, s.task_seed) for s in cfg.envs], args.k,
                        r.temperature, r.max_new_tokens, r.reasoning, r.max_turns, not args.no_progress, args.out)
    print(f"wrote {args.out} ({len(rows)} tasks)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise UserError("--k must be >= 1")
    if args.config:
        return _run_from_config(args)
    if args.overrides:
        raise UserError(f"key=value overrides ({args.overrides[0]}) need --config")
    if not args.env:
        raise UserError("name the environments with --env NAME (repeatable), or give an RL recipe with --config")
    if args.n < 1:
        raise UserError("--n and --k must be >= 1")
    if args.temperature <= 0:
        raise UserError("--temperature must be > 0: a greedy profile has pass rates of only 0 or 1")
    from posttrain.eval.pass_rate_profile import profile_envs
    from posttrain.eval.evaluate import build_env, env_names, make_eval_judge
    from posttrain.engines.hf import HFGenerator

    names = env_names(args.env)
    generator = HFGenerator.from_spec(args.model or "embedded", batch_size=args.batch_size, num_threads=args.threads)
    judge = make_eval_judge(args.judge, generator)
    envs = {name: build_env(name, judge) for name in names}
    rows = profile_envs(generator, envs, [(name, args.n, args.seed) for name in names], args.k, args.temperature,
                        args.max_new_tokens, not args.no_think, args.max_turns, not args.no_progress, args.out)
    print(f"wrote {args.out} ({len(rows)} tasks)")
    return 0

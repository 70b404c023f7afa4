"""``posttrain eval``: evaluate a model on one or more environments and report accuracy, avg@k, pass@k.

    posttrain eval --env math --model embedded --n 50
    posttrain eval --env all --model runs/sft/final --k 4 --temperature 0.7 --out results.json

Greedy (``--temperature 0``, the default) with ``--k 1`` gives the accuracy; ``--k N`` with a
temperature samples N rollouts per task for avg@k and pass@k (see ``evaluate.py``). Prints one table
row per environment and writes everything, per-task samples included, to ``--out`` (rewritten
after each environment, so a long run that fails late keeps what it finished). An environment that
fails is reported on stderr and in the JSON's ``errors``, the others still run, and the exit status
is 1.

Judges: environments whose constructor takes a ``judge`` (multi-turn instruction following needs
one; long-context QA uses one for answers that are not an exact match) get ``--judge``: ``policy``
(default) reuses the evaluated model in-process, ``none`` gives none, anything else is a
``make_judge`` spec (a model spec or ``http://host:port/v1#model``).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import traceback
from datetime import datetime, timezone
from typing import Any

from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", action="append", required=True, metavar="NAME",
                   help="environment to evaluate (repeatable), or 'all' for every registered one")
    p.add_argument("--model", default="embedded", help="model spec: embedded, tiny-llama, or an HF directory")
    p.add_argument("--split", default="validation", choices=["validation", "train"])
    p.add_argument("--n", type=int, default=50, help="tasks per environment (default 50)")
    p.add_argument("--k", type=int, default=1, help="samples per task (default 1)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256, help="per model turn (default 256)")
    p.add_argument("--max-turns", type=int, default=50, help="model turns per multi-turn episode (default 50)")
    p.add_argument("--seed", type=int, default=0, help="picks the tasks and seeds sampling (default 0)")
    p.add_argument("--batch-size", type=int, default=16, help="rows decoded together (default 16)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: one per core; 1 is faster on a busy shared machine)")
    p.add_argument("--judge", default="policy", help="policy (default) | none | a make_judge spec")
    p.add_argument("--no-think", action="store_true", help="reasoning off (/no_think prompt)")
    p.add_argument("--out", help="write results JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def env_names(requested: list[str]) -> list[str]:
    from posttrain.envs.base import ENVIRONMENTS
    import posttrain.envs  # noqa: F401  (registers the built-in environments)

    names = ENVIRONMENTS.names() if "all" in requested else list(dict.fromkeys(requested))
    unknown = [n for n in names if n not in ENVIRONMENTS]
    if unknown:
        raise UserError(f"unknown environment(s) {', '.join(unknown)}; known: {', '.join(ENVIRONMENTS.names())}")
    return names


def build_env(name: str, judge: Any) -> Any:
    """The environment, given the judge if its constructor takes one."""
    from posttrain.envs.base import ENVIRONMENTS

    cls = ENVIRONMENTS.get(name)
    takes_judge = "judge" in inspect.signature(cls.__init__).parameters
    return cls(judge=judge) if takes_judge and judge is not None else cls()


def make_eval_judge(spec: str, policy: Any) -> Any:
    if spec == "none":
        return None
    if spec == "policy":
        from posttrain.envs.judge import LLMJudge

        return LLMJudge(policy)
    from posttrain.envs.judge import make_judge

    return make_judge(spec)


def run(args: argparse.Namespace) -> int:
    if args.n < 1 or args.k < 1:
        raise UserError("--n and --k must be >= 1")
    if args.k > 1 and args.temperature == 0:
        print("warning: --k > 1 with --temperature 0 draws the same greedy sample k times", file=sys.stderr)
    names = env_names(args.env)

    from tqdm.auto import tqdm

    from posttrain.eval.evaluate import evaluate
    from posttrain.eval.report import format_table, write_json
    from posttrain.engines.hf import HFGenerator

    generator = HFGenerator.from_spec(args.model, batch_size=args.batch_size, num_threads=args.threads)
    judge = make_eval_judge(args.judge, generator)
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
    }
    results, errors = [], {}
    for name in names:
        with tqdm(total=args.n * args.k, desc=name, unit="rollout", disable=args.no_progress) as bar:
            try:
                env = build_env(name, judge)
                results.append(evaluate(
                    generator, env, split=args.split, n_tasks=args.n, k=args.k, temperature=args.temperature,
                    max_new_tokens=args.max_new_tokens, seed=args.seed, top_p=args.top_p,
                    reasoning=not args.no_think, max_turns=args.max_turns, progress=bar,
                ))
            except Exception as e:  # noqa: BLE001  one broken environment must not lose the others' results
                errors[name] = f"{type(e).__name__}: {e}"
                print(f"error: environment {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
        if args.out:
            write_json(args.out, meta, results, errors)
    if results:
        print(format_table(results))
    if args.out:
        print(f"wrote {args.out}")
    return 1 if errors else 0

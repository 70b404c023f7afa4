"""``posttrain eval``: evaluate a model on one or more environments and report accuracy, avg@k, pass@k.

    posttrain eval --env math --model embedded --n 50
    posttrain eval --env all --model runs/sft/final --k 4 --temperature 0.7 --out results.json

Greedy (``--temperature 0``, the default) with ``--k 1`` gives the accuracy; ``--k N`` with a
temperature samples N rollouts per task for avg@k and pass@k (see ``evaluate.py``). Prints one table
row per environment and writes everything, per-task samples included, to ``--out`` (rewritten
after each environment, so a long run that fails late keeps what it finished). An environment that
fails is reported on stderr and in the JSON's ``errors``, the others still run, and the exit status
is 1.

Robustness (docs/recipe.md §7, ``robust.py``):

    posttrain eval --env math --env mcq --model runs/quant/fp8 --sampled-k 4 --wordings 3 --seeds 2 \
        --against runs/eval/bf16.json --report runs/eval/fp8_report

* ``--sampled-k K`` adds a sampled pass (K samples per task at ``--sample-temperature``: avg@K,
  pass@K) to the main (greedy by default) pass, in one command;
* ``--wordings W --seeds S``: every pass under W prompt wordings × S sampling seeds (the same tasks:
  they are drawn with ``--seed``); prints the prompt-sensitivity table (std of the per-wording
  means, in points);
* ``--against BASE.json`` (an earlier ``--out`` of this command): accuracy recovery of this model
  against that one, per environment and the median; ``--recovery A.json B.json`` does only that,
  from two files, without evaluating;
* ``--report DIR``: ``results.json``, ``report.md`` (all tables) and ``report.png``.

External benchmarks (``eval/benchmarks/``, docs/benchmarks_external.md), graded by the packages
that ship them:

    posttrain eval --benchmark humaneval --model embedded            # all 164, greedy pass@1
    posttrain eval --benchmark bfcl --category simple --n 50         # BFCL v4 AST accuracy
    posttrain eval --benchmark ifeval --n 64 --out runs/eval/ifeval.json
    posttrain eval --benchmark ifbench-test --n 100 --max-new-tokens 512   # IFBench's first 100 test prompts

``--benchmark`` is repeatable and combines with ``--env``; ``--n`` limits each benchmark's items
(per category for bfcl; the first N prompts for ifbench-test; default: all, and 64 instruction
tasks for ifeval/ifbench); ``--split``
picks the split of our environments (``test``, the default, is for reported figures; ``dev`` for
choosing settings). ``--out`` gets every item's record and the summary under ``benchmarks``.

Judges: environments whose constructor takes a ``judge`` (multi-turn instruction following needs
one; long-context QA uses one for answers that are not an exact match) get ``--judge``: ``policy``
(default) reuses the evaluated model in-process, ``none`` gives none, anything else is a
``make_judge`` spec (a model spec or ``http://host:port/v1#model``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from datetime import datetime, timezone
from typing import Any

from posttrain.envs.splits import SPLITS
from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", action="append", metavar="NAME",
                   help="environment to evaluate (repeatable), or 'all' for every registered one")
    p.add_argument("--benchmark", action="append", metavar="NAME",
                   help="external benchmark (repeatable): humaneval, bfcl, ifeval, ifbench, ifbench-test")
    p.add_argument("--category", action="append", metavar="NAME",
                   help="bfcl categories (repeatable; default simple_python, multiple, parallel)")
    p.add_argument("--model", default="embedded", help="model spec: embedded, tiny-llama, or an HF directory")
    p.add_argument("--split", default="test", choices=SPLITS,
                   help="split of the environments (default test: reported figures; dev: choosing settings)")
    p.add_argument("--n", type=int, default=None,
                   help="tasks per environment (default 50); items per benchmark (per bfcl category; default all)")
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
    p.add_argument("--sampled-k", type=int, default=0, metavar="K",
                   help="also sample K rollouts per task at --sample-temperature (avg@K, pass@K)")
    p.add_argument("--sample-temperature", type=float, default=0.7, help="for --sampled-k (default 0.7)")
    p.add_argument("--wordings", type=int, default=1, help="prompt wordings per environment (default 1: as written)")
    p.add_argument("--seeds", type=int, default=1, help="sampling seeds per wording (default 1)")
    p.add_argument("--against", metavar="BASE.json", help="print the accuracy recovery against this earlier --out")
    p.add_argument("--recovery", nargs=2, metavar=("BASE.json", "OTHER.json"),
                   help="only compare two earlier --out files (accuracy recovery), evaluate nothing")
    p.add_argument("--report", metavar="DIR", help="write results.json, report.md and report.png here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def benchmark_options(args: argparse.Namespace, progress: Any = None) -> Any:
    """What ``--benchmark`` runs get from the command line."""
    from posttrain.eval.benchmarks.base import BenchmarkOptions

    return BenchmarkOptions(split=args.split, n=args.n, k=args.k, temperature=args.temperature, top_p=args.top_p,
                            max_new_tokens=args.max_new_tokens, seed=args.seed, reasoning=not args.no_think,
                            categories=tuple(args.category or ()), progress=progress)


def run_one_benchmark(name: str, generator: Any, args: argparse.Namespace) -> Any:
    from tqdm.auto import tqdm

    from posttrain.eval.benchmarks import run_benchmark

    with tqdm(desc=name, unit="completion", disable=args.no_progress) as bar:
        return run_benchmark(name, generator, benchmark_options(args, bar))


def passes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The (k, temperature, wording, seed) combinations one environment is evaluated under."""
    modes = [(args.k, args.temperature)]
    if args.sampled_k:
        modes.append((args.sampled_k, args.sample_temperature))
    out = []
    for k, temp in modes:
        seeds = range(args.seed, args.seed + (args.seeds if temp > 0 else 1))  # greedy: seeds change nothing
        for w in range(args.wordings):
            for s in seeds:
                out.append({"k": k, "temperature": temp, "wording": w, "seed": s, "task_seed": args.seed})
    return out


def run(args: argparse.Namespace) -> int:
    from posttrain.eval.benchmarks import benchmark_names
    from posttrain.eval.evaluate import build_env, env_names, make_eval_judge
    from posttrain.eval.report import load_results, robustness_text, write_report

    if args.recovery:
        from posttrain.eval.robust import format_recovery, recovery

        a, b = (load_results(p) for p in args.recovery)
        print(format_recovery(recovery(a, b), args.recovery[0], args.recovery[1]))
        return 0
    if not args.env and not args.benchmark:
        raise UserError("--env or --benchmark is required (or --recovery A.json B.json to compare two results)")
    if args.n is not None and args.n < 1:
        raise UserError("--n must be >= 1")
    n_tasks = args.n if args.n is not None else 50
    if args.k < 1 or args.wordings < 1 or args.seeds < 1 or args.sampled_k < 0:
        raise UserError("--n, --k, --wordings and --seeds must be >= 1 (--sampled-k >= 0)")
    from posttrain.eval.robust import WORDINGS

    if args.wordings > len(WORDINGS):
        raise UserError(f"--wordings: at most {len(WORDINGS)} built-in wordings")
    base = load_results(args.against) if args.against else None
    if args.k > 1 and args.temperature == 0:
        print("warning: --k > 1 with --temperature 0 draws the same greedy sample k times", file=sys.stderr)
    names = env_names(args.env or [])
    benchmarks = benchmark_names(args.benchmark or [])

    from tqdm.auto import tqdm

    from posttrain.engines.hf import HFGenerator
    from posttrain.eval.benchmarks import BENCHMARKS
    from posttrain.eval.evaluate import evaluate
    from posttrain.eval.report import format_table, write_json

    generator = HFGenerator.from_spec(args.model, batch_size=args.batch_size, num_threads=args.threads)
    judge = make_eval_judge(args.judge, generator)
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "benchmarks": [],
    }
    results, errors = [], {}
    for name in names:
        todo = passes(args)
        with tqdm(total=n_tasks * sum(p["k"] for p in todo), desc=name, unit="rollout", disable=args.no_progress) as bar:
            try:
                env = build_env(name, judge)
                for p in todo:
                    results.append(evaluate(
                        generator, env, split=args.split, n_tasks=n_tasks, k=p["k"], temperature=p["temperature"],
                        max_new_tokens=args.max_new_tokens, seed=p["seed"], top_p=args.top_p,
                        reasoning=not args.no_think, max_turns=args.max_turns, progress=bar,
                        wording=p["wording"], task_seed=p["task_seed"] if p["seed"] != p["task_seed"] else None,
                    ))
            except Exception as e:  # noqa: BLE001  one broken environment must not lose the others' results
                errors[name] = f"{type(e).__name__}: {e}"
                print(f"error: environment {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
        if args.out:
            write_json(args.out, meta, results, errors)
    for name in benchmarks:
        try:
            done = run_one_benchmark(name, generator, args)
            meta["benchmarks"].append(done.to_dict())
            print(f"benchmark {name}: {BENCHMARKS.get(name).result_line(done)}  [{done.seconds:.0f} s]")
        except Exception as e:  # noqa: BLE001  one failed benchmark must not lose the others' results
            errors[f"benchmark:{name}"] = f"{type(e).__name__}: {e}"
            print(f"error: benchmark {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
        if args.out:
            write_json(args.out, meta, results, errors)
    if results:
        print(format_table(results))
        text = robustness_text(results, base, args.against or "base")
        if text:
            print("\n" + text)
    if args.out and (results or benchmarks):
        print(f"wrote {args.out}")
    if args.report and results:
        write_report(args.report, meta, results, errors, base, args.against or "base")
    return 1 if errors else 0

"""How much can a constant function earn in the ``code`` environment? The best constant output per
task (an oracle that knows the most common expected output), averaged over validation tasks, under
the default all-tests reward and under ``reward="fraction"``; and "hard-code the prompt's examples,
return the best constant otherwise". Issue 12 measured 0.23 and 0.17 under the old fraction reward.

    python bench/code_constant_baseline.py [--n 40] [--no-save]

Appends one row to bench/results/code_constant_baseline.jsonl (split ``dev``: the tasks it reads) and
ends with ``RESULT code_constant_baseline: ...``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

from posttrain.envs.code.env import CodeEnv, best_constant_reward, outputs_match

RESULTS = Path(__file__).resolve().parent / "results" / "code_constant_baseline.jsonl"


def examples_then_constant(expected: list, shown: list[int], reward: str) -> float:
    hidden = [e for i, e in enumerate(expected) if i not in shown]
    best = max((sum(outputs_match(e, c) for e in hidden) for c in hidden), default=0)
    passed = len(shown) + best
    if reward == "fraction":
        return passed / len(expected)
    return 1.0 if passed == len(expected) else 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--no-save", action="store_true", help="print only, append no row")
    args = p.parse_args()
    tasks = CodeEnv().tasks("dev", n=args.n)
    figures = {}
    for reward in ("all", "fraction"):
        const = sum(best_constant_reward(t.ground_truth["expected"], reward) for t in tasks) / len(tasks)
        ex = sum(examples_then_constant(t.ground_truth["expected"], t.ground_truth["shown"], reward)
                 for t in tasks) / len(tasks)
        figures[reward] = {"best_constant": round(const, 4), "examples_then_constant": round(ex, 4)}
        print(f"reward={reward:8s} over {len(tasks)} dev tasks: best constant {const:.3f}, "
              f"examples + best constant {ex:.3f}")
    if not args.no_save:
        append_row(RESULTS, {"bench": "code_constant_baseline", "tasks": len(tasks), "figures": figures,
                             **provenance("dev")})
    a, f = figures["all"], figures["fraction"]
    print(f"RESULT code_constant_baseline: {a['best_constant']:.3f} reward (the best constant output per task, "
          f"all-tests reward, {len(tasks)} dev tasks; examples + constant {a['examples_then_constant']:.3f}; "
          f"fraction reward {f['best_constant']:.3f} / {f['examples_then_constant']:.3f})")


if __name__ == "__main__":
    main()

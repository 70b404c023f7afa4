"""How much can a constant function earn in the ``code`` environment? The best constant output per
task (an oracle that knows the most common expected output), averaged over validation tasks, under
the default all-tests reward and under ``reward="fraction"``; and "hard-code the prompt's examples,
return the best constant otherwise". Issue 12 measured 0.23 and 0.17 under the old fraction reward.

    python scripts/code_constant_baseline.py [--n 40]
"""

from __future__ import annotations

import argparse

from posttrain.envs.code_env import CodeEnv, best_constant_reward, outputs_match


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
    args = p.parse_args()
    tasks = CodeEnv().tasks("dev", n=args.n)
    for reward in ("all", "fraction"):
        const = sum(best_constant_reward(t.ground_truth["expected"], reward) for t in tasks) / len(tasks)
        ex = sum(examples_then_constant(t.ground_truth["expected"], t.ground_truth["shown"], reward)
                 for t in tasks) / len(tasks)
        print(f"reward={reward:8s} over {len(tasks)} validation tasks: best constant {const:.3f}, "
              f"examples + best constant {ex:.3f}")


if __name__ == "__main__":
    main()

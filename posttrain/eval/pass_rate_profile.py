"""Pass-rate profiles for the RL curriculum: sample ``k`` rollouts per training task, grade them,
and keep each task's mean reward (``posttrain profile`` is the command; the RL stage's automatic
re-profiling calls :func:`profile_envs` on its live policy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def profile_rows(env_name: str, tasks: Sequence[Any]) -> list[Any]:
    """One ``TaskProfile`` per evaluated task (``eval.evaluate``'s ``TaskResult``s)."""
    from posttrain.algos.curriculum import profile_row

    return [profile_row(t.task_id, env_name, t.rewards) for t in tasks]


def summary(rows: Sequence[Any]) -> dict[str, Any]:
    """Tasks, mean pass rate, and the shares always solved (the curriculum drops them) and never solved."""
    n = len(rows)
    return {"tasks": n, "mean_pass_rate": round(sum(r.pass_rate for r in rows) / n, 4),
            "always": round(sum(r.pass_rate >= 1.0 for r in rows) / n, 4),
            "never": round(sum(r.pass_rate <= 0.0 for r in rows) / n, 4)}


def describe(env_name: str, rows: Sequence[Any]) -> str:
    """One summary line: mean pass rate, always-solved and never-solved shares."""
    s, n = summary(rows), len(rows)
    solved = sum(r.pass_rate >= 1.0 for r in rows)
    never = sum(r.pass_rate <= 0.0 for r in rows)
    return (f"{env_name}: {n} tasks, mean pass rate {s['mean_pass_rate']:.3f}, always solved {solved} "
            f"({solved / n:.0%}, dropped by the curriculum), never solved {never} ({never / n:.0%})")


def profile_envs(generator: Any, envs: dict[str, Any], pools: Sequence[tuple[str, int, int]], k: int,
                 temperature: float, max_new_tokens: int, reasoning: bool, max_turns: int,
                 progress: bool = True, out: str | None = None) -> list[Any]:
    """Profile ``(env name, n train tasks, task seed)`` pools with ``k`` samples per task.

    Prints one summary line per environment; with ``out``, rewrites the JSONL after each
    environment so a late failure keeps the finished ones.
    """
    from tqdm.auto import tqdm

    from posttrain.algos.curriculum import write_profile
    from posttrain.eval.evaluate import evaluate

    rows: list[Any] = []
    for name, n, seed in pools:
        with tqdm(total=n * k, desc=f"profile {name}", unit="rollout", disable=not progress) as bar:
            result = evaluate(generator, envs[name], split="train", n_tasks=n, k=k, temperature=temperature,
                              max_new_tokens=max_new_tokens, seed=seed, reasoning=reasoning, max_turns=max_turns,
                              progress=bar)
        mine = profile_rows(name, result.tasks)
        print(describe(name, mine))
        rows += mine
        if out:
            write_profile(out, rows)
    return rows

"""Robustness measures for ``posttrain eval`` (docs/recipe.md §7): prompt sensitivity and accuracy
recovery, with their tables and a plot.

* **Prompt sensitivity**: every environment is evaluated under several *wordings* of its prompt
  (``WORDINGS``: the task's last user message, framed differently; wording 0 is the original) and
  several seeds per wording. The score per wording is the mean over its seeds; the sensitivity is
  the standard deviation of those per-wording means (population std, in points = score × 100, as
  the report quotes it; lower is more robust), printed next to the mean over all runs.
* **Accuracy recovery** of a model B against a model A (e.g. FP8 against BF16): per environment
  and mode (greedy, avg@k), ``score_B / score_A``, and the median over environments (the recipe's
  metric). An environment where A scores 0 has no ratio; it is listed and left out of the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.envs.base import Task

WORDINGS: tuple[str, ...] = (
    "{prompt}",
    "Please solve the following.\n\n{prompt}",
    "{prompt}\n\nThink it through carefully, then give your final answer.",
    "Here is a task for you.\n{prompt}\nAnswer as precisely as you can.",
    "Task:\n{prompt}",
    "{prompt}\n\nBe concise.",
)


def reword(task: Task, wording: int) -> Task:
    """The task with its last user message framed by ``WORDINGS[wording]`` (string contents only)."""
    if wording == 0:
        return task
    template = WORDINGS[wording % len(WORDINGS)]
    msgs = [dict(m) for m in task.messages]
    for m in reversed(msgs):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            m["content"] = template.format(prompt=m["content"])
            break
    return replace(task, messages=msgs)


def mode_of(r: Any) -> str:
    """``greedy`` (temperature 0) or ``sampled@k``."""
    return "greedy" if r.temperature == 0 else f"sampled@{r.k}"


def prompt_sensitivity(results: Sequence[Any], score: str = "mean_reward") -> list[dict[str, Any]]:
    """One row per (environment, mode): mean over all its runs, the per-wording means (each
    averaged over seeds), and their population standard deviation ×100 (``std_points``)."""
    groups: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in results:
        groups.setdefault((r.env, mode_of(r)), {}).setdefault(getattr(r, "wording", 0), []).append(getattr(r, score))
    rows = []
    for (env, mode), by_w in groups.items():
        per_wording = {w: sum(v) / len(v) for w, v in sorted(by_w.items())}
        all_runs = [x for v in by_w.values() for x in v]
        rows.append({
            "env": env, "mode": mode, "wordings": len(by_w), "runs": len(all_runs),
            "mean": sum(all_runs) / len(all_runs), "per_wording": per_wording,
            "std_points": 100 * statistics.pstdev(per_wording.values()) if len(per_wording) > 1 else 0.0,
        })
    return rows


def _scores(results: Sequence[Any], score: str) -> dict[tuple[str, str], float]:
    """Mean score per (env, mode), over wordings and seeds."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in results:
        acc.setdefault((r.env, mode_of(r)), []).append(getattr(r, score))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def recovery(base: Sequence[Any], other: Sequence[Any], score: str = "mean_reward") -> dict[str, Any]:
    """Per (env, mode) ratio other/base and the median ratio per mode over environments."""
    a, b = _scores(base, score), _scores(other, score)
    rows = []
    for key in [k for k in a if k in b]:
        env, mode = key
        ratio = b[key] / a[key] if a[key] > 0 else None
        rows.append({"env": env, "mode": mode, "base": a[key], "other": b[key], "recovery": ratio})
    medians = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        ratios = [r["recovery"] for r in rows if r["mode"] == mode and r["recovery"] is not None]
        medians[mode] = statistics.median(ratios) if ratios else None
    return {"rows": rows, "median": medians}


def format_recovery(rec: dict[str, Any], base_name: str = "base", other_name: str = "other") -> str:
    lines = [f"| env | mode | {base_name} | {other_name} | recovery |", "|---|---|---:|---:|---:|"]
    for r in rec["rows"]:
        ratio = "n/a (base 0)" if r["recovery"] is None else f"{100 * r['recovery']:.1f}%"
        lines.append(f"| {r['env']} | {r['mode']} | {r['base']:.3f} | {r['other']:.3f} | {ratio} |")
    for mode, m in rec["median"].items():
        lines.append(f"| **median** | {mode} | | | **{'n/a' if m is None else f'{100 * m:.1f}%'}** |")
    return "\n".join(lines)


def format_sensitivity(rows: list[dict[str, Any]]) -> str:
    lines = ["| env | mode | wordings × runs | mean | per-wording means | std (points) |", "|---|---|---|---:|---|---:|"]
    for r in rows:
        per = " ".join(f"{v:.3f}" for v in r["per_wording"].values())
        lines.append(f"| {r['env']} | {r['mode']} | {r['wordings']} × {r['runs'] // max(r['wordings'], 1)} | "
                     f"{r['mean']:.3f} | {per} | {r['std_points']:.2f} |")
    return "\n".join(lines)


def plot_report(results: Sequence[Any], path: Path, sens: list[dict[str, Any]] | None = None,
                rec: dict[str, Any] | None = None) -> Path:
    """Left: per environment, greedy accuracy and sampled avg@k / pass@k (bars; error bars = the
    prompt-sensitivity std). Right (with a comparison): recovery per environment and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r.env for r in results))
    series: dict[str, dict[str, list[float]]] = {}
    for r in results:
        m = mode_of(r)
        series.setdefault(f"{m} avg", {}).setdefault(r.env, []).append(r.mean_reward)
        if m != "greedy":
            series.setdefault(f"{m} pass@k", {}).setdefault(r.env, []).append(r.pass_at_k)
    std = {(s["env"], s["mode"]): s["std_points"] / 100 for s in sens or []}
    fig, axes = plt.subplots(1, 2 if rec else 1, figsize=(12 if rec else 7, 4), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / max(len(series), 1)
    for i, (label, by_env) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(envs))]
        ys = [sum(by_env.get(e, [0])) / max(len(by_env.get(e, [0])), 1) for e in envs]
        mode = label.split(" ")[0]
        err = [std.get((e, mode), 0) if label.endswith("avg") else 0 for e in envs]
        ax.bar(xs, ys, width, label=label, yerr=err, capsize=3)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(envs))])
    ax.set_xticklabels(envs, rotation=30, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("score")
    ax.set_title("score per environment (error bar: prompt-sensitivity std)")
    ax.legend(fontsize=7)
    if rec:
        ax = axes[0][1]
        rows = [r for r in rec["rows"] if r["recovery"] is not None]
        ax.bar(range(len(rows)), [100 * r["recovery"] for r in rows])
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"{r['env']}\n{r['mode']}" for r in rows], rotation=30, fontsize=7)
        ax.axhline(100, color="black", lw=0.5)
        ax.set_ylabel("recovery (%)")
        med = ", ".join(f"{m}: {100 * v:.1f}%" for m, v in rec["median"].items() if v is not None)
        ax.set_title(f"accuracy recovery (median {med})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

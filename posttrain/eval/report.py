"""Printing and saving evaluation results: a plain-text table and one JSON document per run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.eval.evaluate import EvalResult, SampleResult, TaskResult

COLUMNS = ("env", "n", "k", "mean_reward", "pass@1", "pass@k", "tokens", "truncated", "seconds")


def table_rows(results: Sequence[EvalResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        samples = r.n_tasks * r.k
        truncated = r.finish_reasons.get("length", 0) / samples if samples else 0.0
        label = r.env + (f" w{r.wording}" if getattr(r, "wording", 0) else "") + (
            f" s{r.seed}" if getattr(r, "task_seed", None) is not None else "")
        rows.append((
            label, str(r.n_tasks), str(r.k), f"{r.mean_reward:.3f}", f"{r.pass_at_1:.3f}",
            f"{r.pass_at_k:.3f}", f"{r.mean_response_tokens:.1f}", f"{truncated:.0%}", f"{r.seconds:.0f}",
        ))
    return rows


def format_table(results: Sequence[EvalResult], markdown: bool = False) -> str:
    """Aligned text (or a Markdown table): one line per environment. ``tokens`` is the mean
    response length; ``truncated`` the share of rollouts cut at ``max_new_tokens``."""
    rows = [COLUMNS, *table_rows(results)]
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "|".join("---" for _ in COLUMNS) + "|")
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def write_json(path: str | Path, meta: dict[str, Any], results: Sequence[EvalResult],
               errors: dict[str, str] | None = None) -> None:
    """The run's settings (``meta``), every result with its per-task samples, and the environments
    that failed. Written to a temp file and renamed, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "results": [r.to_dict() for r in results], "errors": errors or {}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def load_results(path: str | Path) -> list[EvalResult]:
    """The results of a JSON file written by ``write_json`` (to merge runs into one table)."""
    doc = json.loads(Path(path).read_text())
    results = []
    for r in doc["results"]:
        tasks = [TaskResult(t["task_id"], [SampleResult(**s) for s in t["samples"]]) for t in r["tasks"]]
        results.append(EvalResult(**{**r, "tasks": tasks}))
    return results


def robustness_text(results: list[Any], base: list[Any] | None, base_name: str = "base") -> str:
    from posttrain.eval.robust import (
        format_recovery,
        format_sensitivity,
        prompt_sensitivity,
        recovery,
    )

    parts = []
    sens = prompt_sensitivity(results)
    if any(row["runs"] > 1 for row in sens):  # several wordings or seeds
        parts.append("prompt sensitivity (std of the per-wording means, points; lower = more robust):\n"
                     + format_sensitivity(sens))
    if base is not None:
        parts.append("accuracy recovery:\n" + format_recovery(recovery(base, results), base_name, "this model"))
    return "\n\n".join(parts)


def write_report(out_dir: str, meta: dict[str, Any], results: list[Any], errors: dict[str, str],
                 base: list[Any] | None, base_name: str = "base") -> None:
    from pathlib import Path

    from posttrain.eval.report import format_table, write_json
    from posttrain.eval.robust import plot_report, prompt_sensitivity, recovery

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / "results.json", meta, results, errors)
    sens = prompt_sensitivity(results)
    rec = recovery(base, results) if base is not None else None
    plot_report(results, d / "report.png", sens, rec)
    text = robustness_text(results, base, base_name)
    (d / "report.md").write_text(
        f"# posttrain eval: {meta['args'].get('model')}\n\n`{' '.join(meta['argv'])}`\n\n"
        + format_table(results, markdown=True) + "\n\n" + text + "\n\n![report](report.png)\n")
    print(f"wrote {d}/report.md, report.png, results.json")

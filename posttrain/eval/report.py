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

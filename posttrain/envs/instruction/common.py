"""Helpers shared by the generated-task environments of this package and ``envs/longctx.py``.

* Split membership is a function of the task id: ``splits.split_of`` hashes the id, so a task is in
  exactly one of "train", "dev" and "test", whatever seeds or sizes are asked for. Ids are content hashes
  (``content_id``), so two identical generated tasks share an id and therefore a split.
* ``sample_tasks`` draws candidate tasks from a seeded stream (one ``random.Random`` per candidate,
  seeded with a string, which Python hashes with SHA-512: stable across runs and processes) and keeps
  those that hash into the requested split.
* ``Judge``/``LazyJudge``: the LLM-judge interface (``posttrain/envs/judge.py``, written elsewhere)
  as a ``Protocol``, so these environments type-check and test without importing it; a spec string
  is turned into a judge with ``judge.make_judge`` only on first use, so building the environment
  (e.g. to list tasks) never loads a model.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Callable, Protocol

from posttrain.envs.base import Message, Split, Task
from posttrain.envs.splits import check_split, split_of



def content_id(prefix: str, spec: Any) -> str:
    """A stable id for generated content: ``prefix-`` + a hash of its canonical JSON."""
    blob = json.dumps(spec, sort_keys=True, ensure_ascii=False)
    return f"{prefix}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def sample_tasks(
    make_task: Callable[[random.Random], Task], split: Split, n: int, seed: int, stream: str
) -> list[Task]:
    """``n`` distinct tasks of ``split``, deterministic in (stream, seed, n)."""
    check_split(split)
    tasks: list[Task] = []
    seen: set[str] = set()
    max_draws = 100 * n + 1000  # the task spaces are huge; this only stops a broken generator
    for i in range(max_draws):
        if len(tasks) == n:
            break
        task = make_task(random.Random(f"{stream}:{seed}:{i}"))
        if task.id in seen or split_of(task.id) != split:
            continue
        seen.add(task.id)
        tasks.append(task)
    else:
        raise RuntimeError(f"{stream}: only {len(tasks)} distinct {split} tasks in {max_draws} draws")
    return tasks


# --------------------------------------------------------------------------- LLM judge


class Verdict(Protocol):
    score: float  # in [0, 1]
    passed: bool
    reason: str


class Judge(Protocol):
    def judge(self, messages: list[Message]) -> Verdict: ...


class LazyJudge:
    """Holds a judge object or a judge spec string; a spec is built on the first ``get()``."""

    def __init__(self, judge: Judge | str | None) -> None:
        self._judge: Judge | None = None if isinstance(judge, str) else judge
        self._spec: str | None = judge if isinstance(judge, str) else None

    @property
    def configured(self) -> bool:
        return self._judge is not None or self._spec is not None

    def get(self) -> Judge:
        if self._judge is None:
            if self._spec is None:
                raise RuntimeError("this environment needs an LLM judge: pass judge=<Judge or spec>")
            from posttrain.envs.judge import make_judge  # the judge may load a model: import late

            self._judge = make_judge(self._spec)
        return self._judge


def judge_score(verdict: Verdict) -> float:
    """The verdict's score clamped to [0, 1] (a misbehaving judge must not break VerifyResult)."""
    try:
        score = float(verdict.score)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, score)) if score == score else 0.0  # NaN → 0

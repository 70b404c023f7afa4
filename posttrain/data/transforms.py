"""Seeded SFT data transforms for reasoning control (docs/recipe.md §1).

* ``reasoning_off`` (10% of samples by default): the reasoning of every assistant turn is removed
  and the system prompt gains ``/no_think``; the template then renders an empty think block, so
  the model learns to answer directly when asked to.
* ``budget_truncate`` (3% by default): the *last* assistant turn's reasoning is cut at a random
  length and the original answer follows, so the model learns to answer from a partial trace when
  a reasoning budget stops it.

Both are pure functions of (row, rng); ``apply_reasoning_transforms`` draws per-row decisions from
a ``random.Random(seed)`` so the same seed gives the same dataset.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from posttrain.models.chat_template import NO_THINK_FLAG, split_reasoning

Row = dict[str, Any]


def _reasoning_of(msg: dict[str, Any]) -> tuple[str | None, str]:
    if msg.get("reasoning_content") is not None:
        return msg["reasoning_content"], msg.get("content") or ""
    return split_reasoning(msg.get("content") or "")


def reasoning_off(row: Row) -> Row:
    out = copy.deepcopy(row)
    msgs = out["messages"]
    for m in msgs:
        if m.get("role") == "assistant":
            _, answer = _reasoning_of(m)
            m.pop("reasoning_content", None)
            m["content"] = answer
    if msgs and msgs[0].get("role") == "system":
        if NO_THINK_FLAG not in (msgs[0].get("content") or ""):
            msgs[0]["content"] = f"{msgs[0].get('content') or ''}\n{NO_THINK_FLAG}".strip()
    else:
        msgs.insert(0, {"role": "system", "content": NO_THINK_FLAG})
    out["reasoning"] = False
    return out


def budget_truncate(row: Row, rng: random.Random) -> Row:
    out = copy.deepcopy(row)
    for m in reversed(out["messages"]):
        if m.get("role") != "assistant":
            continue
        reasoning, answer = _reasoning_of(m)
        if not reasoning:
            return out
        words = reasoning.split(" ")
        cut = rng.randint(0, max(0, len(words) - 1))
        m.pop("reasoning_content", None)
        m["reasoning_content"] = " ".join(words[:cut])
        m["content"] = answer
        out["budget_truncated"] = True
        return out
    return out


def apply_reasoning_transforms(
    rows: list[Row], seed: int, reasoning_off_frac: float = 0.10, budget_frac: float = 0.03
) -> list[Row]:
    rng = random.Random(seed)
    out = []
    for row in rows:
        u = rng.random()
        if u < reasoning_off_frac:
            out.append(reasoning_off(row))
        elif u < reasoning_off_frac + budget_frac:
            out.append(budget_truncate(row, rng))
        else:
            out.append(row)
    return out

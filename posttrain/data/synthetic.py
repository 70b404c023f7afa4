"""Generated SFT data: arithmetic with a short worked reasoning and the answer format.

``posttrain make-data arithmetic --n 2000 --out data/arith.jsonl`` writes conversation JSONL. Each
row asks for a sum, difference or product of 1–3 digit numbers and the assistant answers with a
column-by-column reasoning trace in a think block and ``Answer: N`` (the format the math
environment's verifier extracts). The traces are computed, not hand-typed, so they are always
right; the prompts use the same wording as ``arithmetic_tasks`` so the pipeline can grade the
model on held-out problems it never saw.

Held-out problems are disjoint from training ones by construction: a problem belongs to the
validation split iff a hash of its text falls in the validation bucket.
"""

from __future__ import annotations

from typing import Any, Iterator

from posttrain.envs.arithmetic import PROMPT, Op, Problem, problem_task, sample_problems  # noqa: F401
from posttrain.envs.splits import Split


def _digits(n: int) -> list[int]:
    return [int(c) for c in reversed(str(n))]


def addition_trace(a: int, b: int) -> str:
    da, db = _digits(a), _digits(b)
    steps, carry = [], 0
    places = ["ones", "tens", "hundreds", "thousands"]
    for i in range(max(len(da), len(db))):
        x, y = (da[i] if i < len(da) else 0), (db[i] if i < len(db) else 0)
        s = x + y + carry
        c_txt = f" + {carry}" if carry else ""
        steps.append(f"{places[i]}: {x} + {y}{c_txt} = {s}" + (f", write {s % 10} carry 1" if s >= 10 else ""))
        carry = s // 10
    if carry:
        steps.append("the final carry gives a leading 1")
    return "; ".join(steps) + f". So {a} + {b} = {a + b}."


def subtraction_trace(a: int, b: int) -> str:
    if a < b:
        return f"{b} - {a} = {b - a}, and since {a} < {b} the result is negative: {a - b}."
    return f"{a} - {b}: take {b} away from {a}. {a} - {b - b % 10} = {a - (b - b % 10)}, then - {b % 10} = {a - b}."


def multiplication_trace(a: int, b: int) -> str:
    if b < 10:
        return f"{a} * {b} = {a * b}."
    tens, ones = b - b % 10, b % 10
    return f"{a} * {b} = {a} * {tens} + {a} * {ones} = {a * tens} + {a * ones} = {a * b}."


TRACES = {"+": addition_trace, "-": subtraction_trace, "*": multiplication_trace}


def to_row(p: Problem) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": p.text},
            {"role": "assistant", "reasoning_content": TRACES[p.op](p.a, p.b), "content": f"Answer: {p.answer}"},
        ],
        "source": "synthetic/arithmetic",
        "ground_truth": str(p.answer),
    }


def arithmetic_rows(n: int, seed: int = 0, split: Split = "train", **kw: Any) -> Iterator[dict[str, Any]]:
    for p in sample_problems(n, seed, split, **kw):
        yield to_row(p)


def arithmetic_tasks(n: int, seed: int = 0, split: Split = "test", **kw: Any) -> list[Any]:
    """The same problems as environment ``Task``s (the ``arithmetic`` environment's), graded by the
    math environment's verifier."""
    return [problem_task(p) for p in sample_problems(n, seed, split, **kw)]


# --------------------------------------------------------------------------- kinds of `posttrain make-data`

def _banking_rows(n: int, seed: int, split: Split, **_: Any) -> Iterator[dict[str, Any]]:
    from posttrain.data.tool_demos import banking_rows  # tool-use SFT rows (the banking expert, verified)

    return banking_rows(n, seed, split)


KINDS = {"arithmetic": arithmetic_rows, "banking": _banking_rows}  # kind → rows(n, seed, split, **options)

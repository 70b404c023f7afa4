"""A second opinion on numeric answers: Hugging Face's Math-Verify (``math-verify`` on PyPI) reads the
whole reply with its own extraction and compares it with the reference.

Our ``arithmetic`` and ``math`` verifiers (envs/extract.py, envs/math_env.py) take the answer by our
rules (the last "Answer:" line, else the last number, with echo and number-literal checks) before any
comparison; ``math`` then asks math_verify whether that literal equals the reference. Here nothing of
ours is used: ``math_verify.parse`` finds the answer in the reply by the package's own priorities
("answer is", a boxed expression, the last expression) and ``verify`` compares it with the reference.
Where the two disagree, it is one of our rules (an echoed number, a non-literal such as "6 + 9*-5")
or theirs (their extraction takes a number we would not); ``regrade`` keeps our verdict beside theirs
so the disagreements can be counted and read.

Timeouts: math_verify guards ``parse`` and ``verify`` with ``signal.alarm`` (5 s each), which works
only on the main thread; a regrade runs there (the pipeline's report, the benches), never in a
server's thread, so the guard stays on: a reply is arbitrary text, and sympy can hang on one. Off the
main thread the guard raises, and the reply scores 0 with the error as its reason (never silently).
"""

from __future__ import annotations

from typing import Any, Sequence

GRADER = "Math-Verify (math-verify)"
ENVS = ("arithmetic", "math")
"""The environments whose answers it grades: a number against a numeric reference."""


def grade_reply(reply: str, gold: str) -> tuple[bool, str]:
    """Math-Verify's verdict on a whole ``reply`` against the reference ``gold`` → (correct, what it
    extracted, as text; "" when it found nothing)."""
    from math_verify import parse, verify

    try:
        found = parse(reply)
        ok = bool(found) and bool(verify(parse(gold), found))
    except Exception as e:  # a sympy corner case or the package's timeout: a zero with its reason
        return False, f"error: {type(e).__name__}"
    return ok, str(found[-1]) if found else ""


def regrade(rows: Sequence[dict[str, Any]], golds: dict[str, str]) -> list[dict[str, Any]]:
    """Per validation record of an ``ENVS`` task (``env``, ``task_id``, ``answer``, ``reward``):
    ``reward`` Math-Verify's verdict (0/1), ``ours`` our verifier's, and in ``reason`` what Math-Verify
    extracted when it said no. ``golds``: task id → reference answer. Records of other environments,
    or of tasks without a reference, are left out."""
    out = []
    for r in rows:
        gold = golds.get(r["task_id"])
        if r.get("env") not in ENVS or gold is None:
            continue
        ok, found = grade_reply(r.get("answer") or "", gold)
        out.append({"env": r["env"], "task_id": r["task_id"], "reward": float(ok), "ours": float(r["reward"] >= 1.0),
                    "reason": "" if ok else f"math-verify read {found!r}" if found else "math-verify found no answer"})
    return out

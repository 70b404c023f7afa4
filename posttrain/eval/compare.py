"""Paired comparison of two models scored on the same tasks.

Two held-out scores measured on the *same* tasks are not independent: most tasks are solved (or
failed) by both models. The standard error of the gain is therefore the standard error of the
per-task differences, ``sd(after − before) / sqrt(n)``, usually much smaller than the unpaired
``sqrt(se_before² + se_after²)``. ``gained`` / ``lost`` count the tasks that flipped (for 0/1
rewards these are McNemar's discordant pairs).

Inputs are ``{task_id: reward}`` maps (``read_task_rewards`` reads them from the per-task JSONL
that ``posttrain validate`` and the RL stage's validation write); only tasks present in both are
compared, and a comparison with no shared task is an error, not a zero.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PairedGain:
    n: int  # tasks scored by both
    before: float  # mean reward
    after: float
    gain: float  # after − before
    se: float  # standard error of the gain from the per-task differences (0 when n < 2)
    gained: int  # tasks whose reward rose
    lost: int  # tasks whose reward fell


def mean_and_se(xs: Sequence[float]) -> tuple[float, float]:
    """Mean of per-unit values (tasks, prompts) and its standard error across units: sample sd /
    sqrt(n); 0 with one unit, (nan, nan) with none."""
    n = len(xs)
    if not n:
        return float("nan"), float("nan")
    mean = sum(xs) / n
    return mean, (math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n) if n > 1 else 0.0)


def mean_over_runs(gains: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Mean of per-run (gain, paired se) over independent runs (seeds), and the standard error of
    that mean from the runs' own errors: sqrt(sum se²) / n."""
    if not gains:
        raise ValueError("no runs to average")
    n = len(gains)
    return sum(g for g, _ in gains) / n, math.sqrt(sum(se * se for _, se in gains)) / n


def paired_gain(before: Mapping[str, float], after: Mapping[str, float]) -> PairedGain:
    """Mean gain over the tasks both maps score, with its paired standard error."""
    ids = sorted(before.keys() & after.keys())
    if not ids:
        raise ValueError("no task is scored in both results: were they made with the same validation tasks?")
    d = [after[i] - before[i] for i in ids]
    n = len(d)
    mean_d, se = mean_and_se(d)
    return PairedGain(
        n=n, before=sum(before[i] for i in ids) / n, after=sum(after[i] for i in ids) / n, gain=mean_d, se=se,
        gained=sum(x > 0 for x in d), lost=sum(x < 0 for x in d),
    )


def read_task_rewards(path: str | Path) -> dict[str, dict[str, float]]:
    """``{env: {task_id: mean reward}}`` from a per-task validation JSONL (one row per task:
    ``{"env", "task_id", "reward", ...}``)."""
    out: dict[str, dict[str, float]] = {}
    for row in _task_rows(path):
        out.setdefault(row["env"], {})[row["task_id"]] = row["reward"]
    return out


def read_task_reasons(path: str | Path) -> dict[str, list[str]]:
    """``{env: [verifier reason of each task]}`` from the same JSONL (``""`` where a row has none)."""
    out: dict[str, list[str]] = {}
    for row in _task_rows(path):
        out.setdefault(row["env"], []).append(row["reason"])
    return out


def _task_rows(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"env": str(row["env"]), "task_id": str(row["task_id"]), "reward": float(row["reward"]),
                         "reason": str(row.get("reason", ""))})
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a validation row ({e}); expected "
                             '{"env": ..., "task_id": ..., "reward": ...}') from e
    return rows


ONE_LETTER = 0.9
"""Share of a multiple-choice model's answers on one letter above which its score is a constant
guess: options are shuffled per question, so answers that read the question spread over the letters
(~1/4 each), while a policy that learned only to answer "C" earns chance (1/4) with every answer C.
The pipeline's RLVR stage did exactly this on the mcq environment (docs/results/pipeline.md)."""
_CHOICE = re.compile(r"\bchose ([A-Z])\b")


def modal_choice(reasons: Sequence[str]) -> tuple[str, float, int] | None:
    """The most frequent answer letter among verifier reasons that name one (``chose X``), its share
    of them and their number; None when none names a letter (not a multiple-choice environment)."""
    letters = Counter(m.group(1) for r in reasons if (m := _CHOICE.search(r)))
    if not letters:
        return None
    letter, count = letters.most_common(1)[0]
    n = sum(letters.values())
    return letter, count / n, n


def record_gains(first: Path, last: Path) -> dict[str, dict[str, Any]]:
    """``domain_gains`` of two per-task record files (``validate``'s or the pipeline's test table's JSONL)."""
    return domain_gains(read_task_rewards(first), read_task_rewards(last), read_task_reasons(last))


def domain_gains(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]],
                 reasons: dict[str, list[str]] | None = None) -> dict[str, dict[str, Any]]:
    """Paired gains of ``b`` over ``a`` ({domain: {task id: reward}}) per domain, per wording of the
    arithmetic problems (``"arithmetic · story"``), and pooled over every task of every domain
    (``all``). No silent exclusions: a multiple-choice domain whose answers in ``b`` sit on one letter
    (``eval.compare.ONE_LETTER``, read from ``reasons``) is flagged ``one_letter`` (letter, share) and
    **stays in** ``all``, which then says ``flagged``; ``all without flagged`` is printed beside it,
    never instead of it."""
    from dataclasses import asdict

    from posttrain.envs.arithmetic import phrasing_of

    out: dict[str, dict[str, Any]] = {env: asdict(paired_gain(a[env], b[env])) for env in b if env in a}
    for env, g in out.items():
        modal = modal_choice((reasons or {}).get(env, []))
        if modal and modal[1] >= ONE_LETTER:
            g["one_letter"] = [modal[0], round(modal[1], 3)]
    domains = list(out)
    flagged = [env for env in domains if "one_letter" in out[env]]

    def pooled(envs: list[str]) -> dict[str, Any]:  # tasks of different domains: pooled under "<env>/<id>"
        pool = [{f"{env}/{i}": r for env in envs for i, r in d[env].items()} for d in (a, b)]
        return {**asdict(paired_gain(*pool)), "domains": envs}

    if len(domains) > 1:
        out["all"] = pooled(domains)
        if flagged:
            out["all"]["flagged"] = flagged
            if len(flagged) < len(domains):
                out["all without flagged"] = pooled([e for e in domains if e not in flagged])
    if "arithmetic" in out:  # asked in several wordings (envs/arithmetic.py): the gain of each, "arithmetic · words"
        kinds = sorted({phrasing_of(i) for i in b["arithmetic"]})
        for kind in kinds if len(kinds) > 1 else []:
            sub = [{i: r for i, r in d["arithmetic"].items() if phrasing_of(i) == kind} for d in (a, b)]
            if all(sub):
                out[f"arithmetic · {kind}"] = asdict(paired_gain(*sub))
    return out

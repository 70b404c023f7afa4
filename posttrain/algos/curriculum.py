"""Curriculum sampling for multi-environment RLVR: fixed domain shares, a moving difficulty target.

The recipe (Nemotron 3 Nano, RLVR): profile every task with the starting checkpoint (k samples →
pass rate), drop tasks it already solves every time, and per domain sample tasks near a target
pass rate whose mean moves linearly from easy to hard over training. Domain shares stay fixed in
every batch. When progress plateaus, re-profile with the current checkpoint and start again.

* :class:`GaussianCurriculum` — at progress p ∈ [0, 1] the target mean is
  ``μ(p) = mean_start + p·(mean_end − mean_start)``; a task with pass rate x is drawn with
  probability ∝ ``exp(−(x − μ)² / 2σ²)``, without replacement within a batch. Sampling uses the
  Gumbel-top-k trick on log-weights (equivalent to drawing one at a time and renormalising), which
  never underflows: far-away tasks stay possible, just unlikely.
* :class:`RandomSampler` — uniform, the paper's baseline ("random sampling drifts to easy tasks").
* :class:`DomainMixSampler` — splits a batch among domains by fixed ratios with largest-remainder
  rounding, then asks either sampler for each domain's share. Its random stream is derived from
  ``(seed, step)``, so a resumed run draws the same batches without saving sampler state.
* :class:`PlateauDetector` — the re-profiling rule, in numbers (the paper gives none): fire when
  ``mean(last W values) − mean(the W before) < δ`` and at least ``max(M, 2W)`` steps have passed
  since the last profile. Feed it the batch pass rate *minus the profiled pass rate of the batch's
  tasks* (:meth:`GaussianCurriculum.expected_pass_rate`): the raw batch pass rate falls by design as
  the curriculum hardens, so only the gain over the profile says whether the model still learns.

Profile file: JSONL, one ``{"task_id", "domain", "pass_rate", "k"}`` object per line.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np

from posttrain.errors import UserError


class ProfileError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class TaskProfile:
    task_id: str
    domain: str
    pass_rate: float  # fraction of the k samples that passed (mean reward for partial credit)
    k: int  # samples drawn when profiling


def profile_row(task_id: str, domain: str, rewards: Sequence[float]) -> TaskProfile:
    """A task's profile from the rewards of its k samples (rewards lie in [0, 1])."""
    if not rewards:
        raise ValueError(f"task {task_id!r}: no rewards to profile")
    return TaskProfile(task_id, domain, float(sum(rewards)) / len(rewards), len(rewards))


def _check_row(row: object, where: str) -> TaskProfile:
    if not isinstance(row, dict):
        raise ProfileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    extra = set(row) - {"task_id", "domain", "pass_rate", "k"}
    if extra:
        raise ProfileError(f"{where}: unknown field(s) {sorted(extra)}")
    for name in ("task_id", "domain"):
        if not isinstance(row.get(name), str) or not row[name]:
            raise ProfileError(f"{where}: field {name!r} must be a non-empty string, got {row.get(name)!r}")
    rate = row.get("pass_rate")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ProfileError(f"{where}: field 'pass_rate' must be a number in [0, 1], got {rate!r}")
    k = row.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ProfileError(f"{where}: field 'k' must be an integer >= 1, got {k!r}")
    return TaskProfile(row["task_id"], row["domain"], float(rate), k)


def read_profile(path: str | Path) -> list[TaskProfile]:
    rows: list[TaskProfile] = []
    seen: dict[str, int] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ProfileError(f"{where}: invalid JSON ({e.msg})") from None
            row = _check_row(obj, where)
            if row.task_id in seen:
                raise ProfileError(f"{where}: task_id {row.task_id!r} already on line {seen[row.task_id]}")
            seen[row.task_id] = lineno
            rows.append(row)
    return rows


def write_profile(path: str | Path, rows: Iterable[TaskProfile]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(asdict(row)) + "\n")


def target_mean(progress: float, mean_start: float, mean_end: float) -> float:
    """Linear move of the target pass rate from ``mean_start`` (p=0) to ``mean_end`` (p=1)."""
    p = min(max(progress, 0.0), 1.0)
    return mean_start + p * (mean_end - mean_start)


def sample_without_replacement(log_weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``n`` items drawn ∝ exp(log_weights) without replacement (Gumbel-top-k)."""
    if n > len(log_weights):
        raise ValueError(f"cannot draw {n} distinct items from {len(log_weights)}")
    keys = log_weights + rng.gumbel(size=len(log_weights))
    return np.argsort(-keys, kind="stable")[:n]


class TaskSampler(Protocol):
    def domains(self) -> list[str]: ...

    def sample(self, domain: str, n: int, progress: float, rng: np.random.Generator) -> list[str]:
        """``n`` distinct task ids of ``domain`` for training progress ``progress`` ∈ [0, 1]."""
        ...


def _by_domain(profile: Iterable[TaskProfile]) -> dict[str, list[TaskProfile]]:
    out: dict[str, list[TaskProfile]] = {}
    for row in profile:
        out.setdefault(row.domain, []).append(row)
    return out


def _check_enough(domain: str, have: int, n: int) -> None:
    if n > have:
        raise ValueError(f"domain {domain!r} has {have} tasks left to sample, a batch asks for {n}")


class GaussianCurriculum:
    """Per-domain sampling near a target pass rate that moves from easy to hard."""

    def __init__(
        self, profile: Iterable[TaskProfile], mean_start: float = 0.8, mean_end: float = 0.2, std: float = 0.15,
        drop_solved: bool = True,
    ) -> None:
        if std <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        rows = list(profile)
        # already solved every time: no signal (kept only when a domain would run out of tasks)
        kept = [r for r in rows if r.pass_rate < 1.0 or not drop_solved]
        self.n_solved_dropped = len(rows) - len(kept)
        self.mean_start, self.mean_end, self.std = mean_start, mean_end, std
        by = _by_domain(kept)
        self._ids = {d: [r.task_id for r in rs] for d, rs in by.items()}
        self._rates = {d: np.array([r.pass_rate for r in rs]) for d, rs in by.items()}
        self._rate_of = {r.task_id: r.pass_rate for r in kept}

    def domains(self) -> list[str]:
        return sorted(self._ids)

    def sizes(self) -> dict[str, int]:
        """Tasks left to sample per domain."""
        return {d: len(ids) for d, ids in self._ids.items()}

    def log_weights(self, domain: str, progress: float) -> np.ndarray:
        mu = target_mean(progress, self.mean_start, self.mean_end)
        return -((self._rates[domain] - mu) ** 2) / (2 * self.std**2)

    def probabilities(self, domain: str, progress: float) -> np.ndarray:
        """The probability of each task (in profile order) being the first one drawn."""
        lw = self.log_weights(domain, progress)
        w = np.exp(lw - lw.max())
        return w / w.sum()

    def sample(self, domain: str, n: int, progress: float, rng: np.random.Generator) -> list[str]:
        ids = self._ids.get(domain, [])
        _check_enough(domain, len(ids), n)
        idx = sample_without_replacement(self.log_weights(domain, progress), n, rng)
        return [ids[i] for i in idx]

    def expected_pass_rate(self, task_ids: Iterable[str]) -> float:
        """Mean profiled pass rate of these tasks (the baseline the plateau rule compares with)."""
        rates = [self._rate_of[t] for t in task_ids]
        return float(np.mean(rates)) if rates else math.nan


class RandomSampler:
    """Uniform sampling within a domain: the no-curriculum baseline."""

    def __init__(self, tasks_by_domain: Mapping[str, Sequence[str]]) -> None:
        self._ids = {d: list(ids) for d, ids in tasks_by_domain.items()}

    @classmethod
    def from_profile(cls, profile: Iterable[TaskProfile], drop_solved: bool = True) -> "RandomSampler":
        by = _by_domain(r for r in profile if not (drop_solved and r.pass_rate >= 1.0))
        return cls({d: [r.task_id for r in rs] for d, rs in by.items()})

    def domains(self) -> list[str]:
        return sorted(self._ids)

    def sample(self, domain: str, n: int, progress: float, rng: np.random.Generator) -> list[str]:
        ids = self._ids.get(domain, [])
        _check_enough(domain, len(ids), n)
        return [ids[i] for i in rng.choice(len(ids), size=n, replace=False)]


def largest_remainder(ratios: Mapping[str, float], total: int) -> dict[str, int]:
    """Split ``total`` into integer shares proportional to ``ratios`` (Hamilton's method).

    Each domain gets the floor of its exact quota; the units left go to the largest fractional
    parts, ties to the domain listed first. The counts always sum to ``total``.
    """
    if not ratios or any(r < 0 for r in ratios.values()) or sum(ratios.values()) <= 0:
        raise ValueError(f"domain ratios must be non-negative with a positive sum, got {dict(ratios)}")
    norm = sum(ratios.values())
    quotas = {d: total * r / norm for d, r in ratios.items()}
    counts = {d: math.floor(q) for d, q in quotas.items()}
    order = sorted(ratios, key=lambda d: -(quotas[d] - counts[d]))  # stable: ties keep given order
    for d in order[: total - sum(counts.values())]:
        counts[d] += 1
    return counts


class DomainMixSampler:
    """A batch of tasks with a fixed share of each domain, drawn by a per-domain TaskSampler."""

    def __init__(self, sampler: TaskSampler, ratios: Mapping[str, float], seed: int = 0) -> None:
        missing = {d for d, r in ratios.items() if r > 0} - set(sampler.domains())
        if missing:
            raise ValueError(f"no tasks to sample for domain(s) {sorted(missing)}")
        self.sampler, self.ratios, self.seed = sampler, dict(ratios), seed

    def counts(self, batch_size: int) -> dict[str, int]:
        return largest_remainder(self.ratios, batch_size)

    def sample(self, batch_size: int, step: int, progress: float) -> list[tuple[str, str]]:
        """``(domain, task_id)`` pairs for training step ``step``, grouped by domain."""
        return self.sample_counts(self.counts(batch_size), step, progress)

    def sample_counts(self, counts: Mapping[str, int], step: int, progress: float,
                      round: int = 0) -> list[tuple[str, str]]:
        """Given counts per domain; ``round`` > 0 draws the refills of a step from their own stream
        (a refill may repeat a task already in the step: each draw is without replacement only
        within itself)."""
        rng = np.random.default_rng([self.seed, step] + ([round] if round else []))
        out: list[tuple[str, str]] = []
        for domain, n in counts.items():
            if n:
                out += [(domain, t) for t in self.sampler.sample(domain, n, progress, rng)]
        return out


class PlateauDetector:
    """Say when to re-profile: the last-W mean improved by less than δ over the W before it.

    Call :meth:`update` once per step; it returns True at most once per profile and then starts
    counting afresh (the caller re-profiles and rebuilds the curriculum).
    """

    def __init__(self, window: int = 20, min_delta: float = 0.01, min_steps: int = 50) -> None:
        if window < 1 or min_steps < 0:
            raise ValueError(f"window must be >= 1 and min_steps >= 0, got {window}, {min_steps}")
        self.window, self.min_delta, self.min_steps = window, min_delta, min_steps
        self.values: list[float] = []

    def update(self, value: float) -> bool:
        self.values.append(value)
        W = self.window
        if len(self.values) < max(self.min_steps, 2 * W):
            return False
        recent = float(np.mean(self.values[-W:]))
        before = float(np.mean(self.values[-2 * W : -W]))
        if recent - before < self.min_delta:
            self.values = []
            return True
        return False

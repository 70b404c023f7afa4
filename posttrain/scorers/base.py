"""The scorer interface (see the package docstring)."""

from __future__ import annotations

from typing import Any, Literal, Protocol, Sequence

Phase = Literal["reward", "signal"]


class Scorer(Protocol):
    phase: Phase

    def __call__(self, rollouts: Sequence[Any], batch: Any) -> dict[str, float]:
        """Score ``rollouts`` in place (reward phase: ``batch`` is None) or add tensors to ``batch``
        (signal phase: row b of the batch is rollout b); return metrics."""
        ...


def run_scorers(scorers: Sequence[Scorer], phase: Phase, rollouts: Sequence[Any], batch: Any = None
                ) -> dict[str, float]:
    """Every scorer of ``phase``, in list order; their metrics merged (a later key wins)."""
    metrics: dict[str, float] = {}
    for s in scorers:
        if s.phase == phase:
            metrics.update(s(rollouts, batch))
    return metrics

"""The verifier reward: each rollout graded by the environment it was sampled in."""

from __future__ import annotations

import time
from typing import Any, Sequence


class VerifierReward:
    """Reward scorer: ``env.verify(task, messages)`` per rollout → ``reward`` and ``reason``.

    In process, or over HTTP when the environment is a ``RemoteEnvironment`` (same call).
    """

    phase = "reward"

    def __init__(self, envs: dict[str, Any]) -> None:
        self.envs = envs

    def __call__(self, rollouts: Sequence[Any], batch: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        for r in rollouts:
            result = self.envs[r.env].verify(r.task, r.messages)
            r.reward, r.reason = result.reward, result.reason
        return {"time_verify_s": time.perf_counter() - t0}

"""Sampled rollouts in the shape trainers and scorers read: :class:`Rollout`, :func:`collect_rollouts`.

A rollout records *how* it was sampled (:class:`Sampling`: temperature, top-p, engine, policy
version), so the trainer's log-probs, a teacher's scoring and the importance-sampling correction
all read the temperature from the batch itself, never from a setting passed on the side; an
asynchronous trainer can tell from ``policy_version`` how stale a rollout is.

Rewards are not set here: the scorers (``scorers/``) grade rollouts after sampling, so a verifier,
a reward model or both plug in the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

TRUNCATED = frozenset({"length", "context"})  # finish reasons of a rollout cut short (overlong)


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a rollout was drawn with."""

    temperature: float = 1.0
    top_p: float = 1.0
    engine: str = "hf"
    policy_version: int = 0  # optimizer steps the sampling weights had taken


@dataclass
class Rollout:
    """One sampled rollout; ``reward`` / ``reason`` are filled by the reward scorers."""

    env: str
    task_id: str
    group: int  # which prompt of the step it answers
    token_ids: list[int]  # prompt + everything after it, exactly as sampled / rendered
    loss_mask: list[int]  # 1 on the tokens the model sampled
    sampler_logprobs: list[float]  # one per mask-1 token, in order
    finish_reason: str
    reward: float = 0.0
    sampling: Sampling = field(default_factory=Sampling)
    reason: str = ""
    task: Any = None  # what the environment's verifier needs back
    messages: list[dict[str, Any]] = field(default_factory=list)  # the episode after the prompt

    @property
    def response_tokens(self) -> int:
        return len(self.sampler_logprobs)

    @property
    def truncated(self) -> bool:
        return self.finish_reason in TRUNCATED


def sampling_temperature(rollouts: Sequence[Rollout]) -> float:
    """The one temperature a batch of rollouts was sampled at (mixed temperatures are an error:
    the trainer scores a micro-batch at one temperature)."""
    temps = {r.sampling.temperature for r in rollouts}
    if len(temps) > 1:
        raise ValueError(f"rollouts sampled at different temperatures {sorted(temps)} cannot share a batch")
    return temps.pop() if temps else 1.0


def collect_rollouts(generator: Any, envs: dict[str, Any], picks: Sequence[tuple[str, Any]], params: Any,
                     group_size: int, max_turns: int, sampling: Sampling, group_offset: int = 0
                     ) -> tuple[list[Rollout], float]:
    """Sample ``group_size`` rollouts for each picked (env name, task): (rollouts, seconds).

    ``params`` is the engine's ``SamplingParams`` (its ``n`` is set to ``group_size``). Rollouts
    answering ``picks[i]`` get group ``group_offset + i``; they come back grouped by environment,
    task-major within one.
    """
    from dataclasses import replace

    from posttrain.episodes.multiturn import run_episodes

    params = replace(params, n=group_size)
    out: list[Rollout] = []
    t0 = time.perf_counter()
    for name, env in envs.items():
        mine = [(g, task) for g, (env_name, task) in enumerate(picks) if env_name == name]
        if not mine:
            continue
        trajectories = run_episodes(generator, env, [t for _, t in mine], params, max_turns)
        for i, traj in enumerate(trajectories):  # task-major: the G episodes of task 0, then task 1, ...
            out.append(Rollout(
                name, traj.task.id, group_offset + mine[i // group_size][0], traj.token_ids, traj.loss_mask,
                [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m], traj.finish_reason,
                sampling=sampling, task=traj.task, messages=traj.messages,
            ))
    return out, time.perf_counter() - t0

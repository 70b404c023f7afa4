"""The environment contract shared by RLVR, MOPD, curation and evaluation.

An environment knows its tasks and how to verify a rollout; it never knows the trainer.

* ``Task``: one prompt with everything needed to grade it (id, domain, prompt messages, tool
  definitions, ground truth). Tasks are plain JSON-able data so they travel over HTTP unchanged.
* ``Environment.verify(task, messages)``: grades the conversation the model produced *after* the
  prompt (assistant turns, and for tool environments the tool observations in between) and returns
  a ``VerifyResult`` with a reward in [0, 1], named components and a reason string. Verification is
  stateless: tool environments replay the transcript's tool calls against a fresh database, so the
  same call works in-process and behind the HTTP resource server.
* ``Environment.start_episode(task)``: only for multi-turn / tool environments. The rollout loop
  feeds each assistant message to ``Episode.step`` and appends the returned observation messages
  until ``done``. Malformed or unknown tool calls produce an error observation and are counted in
  ``Episode.stats``; they never raise.

Splits are disjoint and reproducible: ``tasks(split, n, seed)`` must return the same tasks for the
same arguments, and no task id may appear in two of "train", "dev" and "test" (envs/splits.py:
choose settings on dev, report test).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from posttrain.envs.splits import Split  # noqa: F401  (re-exported: every environment's split type)
from posttrain.registry import Registry

Message = dict[str, Any]  # OpenAI-style chat message: role, content, optional tool_calls, ...


@dataclass
class Task:
    id: str
    domain: str
    messages: list[Message]
    ground_truth: Any = None
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        return cls(**d)


@dataclass
class VerifyResult:
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must lie in [0, 1], got {self.reward}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepResult:
    """What the environment says back after one assistant turn of an episode."""

    observations: list[Message]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Episode:
    """A stateful, single-use multi-turn episode (tool execution, simulated user)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.stats: dict[str, int] = {}

    def count(self, reason: str) -> None:
        self.stats[reason] = self.stats.get(reason, 0) + 1

    def step(self, assistant_message: Message) -> StepResult:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Release resources (database connections, temp dirs). Safe to call twice."""


class Environment:
    """Base class: subclasses set ``name``/``domain`` and implement ``tasks`` and ``verify``."""

    name: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    multi_turn: ClassVar[bool] = False

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        raise NotImplementedError

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        raise NotImplementedError

    def start_episode(self, task: Task) -> Episode:
        raise TypeError(f"environment {self.name!r} is single-turn and has no episodes")


ENVIRONMENTS: Registry[type[Environment]] = Registry("environment")


_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S)


def final_answer_text(messages: list[Message]) -> str:
    """The text a single-turn verifier grades: the last assistant message's content, with every
    reasoning block removed (reasoning is never graded, only the answer after it).

    Reasoning is recognised wherever it appears, so tags cannot smuggle an answer past the rule:
    the leading ``<think>...</think>`` (unclosed → everything is reasoning, no answer), then any
    later complete ``<think>...</think>`` block, then everything before a stray ``</think>`` (its
    opening tag was in the prompt), then a later ``<think>`` left open to the end."""
    from posttrain.models.chat_template import split_reasoning

    for m in reversed(messages):
        if m.get("role") == "assistant":
            content = m.get("content") or ""
            if not isinstance(content, str):
                return ""
            _, answer = split_reasoning(content)
            answer = _THINK_BLOCK.sub(" ", answer)
            if "</think>" in answer:
                answer = answer.rsplit("</think>", 1)[1]
            if "<think>" in answer:
                answer = answer.split("<think>", 1)[0]
            return answer.strip()
    return ""


def make_env(name: str, **kwargs: Any) -> Environment:
    """Build an environment by registry name (importing the built-in ones first)."""
    import posttrain.envs  # noqa: F401  (registers the built-in environments)

    return ENVIRONMENTS.get(name)(**kwargs)

"""An environment served over HTTP (posttrain/serving/server.py), used exactly like an in-process one.

``RemoteEnvironment(url)`` asks the server's ``/health`` for the environment's name, domain and
whether it is multi-turn, then maps the ``Environment`` methods onto the resource-server endpoints:

* ``tasks(split, n, seed)`` → ``GET /tasks``, a page at a time (the server answers at most the
  ``max_tasks_per_request`` its ``/health`` reports; pages are asked for with ``offset``);
* ``verify(task, messages)`` → ``POST /verify`` with a NeMo Gym verify body. The conversation
  after the prompt is split where the model's part begins: everything up to the last user/system
  message rides in ``responses_create_params.input`` (after the prompt), the model-written rest in
  ``response.output``, which is where a NeMo Gym agent would put them. The whole task travels in
  the body, so the server needs no memory of it;
* ``start_episode(task)`` → ``POST /seed_session``; ``Episode.step`` → ``POST /step`` (the whole
  assistant message, so simulated-user turns come back as they do in process); ``close`` →
  ``POST /close_session``.

Transport failures and 5xx answers are retried (``request_json``) and then raise
``RemoteCallError`` naming the URL: an unreachable environment is an infrastructure fault, not a
reward of 0 for the model. A step is retried only when the connection was never made, since
sending it twice would run its tool calls twice.

Which one the trainer uses is configuration: ``make_env(name)`` in process, ``make_remote(url)``
over HTTP.
"""

from __future__ import annotations

from typing import Any

import httpx

from posttrain.envs.base import Environment, Episode, Message, Split, StepResult, Task, VerifyResult
from posttrain.serving.server import INPUT_ROLES, messages_to_items, with_item_ids
from posttrain.engines.openai_compat import assign_tool_call_ids, request_json, tool_to_responses


def build_verify_body(task: Task, messages: list[Message]) -> dict[str, Any]:
    """The ``POST /verify`` body for grading ``messages`` (the conversation after the prompt)."""
    full = assign_tool_call_ids([*task.messages, *messages])  # ids unique across input and output
    split = len(task.messages)
    for i in range(len(full) - 1, split - 1, -1):
        if full[i].get("role") in INPUT_ROLES:
            split = i + 1
            break
    params: dict[str, Any] = {"input": with_item_ids(messages_to_items(full[:split])), "metadata": {"task_id": task.id}}
    if task.tools:
        params["tools"] = [tool_to_responses(t) for t in task.tools]
    return {
        "responses_create_params": params,
        "response": response_object(with_item_ids(messages_to_items(full[split:])), params.get("tools") or []),
        "task": task.to_dict(),
    }


def response_object(output: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses-API response around ``output`` with the fields NeMo Gym's ``NeMoGymResponse``
    requires, so our verify body is a valid ``BaseVerifyRequest`` for any Gym resource server."""
    return {
        "id": "resp_posttrain", "created_at": 0.0, "model": "posttrain", "object": "response",
        "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": tools,
    }


class RemoteEnvironment(Environment):
    def __init__(
        self, url: str, *, timeout_s: float = 300.0, max_retries: int = 3, backoff_s: float = 0.5
    ) -> None:
        self.url = url.rstrip("/")
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        info = self.call("GET", "/health")
        # Instance attributes shadow the ClassVars: one class serves whichever env is behind the URL.
        self.name = info["env"]  # type: ignore[misc]
        self.domain = info["domain"]  # type: ignore[misc]
        self.multi_turn = bool(info["multi_turn"])  # type: ignore[misc]
        # None: a server from before /tasks had pages, which answers any n in one go
        self.page_size: int | None = info.get("max_tasks_per_request")

    def call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None, idempotent: bool = True
    ) -> Any:
        return request_json(
            self._client, method, f"{self.url}{path}", json_body=body, params=params,
            max_retries=self.max_retries, backoff_s=self.backoff_s, idempotent=idempotent,
        )

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        params: dict[str, Any] = {"split": split, "seed": seed}
        if self.page_size is None:
            if n is not None:
                params["n"] = n
            return [Task.from_dict(d) for d in self.call("GET", "/tasks", params=params)["tasks"]]
        out: list[Task] = []
        while n is None or len(out) < n:  # each page strictly advances, or the loop stops
            params["offset"] = len(out)
            if n is not None:
                params["n"] = want = min(self.page_size, n - len(out))
            answer = self.call("GET", "/tasks", params=params)
            page = [Task.from_dict(d) for d in answer["tasks"]]
            out += page
            if not page or (n is None and answer.get("next_offset") is None) or (n is not None and len(page) < want):
                break
        return out

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        out = self.call("POST", "/verify", build_verify_body(task, messages))
        return VerifyResult(
            reward=float(out["reward"]),
            components=dict(out.get("reward_components") or {}),
            reason=str(out.get("reason") or ""),
        )

    def start_episode(self, task: Task) -> Episode:
        if not self.multi_turn:
            return super().start_episode(task)
        return RemoteEpisode(self, task)

    def close(self) -> None:
        self._client.close()


class RemoteEpisode(Episode):
    """An episode living on the server; ``stats`` mirrors the server-side episode's counters."""

    def __init__(self, env: RemoteEnvironment, task: Task) -> None:
        super().__init__(task)
        self.env = env
        seeded = env.call("POST", "/seed_session", {"task": task.to_dict()})
        self.session_id: str = seeded["resources_session_id"]
        self.tools: list[dict[str, Any]] = [tool_to_responses(t) for t in task.tools or []]
        self._closed = False

    def step(self, assistant_message: Message) -> StepResult:
        body = {"resources_session_id": self.session_id, "message": assistant_message}
        out = self.env.call("POST", "/step", body, idempotent=False)  # a step runs tool calls once
        self.stats = dict(out.get("stats") or {})
        return StepResult(observations=out["observations"], done=bool(out["done"]), info=out.get("info") or {})

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.call("POST", "/close_session", {"resources_session_id": self.session_id})


def make_remote(url: str, **kwargs: Any) -> RemoteEnvironment:
    """The factory the config uses for an environment behind ``url`` (e.g. http://127.0.0.1:8000)."""
    return RemoteEnvironment(url, **kwargs)

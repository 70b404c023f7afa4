"""A NeMo Gym resource server as a posttrain ``Environment`` (the other direction of issue 18).

``GymEnvironment(url, dataset)`` lets ``posttrain rl`` train on any of NeMo Gym's environments: the
tasks are the rows of a NeMo Gym dataset (JSONL, one ``{"responses_create_params": {...}, <row
fields>}`` per line, as Gym's ``ng_collect_rollouts`` reads them), and the resource server behind
``url`` runs the tools and gives the reward. In a recipe::

    envs:
      - {name: gym_weather, url: "http://127.0.0.1:8003", protocol: gym,
         dataset: resources_servers/example_single_tool_call/data/example.jsonl}

How each ``Environment`` method maps onto Gym's resource-server protocol:

* ``tasks(split, n, seed)`` — rows of ``dataset`` for train and of ``validation_dataset`` for dev and
  test (half each, by hash; without one, every row of ``dataset`` has its hashed split), shuffled by ``seed`` and cycled when ``n`` exceeds them (ids stay distinct). A row's
  ``input`` items become the task's messages (``developer`` → ``system``), its Responses-API tools
  the task's chat-form tools, the row itself travels in ``task.metadata["gym_row"]``;
* ``start_episode(task)`` (rows with tools) — ``POST /seed_session`` with Gym's
  ``ResourcesSeedSessionRequest`` (a fresh ``resources_session_id``, ``episode_id``, ``task_id:
  {taskset, task_id}`` and ``task_data`` = the row's fields); the session cookie it sets goes with
  every later call of the episode;
* ``Episode.step(message)`` — the message's tool calls (our XML, or ``tool_calls``) each as
  ``POST /<tool name>`` with the arguments; the answer body, verbatim, is the tool observation (what
  Gym's own agent shows the model). A message without tool calls ends the episode; a malformed call
  gets the same error observation and ``error:<reason>`` count as our own tool environments;
* ``verify(task, messages)`` — ``POST /verify`` with the row's fields, its
  ``responses_create_params`` and a Responses-API ``response`` whose output is the conversation
  after the prompt, tool calls as ``function_call`` / ``function_call_output`` items (what Gym's
  agent sends). A stateful server verifies against the episode's session: the tool observations
  carry ``gym_session`` (the session id), so verify sends that session's cookie and then closes it
  (``POST /close_session``). Sessions never verified are closed when the bounded table of open
  ones overflows, or by ``close()``.

An unreachable server or an HTTP error raises ``RemoteCallError`` (after retries of connection
failures): an infrastructure fault, never a reward of 0.
"""

from __future__ import annotations

import http.cookies
import json
import random
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import httpx

from posttrain.envs.base import Environment, Episode, Message, Split, StepResult, Task, VerifyResult
from posttrain.serving.remote import response_object
from posttrain.envs.splits import SPLITS, check_split, held_out_split, split_of
from posttrain.serving.server import items_to_messages, messages_to_items, with_item_ids
from posttrain.envs.tools import parse_error_result, parse_turn
from posttrain.engines.openai_compat import RemoteCallError, assign_tool_call_ids, tool_to_chat, tool_to_responses

SESSION_KEY = "gym_session"  # on tool observations: the Gym session the episode ran in
MAX_OPEN_SESSIONS = 4096


def split_rows(train: list[dict[str, Any]], held_out: list[dict[str, Any]] | None) -> dict[str, list[dict[str, Any]]]:
    """train / dev / test rows: with a held-out dataset, ``dataset`` is train and the held-out rows are
    cut into dev and test (``splits.held_out_split``); with one dataset only, each row's split is
    ``splits.split_of`` of its JSON, so no row is trained on and reported."""
    key = lambda row: json.dumps(row, sort_keys=True)  # noqa: E731
    if held_out is None:
        out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
        for row in train:
            out[split_of(key(row))].append(row)
        return out
    return {"train": train, **{s: [r for r in held_out if held_out_split(key(r)) == s] for s in ("dev", "test")}}


class GymEnvironment(Environment):
    multi_turn = False

    def __init__(
        self,
        url: str,
        dataset: str | Path,
        *,
        name: str = "gym",
        domain: str = "gym",
        validation_dataset: str | Path | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = name  # type: ignore[misc]  (instance attributes shadow the ClassVars)
        self.domain = domain  # type: ignore[misc]
        self.rows = split_rows(load_rows(dataset), load_rows(validation_dataset) if validation_dataset else None)
        self.multi_turn = any(r["responses_create_params"].get("tools") for r in self.rows["train"])  # type: ignore[misc]
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._transport = httpx.HTTPTransport()  # no cookie jar: each session's cookies are its own
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._sessions: OrderedDict[str, dict[str, str]] = OrderedDict()  # open session id -> cookies
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------- HTTP

    def send(
        self, method: str, path: str, body: Any = None, cookies: dict[str, str] | None = None, *,
        check: bool = True,
    ) -> tuple[httpx.Response, dict[str, str]]:
        """One request with exactly ``cookies``; (the answer, cookies it set). Connection failures
        are retried (the server never saw the request); an HTTP error status raises (unless not
        ``check``)."""
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else {}
        url = f"{self.url}{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = httpx.Request(method, url, json=body, headers=headers,
                                    extensions={"timeout": self._timeout.as_dict()})
            try:
                response = self._transport.handle_request(request)
                response.read()
            except httpx.ConnectError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            except httpx.TransportError as e:
                raise RemoteCallError(f"{method} {url} failed: {type(e).__name__}: {e}") from None
            if check and response.status_code >= 400:
                raise RemoteCallError(f"{method} {url} returned HTTP {response.status_code}: {response.text[:500]}")
            jar: dict[str, str] = {}
            for header in response.headers.get_list("set-cookie"):
                parsed = http.cookies.SimpleCookie()
                parsed.load(header)
                jar.update({k: m.value for k, m in parsed.items()})
            return response, jar
        raise RemoteCallError(f"{method} {url} failed after {self.max_retries + 1} attempts; last error: {last}")

    def ping(self) -> None:
        """Raise ``RemoteCallError`` when the server cannot be reached (after ``send``'s retries).
        Any HTTP answer, an error status included (Gym's servers have no ``GET /``), means it can:
        ``build_envs`` calls this so a wrong URL fails before the model loads."""
        self.send("GET", "/", check=False)

    # ----------------------------------------------------------------------- Environment

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        rows = self.rows[check_split(split)]
        if not rows:
            raise ValueError(f"{self.name}: no {split} rows in its datasets")
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        n = len(rows) if n is None else n
        return [row_to_task(rows[order[i % len(rows)]], f"{self.name}/{split}/{order[i % len(rows)]}"
                            + (f"#{i // len(rows)}" if i >= len(rows) else ""), self.domain) for i in range(n)]

    def start_episode(self, task: Task) -> Episode:
        if not self.multi_turn:
            return super().start_episode(task)
        return GymEpisode(self, task)

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        row = task.metadata["gym_row"]
        params = row["responses_create_params"]
        sid = next((m[SESSION_KEY] for m in reversed(messages) if m.get(SESSION_KEY)), None)
        with self._lock:
            cookies = self._sessions.get(sid) if sid else None
        output = with_item_ids(messages_to_items(structured(messages, task.tools)))
        body = {**row, "response": response_object(output, list(params.get("tools") or []))}
        try:
            out = self.send("POST", "/verify", body, cookies)[0].json()
        finally:
            if sid:
                self.close_session(sid)
        reward = float(out["reward"])
        components = {k: float(v) for k, v in (out.get("reward_components") or {}).items()}
        reason = out.get("failure_kind") or out.get("failure_reason") or ""
        return VerifyResult(reward=reward, components=components, reason=str(reason))

    def open_session(self, sid: str, cookies: dict[str, str]) -> None:
        with self._lock:
            self._sessions[sid] = cookies
            evicted = []
            while len(self._sessions) > MAX_OPEN_SESSIONS:
                evicted.append(self._sessions.popitem(last=False)[0])
        for old in evicted:
            self._close_remote(old, {})

    def close_session(self, sid: str) -> None:
        with self._lock:
            cookies = self._sessions.pop(sid, None)
        if cookies is not None:
            self._close_remote(sid, cookies)

    def _close_remote(self, sid: str, cookies: dict[str, str]) -> None:
        try:
            self.send("POST", "/close_session", {"resources_session_id": sid, "episode_id": {"rollout_id": sid}}, cookies)
        except RemoteCallError:
            pass  # the server keeps process-local records until it exits; nothing to retry here

    def close(self) -> None:
        with self._lock:
            sids = list(self._sessions)
        for sid in sids:
            self.close_session(sid)
        self._transport.close()


class GymEpisode(Episode):
    """One Gym resource-server session: tool calls as ``POST /<tool>``, observations verbatim."""

    def __init__(self, env: GymEnvironment, task: Task) -> None:
        super().__init__(task)
        self.env = env
        self.session_id = f"posttrain-{uuid.uuid4().hex}"
        row = task.metadata["gym_row"]
        seed = {
            "resources_session_id": self.session_id,
            "episode_id": {"rollout_id": self.session_id},
            "task_id": {"taskset": env.name, "task_id": task.id},
            "task_data": {k: v for k, v in row.items() if k != "responses_create_params"},
        }
        _, self.cookies = env.send("POST", "/seed_session", seed)
        env.open_session(self.session_id, self.cookies)
        self.tools = [tool_to_chat(t) for t in task.tools or []]
        self.done = False
        self.tagged = False  # whether an observation carries the session id (then verify closes it)

    def step(self, assistant_message: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() called on a finished episode")
        self.count("turns")
        turn = parse_turn(assistant_message, self.tools)
        if turn.parse_error is not None:
            self.count(f"error:{turn.parse_error.reason}")
            obs = parse_error_result(turn.parse_error).message()
            self.tagged = True
            return StepResult([{**obs, SESSION_KEY: self.session_id}], False)
        if not turn.calls:
            self.done = True
            return StepResult([], True)
        observations = []
        for call in turn.calls:
            self.count("tool_calls")
            response, cookies = self.env.send("POST", f"/{call.name}", call.arguments, self.cookies)
            self.cookies.update(cookies)
            observations.append({"role": "tool", "name": call.name, "content": response.text,
                                 SESSION_KEY: self.session_id})
        self.tagged = True
        return StepResult(observations, False)

    def close(self) -> None:
        # A transcript that names the session keeps it open for verify, which closes it; one that
        # cannot (no tool call was made) would only leak it.
        if not self.tagged:
            self.env.close_session(self.session_id)


# --------------------------------------------------------------------------- rows and transcripts


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("responses_create_params"), dict):
            raise ValueError(f"{path}:{i + 1}: a NeMo Gym row needs a 'responses_create_params' object")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def row_to_task(row: dict[str, Any], task_id: str, domain: str) -> Task:
    params = row["responses_create_params"]
    items = params.get("input") or []
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in items_to_messages(items)]
    if params.get("instructions"):
        messages.insert(0, {"role": "system", "content": params["instructions"]})
    tools = [tool_to_chat(tool_to_responses(t)) for t in params.get("tools") or [] if t.get("type") == "function"]
    return Task(id=task_id, domain=domain, messages=messages, tools=tools or None, metadata={"gym_row": row})


def structured(messages: list[Message], tools: list[dict[str, Any]] | None) -> list[Message]:
    """Our transcript with each assistant message's XML tool calls and ``<think>`` block read into
    ``tool_calls`` and ``reasoning_content``, ids paired, our bookkeeping keys dropped: the form
    that becomes Gym's ``function_call`` / ``function_call_output`` / ``reasoning`` items."""
    from posttrain.models.chat_template import split_reasoning

    out: list[Message] = []
    for m in messages:
        m = {k: v for k, v in m.items() if k != SESSION_KEY}
        if m.get("role") == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str):
            reasoning, _ = split_reasoning(m["content"])
            turn = parse_turn(m, tools)
            if turn.parse_error is None:
                m = {"role": "assistant", "content": turn.text}
                if reasoning:
                    m["reasoning_content"] = reasoning
                if turn.calls:
                    m["tool_calls"] = [c.to_openai() for c in turn.calls]
        out.append(m)
    return assign_tool_call_ids(out)

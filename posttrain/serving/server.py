"""Any ``Environment`` as an HTTP resource server that speaks NeMo Gym's contract.

The recipe runs environments as separate services ("resource servers: tasks in, reward out";
docs/recipe.md §2) so they can be developed and scaled apart from the trainer. This module wraps one
in-process environment in a FastAPI app; ``posttrain.serving.remote.RemoteEnvironment`` is the client
that makes such a server look like an in-process environment again. The full contract, with
example bodies, is in docs/env_server.md.

Endpoints (field names follow NeMo Gym's ``BaseVerifyRequest`` / ``BaseVerifyResponse`` /
``ResourcesSeedSessionRequest``):

* ``POST /verify`` — ``{responses_create_params: {input, tools, ...}, response: {output: [...]},
  task: {...}}`` → the same body plus ``reward``, ``reward_components`` and ``reason``. The task
  travels at the top level of the body, as the extra fields of a NeMo Gym dataset row do (NeMo Gym
  passes a row's fields through seed_session and verify unchanged). Instead of the whole task a
  client may send ``responses_create_params.metadata.task_id`` (or top-level ``task_id``) for a task
  this server has already handed out.
* ``POST /seed_session`` — starts (or, for a live id, finds) an episode of a multi-turn environment
  for a task; accepts our body, a NeMo Gym dataset row, or Gym's ``ResourcesSeedSessionRequest``
  (``task_id: {taskset, task_id}``, ``task_data``); answers exactly ``{resources_session_id}`` and
  sets a session cookie so a NeMo Gym agent, which forwards cookies, is routed to its episode. A
  seed of a closed id is rejected (409), as Gym's session contract requires.
* ``POST /<tool_name>`` — NeMo Gym's tool endpoint: the body is the call's arguments, the answer
  the tool observation's text, verbatim (Gym feeds the body to the model), ``X-Episode-Done`` in a
  header; the session comes from the ``X-Session-Id`` header or the cookie. Runs as a one-call
  assistant turn of the session's episode.
* ``POST /close_session`` (idempotent; answers exactly ``{resources_session_id}``),
  ``POST /aggregate_metrics`` and ``GET /reverify_mode`` (``stateless``) — the rest of Gym's
  resource-server routes.
* ``POST /step`` — our extension: one whole assistant message through ``Episode.step`` (what the
  trainer's rollout loop does in process, including simulated-user turns a per-tool endpoint
  cannot return).
* ``GET /tasks?split=&n=&seed=[&format=gym]`` and ``GET /health`` — our extension: tasks as
  ``Task`` dicts, or as NeMo Gym dataset rows with ``format=gym``.

The Responses-API items of ``response.output`` (``message`` with ``output_text`` parts,
``function_call`` with JSON-string ``arguments``, ``function_call_output``, ``reasoning``) and our
OpenAI chat messages are converted by one pure pair, ``messages_to_items`` / ``items_to_messages``.
What ``verify`` grades is the conversation after the task's prompt: the ``input`` messages beyond
the prompt's length (earlier turns of a multi-turn conversation) followed by the ``output`` items.

Malformed requests get 422 with a message naming the field (a body that is not UTF-8, or a string
holding a lone surrogate such as ``"\\ud800"``, included); an environment that crashes on a
well-formed request gets a 500 whose body names the exception (the traceback stays in the log).
Every error is a JSON ``{"detail": ...}``, never a plain-text page. Tool names that equal one of the
endpoints above are shadowed by the endpoint.

What the server reads and keeps is bounded (docs/env_server.md, "Limits"; each bound is a
``create_app`` keyword and a ``posttrain serve-env`` flag): a request body over ``max_body_bytes``
is a 413 before any of it is parsed (by its Content-Length, or counted as it streams in without
one), ``/tasks`` answers at most ``max_tasks_per_request`` tasks (page with ``offset``), and the
sessions and the tasks it remembers are each capped by count and by total size (the JSON size of
the tasks and of what the sessions' steps exchanged), the least recently used dropped first; so is
the table of closed session ids that makes a seed after its close a 409.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Iterator, Literal, Sequence

from fastapi import Body, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Cookie as CookieParam
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from posttrain.envs.base import Environment, Episode, Message, Task, make_env
from posttrain.envs.splits import check_split
from posttrain.engines.openai_compat import arguments_json, assign_tool_call_ids, tool_to_responses
from posttrain.models.chat_template import ToolCallParseError, load_json_bounded

log = logging.getLogger(__name__)

SESSION_COOKIE = "posttrain_session"
SESSION_HEADER = "X-Session-Id"
DONE_HEADER = "X-Episode-Done"
INPUT_ROLES = ("system", "developer", "user")

# Limits (docs/env_server.md, "Limits"): the defaults of create_app's keywords and serve-env's flags
# (LIMIT_FLAGS). Sizes are the JSON size of what is kept, not Python's in-memory size, which is a few
# times larger.
MAX_BODY_BYTES = 1 << 20  # one request body, as sent; the built-in envs' are tens of kB at most
MAX_TASKS_PER_REQUEST = 1_000  # one /tasks answer; ~0.5-5 MB of JSON for the built-in envs
MAX_TASK_INDEX = 100_000  # offset + n of one /tasks request: the env builds every task before it
MAX_SESSIONS = 10_000
MAX_SESSION_BYTES = 64 << 20  # all sessions: their tasks plus what their steps exchanged
MAX_TASKS_KEPT = 20_000
MAX_TASK_BYTES = 64 << 20  # all tasks remembered for task_id look-ups


# --------------------------------------------------------------------------- items <-> messages


def messages_to_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages → Responses-API input/output items (tool-call ids filled in)."""
    items: list[dict[str, Any]] = []
    for i, m in enumerate(assign_tool_call_ids(messages)):
        role = m.get("role")
        content = m.get("content") or ""
        if role in INPUT_ROLES:
            items.append({"type": "message", "role": role, "content": content})
        elif role == "assistant":
            if m.get("reasoning_content") is not None:
                summary = [{"type": "summary_text", "text": m["reasoning_content"]}]
                items.append({"type": "reasoning", "summary": summary})
            refusal = m.get("refusal")
            if content or not (m.get("tool_calls") or refusal):  # an empty answer is still a turn to grade
                text = {"type": "output_text", "text": content, "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [text]})
            if refusal:  # Responses-API refusal part; chat messages carry it in ``refusal``
                parts = [{"type": "refusal", "refusal": refusal}]
                if items and items[-1].get("type") == "message" and items[-1].get("role") == "assistant":
                    items[-1]["content"] += parts
                else:
                    items.append({"type": "message", "role": "assistant", "content": parts})
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call)
                items.append({
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": fn["name"],
                    "arguments": arguments_json(fn.get("arguments", {})),
                })
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": content})
        else:
            raise ValueError(f"message {i}: unknown role {role!r}")
    return items


def _split_refusal(content: Any) -> tuple[Any, str | None]:
    """``content`` without its Responses-API refusal parts, and their text (None when there are none).

    A refusal is not an answer: it goes to the chat message's ``refusal`` field, which no verifier
    reads, so a refused turn grades like an empty one (reward 0) instead of failing the request.
    """
    if not isinstance(content, list):
        return content, None
    refusals = [p for p in content if isinstance(p, dict) and p.get("type") == "refusal"]
    if not refusals:
        return content, None
    for p in refusals:
        if not isinstance(p.get("refusal"), str):
            raise ValueError("a refusal part needs a string 'refusal'")
    rest = [p for p in content if not (isinstance(p, dict) and p.get("type") == "refusal")]
    return rest, "".join(p["refusal"] for p in refusals)


def _text_of(content: Any, where: str) -> str:
    """Text of a message's ``content``: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise ValueError(f"{where}.content[{j}]: expected a text part with a string 'text'")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"{where}.content: expected a string or a list of text parts")


def _arguments_of(raw: Any, where: str) -> Any:
    """Arguments as a dict when they are a JSON object; the raw string otherwise, so the
    environment's own parser sees (and counts) a malformed call rather than a repaired one."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"{where}.arguments: expected a JSON string")
    try:  # bounded: deep nesting or a 5,000-digit number must not raise out of the request
        parsed = load_json_bounded(raw, where) if raw.strip() else {}
    except (json.JSONDecodeError, ToolCallParseError):
        return raw
    return parsed if isinstance(parsed, dict) else raw


def items_to_messages(items: Sequence[Any]) -> list[Message]:
    """Responses-API items → OpenAI chat messages (inverse of ``messages_to_items``).

    Consecutive model items (reasoning, assistant message, function calls) form one assistant
    message, as one model response does; a second reasoning or text item starts the next one.
    Raises ``ValueError`` naming the item for anything malformed.
    """
    messages: list[Message] = []
    current: Message | None = None
    names: dict[str, str] = {}

    def new_assistant() -> Message:
        msg: Message = {"role": "assistant", "content": ""}
        messages.append(msg)
        return msg

    for i, item in enumerate(items):
        where = f"item {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "reasoning":
            parts = item.get("summary") or item.get("content") or []
            text = "".join(_text_of([p], where) for p in parts) if isinstance(parts, list) else None
            if text is None:
                raise ValueError(f"{where}: reasoning 'summary' must be a list of text parts")
            if current is None or current["content"] or current.get("tool_calls") or "reasoning_content" in current:
                current = new_assistant()
            current["reasoning_content"] = text
        elif kind == "message":
            try:
                content, refusal = _split_refusal(item.get("content"))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            role, text = item.get("role"), _text_of(content, where)
            if role == "assistant":
                if current is None or current["content"] or current.get("tool_calls") or "refusal" in current:
                    current = new_assistant()
                current["content"] = text
                if refusal is not None:
                    current["refusal"] = refusal
            elif role in INPUT_ROLES:
                current = None
                messages.append({"role": role, "content": text})
            else:
                raise ValueError(f"{where}: unknown message role {role!r}")
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id") or item.get("id")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}: function_call needs a string 'name'")
            if not isinstance(call_id, str) or not call_id:
                raise ValueError(f"{where}: function_call needs a string 'call_id'")
            if current is None:
                current = new_assistant()
            fn = {"name": name, "arguments": _arguments_of(item.get("arguments", "{}"), where)}
            current.setdefault("tool_calls", []).append({"id": call_id, "type": "function", "function": fn})
            names[call_id] = name
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise ValueError(f"{where}: function_call_output needs a string 'call_id'")
            current = None
            msg: Message = {
                "role": "tool",
                "content": output if isinstance(output, str) else json.dumps(output, ensure_ascii=False),
                "tool_call_id": call_id,
            }
            if call_id in names:
                msg["name"] = names[call_id]
            messages.append(msg)
        else:
            raise ValueError(f"{where}: unsupported item type {kind!r}")
    return messages


def with_item_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Model-written items with the ``id`` (and a message's ``status``) that NeMo Gym's output-item
    models require; input messages (``system``/``user``) need none."""
    out = []
    for k, item in enumerate(items):
        item = dict(item)
        if item["type"] == "message" and item.get("role") == "assistant":
            item.setdefault("id", f"msg_{k}")
            item.setdefault("status", "completed")
        elif item["type"] == "reasoning":
            item.setdefault("id", f"rs_{k}")
        elif item["type"] == "function_call":
            item.setdefault("id", f"fc_{k}")
        out.append(item)
    return out


def task_to_row(task: Task) -> dict[str, Any]:
    """A task as a NeMo Gym dataset row (``responses_create_params`` + our ``task`` field)."""
    params: dict[str, Any] = {
        "input": with_item_ids(messages_to_items(task.messages)),  # earlier assistant turns need ids
        "metadata": {"task_id": task.id},
    }
    if task.tools:
        params["tools"] = [tool_to_responses(t) for t in task.tools]
    return {"responses_create_params": params, "task": task.to_dict()}


def conversation_after_prompt(
    task: Task, input_items: Sequence[Any] | str, output_items: Sequence[Any]
) -> list[Message]:
    """What ``Environment.verify`` grades: input messages beyond the prompt, then the output."""
    if isinstance(input_items, str):
        input_items = [{"type": "message", "role": "user", "content": input_items}]
    earlier = items_to_messages(input_items)[len(task.messages):]
    return earlier + items_to_messages(output_items)


# --------------------------------------------------------------------------- request bodies


class TaskBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    domain: str
    messages: list[dict[str, Any]]
    ground_truth: Any = None
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_task(self) -> Task:
        return Task(**self.model_dump())


class ResponsesCreateParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: list[Any] | str = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    output: list[Any]


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponsesCreateParams
    response: ResponseBody
    task: TaskBody | None = None
    task_id: str | None = None


class GymTaskId(BaseModel):
    """NeMo Gym's ``TaskId``: a task within a run-qualified taskset."""

    model_config = ConfigDict(extra="forbid")
    taskset: str
    task_id: str


class SeedSessionRequest(BaseModel):
    """Three shapes: ours (``task`` or a ``task_id`` string), a NeMo Gym dataset row (an agent's
    ``/run`` forwards the row: ``responses_create_params`` plus the row's fields, ``task`` among
    them), and NeMo Gym's ``ResourcesSeedSessionRequest`` from an Environment Server
    (``resources_session_id``, ``episode_id``, ``task_id: {taskset, task_id}``, ``task_data``: the
    row's fields other than ``responses_create_params``)."""

    model_config = ConfigDict(extra="allow")
    task: TaskBody | None = None
    task_id: str | GymTaskId | None = None
    task_data: dict[str, Any] | None = None
    resources_session_id: str | None = Field(default=None, min_length=1)  # caller-assigned id
    responses_create_params: ResponsesCreateParams | None = None

    def task_body(self) -> TaskBody | None:
        if self.task is not None:
            return self.task
        inner = (self.task_data or {}).get("task")
        if inner is None:
            return None
        try:
            return TaskBody.model_validate(inner)
        except ValueError as e:
            raise HTTPException(422, f"task_data.task: {e}") from None

    def task_ids(self) -> list[str | None]:
        metadata = (self.responses_create_params.metadata if self.responses_create_params else None) or {}
        tid = self.task_id.task_id if isinstance(self.task_id, GymTaskId) else self.task_id
        return [tid, metadata.get("task_id")]


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources_session_id: str
    message: dict[str, Any]


class CloseSessionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    resources_session_id: str


# --------------------------------------------------------------------------- server state


def json_size(obj: Any) -> int:
    """Characters of ``obj`` as (ASCII) JSON: the measure of what the server keeps. ``default=str``
    so an odd value in an episode's ``info`` is measured rather than raising."""
    return len(json.dumps(obj, default=str))


class _Bounded:
    """An LRU map capped by count and by the total of its entries' sizes (oldest dropped first).

    Not locked: ``_State`` holds its lock around every call. The newest entry is always kept, even
    alone over the byte cap, so a large task still gets its session (then everything else goes).
    """

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self.items: OrderedDict[str, Any] = OrderedDict()
        self.sizes: dict[str, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key: object) -> bool:
        return key in self.items

    def get(self, key: str) -> Any:
        return self.items.get(key)

    def pop(self, key: str) -> Any:
        self.bytes -= self.sizes.pop(key, 0)
        return self.items.pop(key, None)

    def put(self, key: str, value: Any, size: int) -> list[Any]:
        """Store ``value`` as the newest entry; answer the values evicted (a replaced one included)."""
        old = self.pop(key)
        self.items[key], self.sizes[key] = value, size
        self.bytes += size
        return ([old] if old is not None else []) + self._evict()

    def grow(self, key: str, extra: int) -> list[Any]:
        """``key`` now holds ``extra`` more bytes and is the most recently used; answer evictions."""
        if key not in self.items:
            return []
        self.sizes[key] += extra
        self.bytes += extra
        self.items.move_to_end(key)
        return self._evict()

    def _evict(self) -> list[Any]:
        out = []
        while len(self.items) > 1 and (len(self.items) > self.max_items or self.bytes > self.max_bytes):
            key = next(iter(self.items))
            out.append(self.pop(key))
        return out


class _Session:
    def __init__(self, episode: Episode | None, task: Task) -> None:
        self.episode = episode
        self.task = task
        self.lock = threading.Lock()  # one step at a time: an episode is a state machine


class _State:
    """Sessions and the tasks this server has handed out, both bounded by count and by bytes
    (least recently used dropped first): a client can otherwise grow the server without limit by
    seeding sessions with large tasks (issue 12, item 17)."""

    def __init__(self, env: Environment, max_sessions: int, max_tasks: int,
                 max_session_bytes: int = MAX_SESSION_BYTES, max_task_bytes: int = MAX_TASK_BYTES) -> None:
        self.env = env
        self.sessions = _Bounded(max_sessions, max_session_bytes)
        self.tasks = _Bounded(max_tasks, max_task_bytes)
        # Ids closed (or closed before they were seeded): NeMo Gym's session contract rejects a seed
        # that arrives after its close, so a retried or racing seed cannot bring a session back.
        # Bounded like the sessions (count and bytes of the ids): a client closing ever new ids,
        # which close_session accepts ahead of their seed, cannot grow it without limit.
        self.closed = _Bounded(max_sessions, max_session_bytes)
        self.lock = threading.Lock()

    def remember(self, tasks: Sequence[Task], sizes: Sequence[int] | None = None) -> None:
        sizes = sizes if sizes is not None else [json_size(t.to_dict()) for t in tasks]
        with self.lock:
            for t, size in zip(tasks, sizes):
                self.tasks.put(t.id, t, size)

    def resolve_task(self, task: TaskBody | None, *task_ids: str | None, remember: bool = False) -> Task:
        if task is not None:
            t = task.to_task()
            if remember:
                self.remember([t])
            return t
        for tid in task_ids:
            if tid is None:
                continue
            with self.lock:
                known = self.tasks.get(tid)
            if known is not None:
                return known
            raise HTTPException(422, f"unknown task_id {tid!r}: send the whole task in 'task'")
        raise HTTPException(422, "no task: send it in 'task' (or a 'task_id' this server handed out)")

    def add_session(self, sid: str, session: _Session, size: int) -> None:
        with self.lock:
            evicted = self.sessions.put(sid, session, size)
        _close_all(evicted)

    def grew(self, sid: str, extra: int) -> None:
        """Session ``sid`` just stepped, exchanging ``extra`` bytes its episode may now hold."""
        with self.lock:
            evicted = self.sessions.grow(sid, extra)
        _close_all(evicted)

    def session(self, sid: str | None) -> _Session:
        if not sid:
            raise HTTPException(400, f"no session: call /seed_session and send its id in {SESSION_HEADER}")
        with self.lock:
            s = self.sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"unknown or closed session {sid!r}")
        return s

    def close(self, sid: str) -> bool:
        with self.lock:
            s = self.sessions.pop(sid)
            self.closed.put(sid, True, json_size(sid))
        _close_all([s] if s is not None else [])
        return s is not None


def _close_all(sessions: Sequence[_Session]) -> None:
    for s in sessions:
        if s.episode is not None:
            s.episode.close()


def safe_text(text: str) -> str:
    """``text`` with any lone surrogate escaped (``\\ud800``): an error message quoting one must
    still encode as UTF-8, or the error itself would become a 500."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _crash(what: str, e: Exception) -> HTTPException:
    log.exception("%s failed", what)
    return HTTPException(500, safe_text(f"{what} failed: {type(e).__name__}: {e}"))


def _step(state: _State, sid: str, message: Message) -> dict[str, Any]:
    session = state.session(sid)
    if session.episode is None:
        raise HTTPException(400, "this session has no episode: the environment is single-turn")
    with session.lock:
        try:
            result = session.episode.step(message)
        except Exception as e:
            raise _crash("Episode.step", e) from None
        out = {
            "observations": result.observations,
            "done": result.done,
            "info": result.info,
            "stats": dict(session.episode.stats),
        }
    # an episode keeps its transcript: count what this step added against the sessions' byte cap
    state.grew(sid, json_size(message) + json_size(result.observations))
    return out


# --------------------------------------------------------------------------- text checks

_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate_at(obj: Any) -> str | None:
    """Where the first string (key or value) holding a lone surrogate is in parsed JSON, or None.

    Python's ``json`` accepts ``"\\ud800"`` (and, from bytes, UTF-8-encoded surrogates), but such a
    string cannot be encoded back to UTF-8: the answer that echoes it, a log line, a tokenizer call
    fails later with a UnicodeEncodeError. Iterative, so a deeply nested body cannot overflow.
    """
    stack: list[tuple[Any, str]] = [(obj, "body")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            m = _SURROGATE.search(value)  # json.loads joins a valid pair into one code point
            if m is not None:
                return f"{where}: lone surrogate U+{ord(m.group()):04X} at character {m.start()}"
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, f"{where}: a key"))
                stack.append((v, f"{where}.{safe_text(str(k))[:40]}"))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
    return None


class _StrictJSONRequest(Request):
    """A request whose JSON body must be valid UTF-8 without lone surrogates (422 otherwise)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            try:
                text = raw.decode("utf-8")  # strict: json.loads(bytes) would let surrogates through
            except UnicodeDecodeError as e:
                raise HTTPException(422, f"request body is not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                                         f"offset {e.start})") from None
            parsed = json.loads(text)  # a JSONDecodeError is FastAPI's usual 422
            bad = _lone_surrogate_at(parsed)
            if bad is not None:
                raise HTTPException(422, f"invalid text in the request: {bad}")
            self._json = parsed
        return self._json


class _StrictJSONRoute(APIRoute):
    """FastAPI's documented way to use a custom ``Request`` class for a route's body parsing."""

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict_handler


class _BodyTooLarge(HTTPException):
    """Raised by ``_BodyLimit``'s receive while a body streams in past the bound. An HTTPException, so
    FastAPI's body reading passes it on (it turns other errors into a 400) and it answers a JSON 413."""


class _BodyLimit:
    """ASGI middleware: a request whose body is over ``max_bytes`` gets a 413 (one line of JSON,
    ``{"detail": ...}``) before any of it is parsed. A Content-Length over the bound is answered at
    once, without reading the body; a body without one (chunked) is counted as it is read and
    refused at the piece that crosses the bound, so no more than ``max_bytes`` (plus one piece as the
    server hands it over) is ever held. The unread rest is drained by the server, which keeps the connection usable."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def detail(self, declared: int | None) -> str:
        size = f"{declared} bytes" if declared is not None else f"over {self.max_bytes} bytes"
        return (f"request body too large: {size}, more than the {self.max_bytes} bytes this server "
                "accepts (posttrain serve-env --max-body-bytes)")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for key, value in scope.get("headers") or []:
            if key.lower() == b"content-length":
                with contextlib.suppress(ValueError):  # the HTTP parser rejects malformed ones first
                    declared = int(value)
        if declared is not None and declared > self.max_bytes:
            await JSONResponse({"detail": self.detail(declared)}, status_code=413)(scope, receive, send)
            return
        seen, started = 0, False

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge(413, self.detail(None))
            return message

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _BodyTooLarge as e:  # read outside a route's body parsing (normally FastAPI answers it)
            if started:
                raise
            await JSONResponse({"detail": e.detail}, status_code=413)(scope, receive, send)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    """Catch-all: whatever escapes an endpoint (or its answer's serialization) is a JSON 500 naming
    the exception, never Starlette's plain-text "Internal Server Error"."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": safe_text(f"internal error: {type(exc).__name__}: {exc}")}, status_code=500)


def _session_task(state: _State, sid: str | None) -> Task | None:
    """The task of the session ``sid`` names (NeMo Gym's verify carries the session cookie)."""
    with state.lock:
        s = state.sessions.get(sid) if sid else None
    return s.task if s is not None and s.task.id else None


def _seed(state: _State, body: SeedSessionRequest) -> str:
    """Start (or find) the session a ``/seed_session`` names; its id.

    NeMo Gym's contract (``check_resources_session_contract``): a repeated seed of a live id returns
    that session unchanged (no second episode), and a seed of an id that was closed, or closed
    before it was ever seeded, is rejected (409), so a late or retried seed cannot recreate it.
    """
    env = state.env
    sid = body.resources_session_id
    task_body, ids = body.task_body(), body.task_ids()
    with state.lock:
        if sid is not None and sid in state.closed:
            raise HTTPException(409, f"session {sid!r} was closed; seed a new resources_session_id")
        live = state.sessions.get(sid) if sid is not None else None
    if live is not None:
        named = task_body.id if task_body is not None else ids[0] if isinstance(body.task_id, str) else None
        if named is not None and live.task.id and named != live.task.id:
            raise HTTPException(409, f"session {sid!r} is bound to task {live.task.id!r}, not {named!r}")
        return sid
    gym_id_only = isinstance(body.task_id, GymTaskId) and task_body is None and ids[1] is None
    if env.multi_turn or task_body is not None or (any(ids) and not gym_id_only):
        task = state.resolve_task(task_body, *ids, remember=True)
    else:  # NeMo Gym agents seed every environment, single-turn ones too; the task is not needed
        with state.lock:
            known = state.tasks.get(ids[0]) if ids[0] else None
        task = known or Task(id="", domain=env.domain, messages=[])
    try:
        episode = env.start_episode(task) if env.multi_turn else None
    except Exception as e:
        raise _crash("Environment.start_episode", e) from None
    sid = sid or uuid.uuid4().hex
    with state.lock:
        closed, live = sid in state.closed, sid in state.sessions
    if closed or live:  # a concurrent seed or close of the same id won
        if episode is not None:
            episode.close()
        if closed:
            raise HTTPException(409, f"session {sid!r} was closed; seed a new resources_session_id")
        return sid
    state.add_session(sid, _Session(episode, task), json_size(task.to_dict()))
    return sid


def tool_response(out: dict[str, Any]) -> Response:
    """What NeMo Gym's agent feeds the model for one tool call: the body, verbatim, as the
    ``function_call_output``. So the body is the tool observation's text exactly as our own rollout
    loop puts it in the conversation (not a JSON envelope around it); whether the episode is done
    travels in the ``X-Episode-Done`` header. Observations that are not tool outputs (a simulated
    user's reply) cannot reach the model through this endpoint; ``/step`` returns them."""
    tool_obs = [o for o in out["observations"] if o.get("role") == "tool"] or out["observations"]
    text = "\n".join(str(o.get("content") or "") for o in tool_obs)
    return Response(
        content=text.encode("utf-8"),
        media_type="text/plain; charset=utf-8",
        headers={DONE_HEADER: "true" if out["done"] else "false"},
    )


def gym_aggregate_metrics(verify_responses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """NeMo Gym's ``AggregateMetrics`` for a batch of verify responses: per task (grouped by
    ``_ng_task_index``) and overall mean / max / min / median / std of ``reward`` and of every
    reward component, with masked samples (``mask_sample``) left out of the statistics and counted."""
    import statistics

    def stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        series: dict[str, list[float]] = {}
        for r in rows:
            values = {"reward": r.get("reward"), **(r.get("reward_components") or {})}
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    series.setdefault(k, []).append(float(v))
        out: dict[str, Any] = {}
        for k, vs in series.items():
            out.update({
                f"mean/{k}": statistics.fmean(vs), f"max/{k}": max(vs), f"min/{k}": min(vs),
                f"median/{k}": statistics.median(vs), f"std/{k}": statistics.stdev(vs) if len(vs) > 1 else 0.0,
            })
        return out

    scored = [r for r in verify_responses if not r.get("mask_sample")]
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in scored:
        groups.setdefault(r.get("_ng_task_index", 0), []).append(r)
    group_level = [
        {"_ng_task_index": k, **stats(rows), "num_rollouts": len(rows)}
        for k, rows in sorted(groups.items(), key=lambda kv: str(kv[0]))
    ]
    agent = {**stats(scored), "num_rollouts": len(verify_responses), "num_masked": len(verify_responses) - len(scored)}
    key = {k: agent[k] for k in ("mean/reward",) if k in agent}
    return {"group_level_metrics": group_level, "agent_metrics": agent, "key_metrics": key}


def add_gym_routes(app: FastAPI, state: _State) -> None:
    """NeMo Gym resource-server routes beyond the session and verify ones."""

    @app.post("/aggregate_metrics")
    def aggregate_metrics(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        rows = body.get("verify_responses")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise HTTPException(422, "verify_responses: expected a list of verify responses (objects)")
        return gym_aggregate_metrics(rows)

    @app.get("/reverify_mode")
    def reverify_mode() -> str:
        # Stateless: /verify needs nothing the server remembers (the task travels in the body), so
        # NeMo Gym may re-verify stored rollouts against a fresh server.
        return "stateless"


def create_app(
    env: Environment,
    max_sessions: int = MAX_SESSIONS,
    max_tasks: int = MAX_TASKS_KEPT,
    *,
    max_session_bytes: int = MAX_SESSION_BYTES,
    max_task_bytes: int = MAX_TASK_BYTES,
    max_tasks_per_request: int = MAX_TASKS_PER_REQUEST,
    max_task_index: int = MAX_TASK_INDEX,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """A FastAPI app serving ``env``. Endpoints are plain (sync) functions: FastAPI runs them in its
    thread pool, so a slow verifier does not block the event loop. The limits (docs/env_server.md,
    "Limits") must be whole numbers of at least 1; ``app.state.limits`` holds them."""
    limits = dict(max_sessions=max_sessions, max_tasks=max_tasks, max_session_bytes=max_session_bytes,
                  max_task_bytes=max_task_bytes, max_tasks_per_request=max_tasks_per_request,
                  max_task_index=max_task_index, max_body_bytes=max_body_bytes)
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"create_app: {key} must be a whole number of at least 1, got {value!r}")
    app = FastAPI(title=f"posttrain environment {env.name!r}")
    app.router.route_class = _StrictJSONRoute  # before any route is added: every body is checked
    app.add_exception_handler(Exception, _unhandled)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)  # before routing and any parsing
    state = _State(env, max_sessions, max_tasks, max_session_bytes, max_task_bytes)
    app.state.posttrain = state
    app.state.limits = limits

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "env": env.name,
            "domain": env.domain,
            "multi_turn": env.multi_turn,
            "sessions": len(state.sessions),
            "session_bytes": state.sessions.bytes,
            "max_tasks_per_request": max_tasks_per_request,
            "max_body_bytes": max_body_bytes,
        }

    @app.get("/tasks")
    def tasks(
        split: str = "train",
        n: int | None = Query(default=None, ge=0),
        seed: int = 0,
        format: Literal["posttrain", "gym"] = "posttrain",
        offset: int = Query(default=0, ge=0),
    ) -> dict[str, Any]:
        try:  # train, dev or test (envs/splits.py); the old "validation" gets the line saying which
            check_split(split)
        except ValueError as e:
            raise HTTPException(422, f"split: {e}") from None
        # Bounded: n=100,000 once answered 44 MB and kept 150 MB (issue 12, item 17). Larger lists
        # come in pages: tasks [offset, offset + n) of env.tasks(split, offset + n, seed), which is
        # the same list because environments build tasks in a fixed order (a prefix is stable).
        if n is not None and n > max_tasks_per_request:
            raise HTTPException(422, f"n={n} is more than the {max_tasks_per_request} tasks one request may "
                                     "ask for: ask for pages with offset (RemoteEnvironment.tasks does)")
        if n is not None and offset + n > max_task_index:
            raise HTTPException(422, f"offset + n = {offset + n} is beyond task {max_task_index}, the deepest "
                                     "a request may reach")
        try:
            # n omitted: the environment's own list, answered a page at a time
            got = env.tasks(split, None if n is None else offset + n, seed)
        except Exception as e:
            raise _crash("Environment.tasks", e) from None
        page = got[offset: offset + (n if n is not None else max_tasks_per_request)]
        next_offset = offset + len(page) if n is None and offset + len(page) < len(got) else None
        del got
        dicts = [t.to_dict() for t in page]
        state.remember(page, [json_size(d) for d in dicts])
        if format == "gym":
            return {"rows": [task_to_row(t) for t in page], "next_offset": next_offset}
        return {"tasks": dicts, "next_offset": next_offset}

    @app.post("/verify")
    def verify(body: VerifyRequest, posttrain_session: str | None = CookieParam(default=None)) -> dict[str, Any]:
        metadata = body.responses_create_params.metadata or {}
        task = _session_task(state, posttrain_session) if body.task is None and not (
            body.task_id or metadata.get("task_id")) else None
        task = task or state.resolve_task(body.task, body.task_id, metadata.get("task_id"))
        try:
            messages = conversation_after_prompt(task, body.responses_create_params.input, body.response.output)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        try:
            result = env.verify(task, messages)
        except Exception as e:
            raise _crash("Environment.verify", e) from None
        return {
            **body.model_dump(mode="json", exclude_unset=True),  # the body as sent: no defaults added
            "reward": result.reward,
            "reward_components": result.components,
            "reason": result.reason,
        }

    @app.post("/seed_session")
    def seed_session(body: SeedSessionRequest, response: Response) -> dict[str, Any]:
        sid = _seed(state, body)
        response.set_cookie(SESSION_COOKIE, sid)
        return {"resources_session_id": sid}  # exactly NeMo Gym's ResourcesSeedSessionResponse

    @app.post("/step")
    def step(body: StepRequest) -> dict[str, Any]:
        if body.message.get("role") != "assistant":
            raise HTTPException(422, "message.role must be 'assistant'")
        return _step(state, body.resources_session_id, body.message)

    @app.post("/close_session")
    def close_session(body: CloseSessionRequest) -> dict[str, Any]:
        state.close(body.resources_session_id)  # idempotent; an unknown id is closed ahead of its seed
        return {"resources_session_id": body.resources_session_id}  # NeMo Gym's ResourcesCloseSessionResponse

    add_gym_routes(app, state)  # before the tool catch-all, which would shadow them

    @app.post("/{tool_name}")
    def call_tool(
        tool_name: str,
        arguments: dict[str, Any] = Body(default_factory=dict),
        x_session_id: str | None = Header(default=None),
        posttrain_session: str | None = CookieParam(default=None),
    ) -> Response:
        sid = x_session_id or posttrain_session
        call = {"type": "function", "function": {"name": tool_name, "arguments": arguments}}
        out = _step(state, sid, {"role": "assistant", "content": "", "tool_calls": [call]})
        return tool_response(out)

    return app


# --------------------------------------------------------------------------- running it


@contextlib.contextmanager
def running_server(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve an ASGI app from a background thread; yields its base URL, stops on exit.

    Port 0 picks a free port: the socket is bound here and handed to uvicorn, so there is no race
    between finding a free port and using it. For tests and for running an environment next to a
    trainer in one process.
    """
    import uvicorn

    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto says
    # TCP, and without it every response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {host}:{sock.getsockname()[1]} did not start")
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def serve(name: str, host: str = "127.0.0.1", port: int = 8000, *, limits: dict[str, int] | None = None,
          **env_kwargs: Any) -> None:
    """Build the registered environment ``name`` and serve it until interrupted; ``limits``: keywords
    of ``create_app`` (``max_body_bytes=``, ...), its defaults for the rest."""
    import uvicorn

    uvicorn.run(create_app(make_env(name, **env_kwargs), **(limits or {})), host=host, port=port)

"""Any ``Environment`` as an HTTP resource server that speaks NeMo Gym's contract.

The recipe runs environments as separate services ("resource servers: tasks in, reward out";
docs/recipe.md §2) so they can be developed and scaled apart from the trainer. This module wraps one
in-process environment in a FastAPI app; ``posttrain.envs.remote.RemoteEnvironment`` is the client
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
* ``POST /seed_session`` — starts an episode of a multi-turn environment for a task; returns
  ``resources_session_id`` and the task's tools (Responses-API form), and sets a session cookie so a
  NeMo Gym agent, which forwards cookies, is routed to its episode.
* ``POST /<tool_name>`` — NeMo Gym's tool endpoint: the body is the call's arguments, the answer
  ``{"output": <tool observation>, "done": bool}``; the session comes from the ``X-Session-Id``
  header or the cookie. Runs as a one-call assistant turn of the session's episode.
* ``POST /step`` and ``POST /close_session`` — our extension: one whole assistant message through
  ``Episode.step`` (what the trainer's rollout loop does in process, including simulated-user turns
  a per-tool endpoint cannot return), and releasing an episode.
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

What the server keeps is bounded (docs/env_server.md, "Limits"): ``/tasks`` answers at most
``max_tasks_per_request`` tasks (page with ``offset``), and the sessions and the tasks it remembers
are each capped by count and by total size (the JSON size of the tasks and of what the sessions'
steps exchanged), the least recently used dropped first.
"""

from __future__ import annotations

import argparse
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
from posttrain.engines.openai_compat import arguments_json, assign_tool_call_ids, tool_to_responses
from posttrain.models.chat_template import ToolCallParseError, load_json_bounded

log = logging.getLogger(__name__)

SESSION_COOKIE = "posttrain_session"
SESSION_HEADER = "X-Session-Id"
INPUT_ROLES = ("system", "developer", "user")

# Limits (docs/env_server.md, "Limits"). Sizes are the JSON size of what is kept, not Python's
# in-memory size, which is a few times larger.
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
            if content or not m.get("tool_calls"):  # an empty answer is still a turn to grade
                text = {"type": "output_text", "text": content, "annotations": []}
                items.append({"type": "message", "role": "assistant", "content": [text]})
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
            role, text = item.get("role"), _text_of(item.get("content"), where)
            if role == "assistant":
                if current is None or current["content"] or current.get("tool_calls"):
                    current = new_assistant()
                current["content"] = text
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


def task_to_row(task: Task) -> dict[str, Any]:
    """A task as a NeMo Gym dataset row (``responses_create_params`` + our ``task`` field)."""
    params: dict[str, Any] = {
        "input": messages_to_items(task.messages),
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


class SeedSessionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    task: TaskBody | None = None
    task_id: str | None = None
    resources_session_id: str | None = None  # caller-assigned id, as in ResourcesSeedSessionRequest
    responses_create_params: ResponsesCreateParams | None = None


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


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    """Catch-all: whatever escapes an endpoint (or its answer's serialization) is a JSON 500 naming
    the exception, never Starlette's plain-text "Internal Server Error"."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": safe_text(f"internal error: {type(exc).__name__}: {exc}")}, status_code=500)


def create_app(
    env: Environment,
    max_sessions: int = MAX_SESSIONS,
    max_tasks: int = MAX_TASKS_KEPT,
    *,
    max_session_bytes: int = MAX_SESSION_BYTES,
    max_task_bytes: int = MAX_TASK_BYTES,
    max_tasks_per_request: int = MAX_TASKS_PER_REQUEST,
) -> FastAPI:
    """A FastAPI app serving ``env``. Endpoints are plain (sync) functions: FastAPI runs them in its
    thread pool, so a slow verifier does not block the event loop."""
    app = FastAPI(title=f"posttrain environment {env.name!r}")
    app.router.route_class = _StrictJSONRoute  # before any route is added: every body is checked
    app.add_exception_handler(Exception, _unhandled)
    state = _State(env, max_sessions, max_tasks, max_session_bytes, max_task_bytes)
    app.state.posttrain = state

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
        }

    @app.get("/tasks")
    def tasks(
        split: Literal["train", "validation"] = "train",
        n: int | None = Query(default=None, ge=0),
        seed: int = 0,
        format: Literal["posttrain", "gym"] = "posttrain",
        offset: int = Query(default=0, ge=0),
    ) -> dict[str, Any]:
        # Bounded: n=100,000 once answered 44 MB and kept 150 MB (issue 12, item 17). Larger lists
        # come in pages: tasks [offset, offset + n) of env.tasks(split, offset + n, seed), which is
        # the same list because environments build tasks in a fixed order (a prefix is stable).
        if n is not None and n > max_tasks_per_request:
            raise HTTPException(422, f"n={n} is more than the {max_tasks_per_request} tasks one request may "
                                     "ask for: ask for pages with offset (RemoteEnvironment.tasks does)")
        if n is not None and offset + n > MAX_TASK_INDEX:
            raise HTTPException(422, f"offset + n = {offset + n} is beyond task {MAX_TASK_INDEX}, the deepest "
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
    def verify(body: VerifyRequest) -> dict[str, Any]:
        metadata = body.responses_create_params.metadata or {}
        task = state.resolve_task(body.task, body.task_id, metadata.get("task_id"))
        try:
            messages = conversation_after_prompt(task, body.responses_create_params.input, body.response.output)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        try:
            result = env.verify(task, messages)
        except Exception as e:
            raise _crash("Environment.verify", e) from None
        return {
            **body.model_dump(mode="json"),
            "reward": result.reward,
            "reward_components": result.components,
            "reason": result.reason,
        }

    @app.post("/seed_session")
    def seed_session(body: SeedSessionRequest, response: Response) -> dict[str, Any]:
        metadata = (body.responses_create_params.metadata if body.responses_create_params else None) or {}
        if env.multi_turn or body.task is not None or body.task_id or metadata.get("task_id"):
            task = state.resolve_task(body.task, body.task_id, metadata.get("task_id"), remember=True)
        else:  # NeMo Gym agents seed every environment, single-turn ones too
            task = Task(id="", domain=env.domain, messages=[])
        try:
            episode = env.start_episode(task) if env.multi_turn else None
        except Exception as e:
            raise _crash("Environment.start_episode", e) from None
        sid = body.resources_session_id or uuid.uuid4().hex
        state.add_session(sid, _Session(episode, task), json_size(task.to_dict()))
        response.set_cookie(SESSION_COOKIE, sid)
        return {
            "resources_session_id": sid,
            "tools": [tool_to_responses(t) for t in task.tools or []],
        }

    @app.post("/step")
    def step(body: StepRequest) -> dict[str, Any]:
        if body.message.get("role") != "assistant":
            raise HTTPException(422, "message.role must be 'assistant'")
        return _step(state, body.resources_session_id, body.message)

    @app.post("/close_session")
    def close_session(body: CloseSessionRequest) -> dict[str, Any]:
        return {"resources_session_id": body.resources_session_id, "closed": state.close(body.resources_session_id)}

    @app.post("/{tool_name}")
    def call_tool(
        tool_name: str,
        arguments: dict[str, Any] = Body(default_factory=dict),
        x_session_id: str | None = Header(default=None),
        posttrain_session: str | None = CookieParam(default=None),
    ) -> dict[str, Any]:
        sid = x_session_id or posttrain_session
        call = {"type": "function", "function": {"name": tool_name, "arguments": arguments}}
        out = _step(state, sid, {"role": "assistant", "content": "", "tool_calls": [call]})
        tool_obs = [o for o in out["observations"] if o.get("role") == "tool"] or out["observations"]
        return {
            "output": "\n".join(str(o.get("content") or "") for o in tool_obs),
            "done": out["done"],
            "observations": out["observations"],
        }

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


def serve(name: str, host: str = "127.0.0.1", port: int = 8000, **env_kwargs: Any) -> None:
    """Build the registered environment ``name`` and serve it until interrupted."""
    import uvicorn

    uvicorn.run(create_app(make_env(name, **env_kwargs)), host=host, port=port)


def parse_env_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["n_docs=5", "name=x"]`` → ``{"n_docs": 5, "name": "x"}``: values are JSON when they parse
    as JSON, strings otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg {pair!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``posttrain serve-env``."""
    parser.add_argument("name", help="registered environment name, e.g. math or workplace")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    parser.add_argument(
        "--env-arg", action="append", default=[], metavar="KEY=VALUE",
        help="keyword argument for the environment's constructor (repeatable; JSON values)",
    )


def run(args: argparse.Namespace) -> None:
    serve(args.name, host=args.host, port=args.port, **parse_env_args(args.env_arg))

"""A ``Generator`` over any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang, ...).

Used for judges, user simulators and teachers that live behind an HTTP endpoint, and for a policy
served by vLLM. One request per prompt (``n`` samples each), sent concurrently from a small thread
pool, so ``generate`` keeps the batched signature of the ``Generator`` protocol.

What comes back is mapped onto our text conventions, so everything downstream (verifiers,
``parse_assistant``) sees the same thing it sees from the in-process engine:

* a server-side reasoning parser's ``reasoning_content`` (or ``reasoning``) goes back inside a
  ``<think>`` block in front of the answer;
* server-parsed ``tool_calls`` are written back as our XML tool calls, values escaped by the
  template's rule so that parsing them with the tool schemas gives back exactly the server's
  arguments (a string "2022" stays a string, "</tool_call>" in a value stays text); a call whose
  arguments are not valid JSON (or nest too deep, or whose name cannot be written) is written so
  that ``parse_tool_calls`` rejects it (the model made a malformed call, and the environment must
  count it, not have it silently repaired);
* ``finish_reason`` "length" stays "length"; everything else ("stop", "tool_calls", ...) is "stop";
* log-probs are returned when the server gives them (``logprobs: true``); token ids only when the
  server writes tokens as ``token_id:<n>`` (vLLM's ``return_tokens_as_token_ids``), because
  re-encoding decoded text would not give the sampled ids back.

Transport errors, 429 and 5xx are retried with exponential backoff; any other failure raises
``RemoteCallError`` naming the URL and the server's answer. ``request_json`` is shared with the
remote-environment client (posttrain/serving/remote.py).

Reasoning off (``SamplingParams.reasoning=False``) is sent as ``chat_template_kwargs:
{"enable_thinking": false}`` (the vLLM / SGLang convention); it is only sent when reasoning is off so
servers that reject unknown fields still work for the default.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import httpx

from posttrain.models.chat_template import (
    THINK_CLOSE, THINK_OPEN, ToolCallParseError, escape_value, format_tool_call, load_json_bounded,
)
from posttrain.engines.base import Completion, FinishReason, Message, SamplingParams

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RemoteCallError(RuntimeError):
    """An HTTP call to a model or environment server failed for good (after retries)."""


# --------------------------------------------------------------------------- HTTP with retries


def request_json(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    json_body: Any = None,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    max_retries: int = 3,
    backoff_s: float = 0.5,
    idempotent: bool = True,
) -> Any:
    """One JSON request; retried on connection errors, timeouts, 408/429/5xx; JSON answer back.

    A 4xx other than 408/429 is the caller's fault and is not retried. The error names the URL and
    quotes the start of the server's answer so a wrong field is visible without a debugger.
    ``idempotent=False`` (an episode step: running it twice would run its tool calls twice) retries
    only failures to connect, where the server cannot have seen the request.
    """
    last = ""
    for attempt in range(max_retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            resp = client.request(method, url, json=json_body, params=params, headers=headers)
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
            log.warning("%s %s attempt %d: %s", method, url, attempt + 1, last)
            if idempotent or isinstance(e, httpx.ConnectError):
                continue
            raise RemoteCallError(f"{method} {url} failed (not retried: not idempotent): {last}") from None
        if resp.status_code in RETRY_STATUS and idempotent:
            last = f"HTTP {resp.status_code}: {resp.text[:500]}"
            log.warning("%s %s attempt %d: %s", method, url, attempt + 1, last)
            continue
        if resp.status_code >= 400:
            raise RemoteCallError(f"{method} {url} returned HTTP {resp.status_code}: {resp.text[:500]}")
        try:
            return resp.json()
        except ValueError:
            raise RemoteCallError(f"{method} {url} returned non-JSON: {resp.text[:200]!r}") from None
    raise RemoteCallError(f"{method} {url} failed after {max_retries + 1} attempts; last error: {last}")


# --------------------------------------------------------------------------- message conventions


def tool_to_chat(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema in chat-completions form ``{"type": "function", "function": {...}}``.

    Accepts the flat Responses-API form (``{"type": "function", "name": ..., "parameters": ...}``)
    too, so tools from either API can be sent to a chat-completions server. ``strict`` is kept only
    when true: false is the chat API's default (the Responses API's default is true, which is why
    ``tool_to_responses`` always writes it).
    """
    if "function" in tool:
        return tool
    fn = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
    if tool.get("strict"):
        fn["strict"] = True
    return {"type": "function", "function": fn}


def tool_to_responses(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema in the flat Responses-API form that NeMo Gym datasets use (inverse of
    ``tool_to_chat``).

    ``strict`` and ``parameters`` are always present: the Responses API (and NeMo Gym's
    ``FunctionToolParam``, which rejects a tool without them) requires both. ``strict`` defaults to
    false, the chat API's default, because our schemas are not written for strict mode (which needs
    ``additionalProperties: false`` and every property required).
    """
    flat = tool if "function" not in tool else {"type": "function", **tool["function"]}
    if "strict" in flat and "parameters" in flat:
        return flat
    return {**flat, "parameters": flat.get("parameters"), "strict": bool(flat.get("strict", False))}


def assign_tool_call_ids(messages: Sequence[Message]) -> list[Message]:
    """Copies of ``messages`` where every assistant tool call has an ``id`` and every tool message a
    ``tool_call_id``.

    Our transcripts may omit ids (the XML tool-call format has none), but the OpenAI chat and
    Responses APIs pair a call and its output by id. Missing call ids become ``call_<k>`` (k counts
    calls in the conversation); a tool message without an id answers the oldest unanswered call of
    the preceding assistant turn, which is the order our rollout loop appends observations in.
    """
    out: list[Message] = []
    pending: list[str] = []
    k = 0
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            pending = []
            for call in m["tool_calls"]:
                call = dict(call)
                if not call.get("id"):
                    call["id"] = f"call_{k}"
                k += 1
                pending.append(call["id"])
                calls.append(call)
            m["tool_calls"] = calls
        elif m.get("role") == "tool":
            if m.get("tool_call_id"):
                if m["tool_call_id"] in pending:
                    pending.remove(m["tool_call_id"])
            elif pending:
                m["tool_call_id"] = pending.pop(0)
            else:
                m["tool_call_id"] = f"call_{k}"
                k += 1
        out.append(m)
    return out


def arguments_json(arguments: Any) -> str:
    """Tool-call arguments as the JSON string both OpenAI APIs carry (raw strings pass through)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def to_chat_messages(messages: Sequence[Message]) -> list[Message]:
    """Our messages in the shape a chat-completions server accepts: ids paired, arguments as JSON
    strings, and our extra fields (``reasoning_content``) left out, since the server's template
    drops earlier reasoning anyway and strict servers reject unknown fields."""
    out: list[Message] = []
    for m in assign_tool_call_ids(messages):
        msg: Message = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c.get("function", c)["name"],
                        "arguments": arguments_json(c.get("function", c).get("arguments", {})),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            msg["tool_call_id"] = m["tool_call_id"]
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def _tool_call_text(call: dict[str, Any]) -> str:
    """One server-parsed call in our XML format. Values go through ``format_tool_call``'s escaping,
    so parsing the text with the tool schemas gives back exactly the server's arguments."""
    fn = call.get("function", call)
    name = fn.get("name")
    args = fn.get("arguments") or "{}"
    if isinstance(args, str):
        try:
            args = load_json_bounded(args, str(name)[:80])
        except (json.JSONDecodeError, ToolCallParseError):
            args = None
    if isinstance(args, dict):
        try:
            return format_tool_call(name, args)
        except ToolCallParseError:  # a name that cannot be written: fall through to the malformed form
            pass
    # Raw (escaped) text inside <function> without a <parameter> tag: parse_tool_calls rejects it as
    # "stray_text_in_function" (or "bad_function_name"), so the malformed call is counted downstream
    # rather than silently repaired. The name is reduced to name characters so it cannot inject tags.
    safe_name = re.sub(r"[^\w.\-]", "?", str(name)) or "?"
    raw = fn.get("arguments")
    raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
    return f"<tool_call>\n<function={safe_name}>\n{escape_value(raw_text)}\n</function>\n</tool_call>"


def completion_text(message: dict[str, Any]) -> str:
    """The assistant text in our format from a chat-completions response message."""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    parts = [f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n"] if reasoning else []
    body = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        body = (body + "\n" if body else "") + _tool_call_text(call)
    parts.append(body)
    return "".join(parts)


_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")


def parse_logprobs(logprobs: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    """(token ids, log-probs) from a choice's ``logprobs``; ids only if every token is written as
    ``token_id:<n>``."""
    content = (logprobs or {}).get("content") or []
    lps = [float(t["logprob"]) for t in content]
    matches = [_TOKEN_ID_RE.match(str(t.get("token", ""))) for t in content]
    ids = [int(m.group(1)) for m in matches if m] if content and all(matches) else []
    return ids, lps


def _finish_reason(reason: str | None) -> FinishReason:
    return "length" if reason == "length" else "stop"


# --------------------------------------------------------------------------- generator


class OpenAIGenerator:
    """``Generator`` protocol over an OpenAI-compatible chat-completions endpoint.

    ``base_url`` ends in ``/v1``; ``model`` defaults to the first model the server lists.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        logprobs: bool = True,
        return_token_ids: bool = False,
        max_concurrency: int = 8,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._model = model
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0)
        )

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> "OpenAIGenerator":
        """``http://host:port/v1`` or ``http://host:port/v1#model-name``."""
        url, _, model = spec.partition("#")
        return cls(url, model or None, **kwargs)

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        return request_json(
            self._client, method, f"{self.base_url}{path}", json_body=body,
            max_retries=self.max_retries, backoff_s=self.backoff_s,
        )

    @property
    def model(self) -> str:
        if self._model is None:
            listed = self._request("GET", "/models").get("data") or []
            if not listed:
                raise RemoteCallError(f"GET {self.base_url}/models lists no model; give one as URL#model")
            self._model = str(listed[0]["id"])
        return self._model

    def _body(
        self,
        messages: Sequence[Message],
        params: SamplingParams,
        tools: Sequence[dict] | None,
        n: int,
        seed: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_chat_messages(messages),
            "n": n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        if tools:
            body["tools"] = [tool_to_chat(t) for t in tools]
        if self.logprobs:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_tokens_as_token_ids"] = True
        if not params.reasoning:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    def _complete(
        self, messages: Sequence[Message], params: SamplingParams, tools: Sequence[dict] | None,
        seed: int | None = None,
    ) -> list[Completion]:
        out: list[Completion] = []
        base = params.seed if seed is None else seed
        # Some servers ignore ``n`` and return one choice; ask again for the rest (with a shifted
        # seed, or the same seed would give the same sample back).
        while len(out) < params.n:
            seed = None if base is None else base + len(out)
            body = self._body(messages, params, tools, params.n - len(out), seed)
            resp = self._request("POST", "/chat/completions", body)
            choices = resp.get("choices") or []
            if not choices:
                raise RemoteCallError(f"POST {self.base_url}/chat/completions returned no choices: {str(resp)[:300]}")
            for ch in sorted(choices, key=lambda c: c.get("index", 0)):
                ids, lps = parse_logprobs(ch.get("logprobs"))
                out.append(
                    Completion(
                        text=completion_text(ch.get("message") or {}),
                        token_ids=ids,
                        logprobs=lps,
                        finish_reason=_finish_reason(ch.get("finish_reason")),
                    )
                )
        return out[: params.n]

    def generate(
        self,
        prompts: Sequence[Sequence[Message]],
        params: SamplingParams,
        tools: Sequence[Sequence[dict[str, Any]] | None] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``seeds[i]`` (optional) is prompt i's own seed, sent instead of ``params.seed``: two
        prompts with the same text and one shared seed would get the same sample back from a server
        that honours seeds (vLLM does), which makes two "independent" samples agree by construction."""
        tools_per_prompt = list(tools) if tools is not None else [None] * len(prompts)
        if len(tools_per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(tools_per_prompt)} tool lists")
        seeds_per_prompt = list(seeds) if seeds is not None else [None] * len(prompts)
        if len(seeds_per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds_per_prompt)} seeds")
        if not prompts:
            return []
        _ = self.model  # resolve once, before the threads race to
        workers = max(1, min(self.max_concurrency, len(prompts)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda p, t, s: self._complete(p, params, t, s),
                                 prompts, tools_per_prompt, seeds_per_prompt))

    def close(self) -> None:
        self._client.close()

"""The Nemotron-style chat template: roles, reasoning blocks, XML tool calls, training masks.

Layout of one rendered conversation (ChatML framing, which the embedded SmolLM2 tokenizer has as
special tokens)::

    <|im_start|>system
    {system prompt}

    # Tools
    <tools>
    {"type": "function", "function": {...}}        (one JSON schema per line)
    </tools>
    ...how to call them...<|im_end|>
    <|im_start|>user
    {text}<|im_end|>
    <|im_start|>assistant
    <think>
    {reasoning}
    </think>
    {answer}
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call><|im_end|>
    <|im_start|>tool
    {tool output}<|im_end|>

Why XML tool calls: a parameter value is written raw between tags, so code and quotes inside
arguments need no JSON escaping (the recipe's reason). Non-string values are written as JSON and
parsed back with ``json.loads``; anything that is not valid JSON stays a string.

Reasoning control (docs/recipe.md §1):
* reasoning off: the assistant turn opens with an empty ``<think></think>`` block, so the model
  learns to skip it when the system prompt says ``/no_think``;
* budget: ``truncate_reasoning`` cuts a trace to a token budget and closes the block, and the
  original answer follows;
* multi-turn: reasoning of assistant turns *before the last user message* is dropped when
  rendering; reasoning inside the current turn (e.g. between tool calls) is kept.

``render`` returns token ids and a 0/1 mask of the tokens the model is trained on: the content of
assistant turns, including their closing ``<|im_end|>`` so the model learns to stop. Each message
is tokenized separately and concatenated, so the mask is exact (no offset mapping guesswork) and
the token ids of a prompt are a prefix of the ids of the full conversation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
NO_THINK_FLAG = "/no_think"
DEFAULT_SYSTEM = "You are a helpful assistant."
TOOL_INSTRUCTIONS = (
    "To call a function, reply with one or more blocks of this form and nothing after them:\n"
    "<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>"
)

Message = dict[str, Any]


class ToolCallParseError(ValueError):
    """A tool call in model output that cannot be parsed. ``reason`` is a short counted label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class AssistantTurn:
    """A parsed assistant output: reasoning, visible answer text and tool calls."""

    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_message(self) -> Message:
        msg: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


# --------------------------------------------------------------------------- text level


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split ``<think>...</think>answer`` into (reasoning, answer).

    No think block → (None, text). An unclosed block (generation cut inside reasoning) → all of it is
    reasoning and the answer is empty: a truncated trace has no answer to grade.
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None, text.strip()
    body = stripped[len(THINK_OPEN):]
    end = body.find(THINK_CLOSE)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(THINK_CLOSE):].strip()


def _format_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(
        f"<parameter={k}>\n{_format_value(v)}\n</parameter>\n" for k, v in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _arguments_of(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolCallParseError("bad_arguments_json", f"{fn.get('name')}: {e}") from None
    if not isinstance(args, dict):
        raise ToolCallParseError("arguments_not_object", f"{fn.get('name')}: {args!r}")
    return args


_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION_RE = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _parse_value(raw: str) -> Any:
    s = raw.strip()
    if s and (s[0] in "[{\"-0123456789" or s in ("true", "false", "null")):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            pass
    return raw


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Extract XML tool calls from assistant text. Returns (text without the calls, calls).

    Raises ``ToolCallParseError`` naming what is wrong: an unclosed ``<tool_call>``, a block with no
    ``<function=...>``, or leftover text inside a function block that is not a parameter.
    """
    opens, closes = text.count("<tool_call>"), text.count("</tool_call>")
    if opens != closes:
        raise ToolCallParseError("unbalanced_tool_call_tags", f"{opens} open vs {closes} close")
    calls: list[ToolCall] = []
    for block in _TOOL_CALL_RE.findall(text):
        m = _FUNCTION_RE.match(block)
        if not m:
            raise ToolCallParseError("missing_function_tag", block.strip()[:80])
        name, body = m.group(1).strip(), m.group(2)
        if not re.fullmatch(r"[A-Za-z_][\w.\-]*", name):
            raise ToolCallParseError("bad_function_name", name[:80])
        args: dict[str, Any] = {}
        for pname, raw in _PARAM_RE.findall(body):
            pname = pname.strip()
            if pname in args:
                raise ToolCallParseError("duplicate_parameter", f"{name}.{pname}")
            args[pname] = _parse_value(raw)
        leftover = _PARAM_RE.sub("", body).strip()
        if leftover:
            raise ToolCallParseError("stray_text_in_function", f"{name}: {leftover[:80]}")
        calls.append(ToolCall(name, args))
    rest = _TOOL_CALL_RE.sub("", text).strip()
    return rest, calls


def parse_assistant(text: str) -> AssistantTurn:
    """Parse raw generated assistant text (special tokens already removed)."""
    reasoning, answer = split_reasoning(text)
    content, calls = parse_tool_calls(answer)
    return AssistantTurn(reasoning=reasoning, content=content, tool_calls=calls)


def assistant_text(msg: Message, keep_reasoning: bool = True) -> str:
    """The text of an assistant message as the model writes it (inverse of ``parse_assistant``)."""
    parts: list[str] = []
    reasoning = msg.get("reasoning_content")
    content = msg.get("content") or ""
    if reasoning is None:  # reasoning may also arrive inline in content
        reasoning, content = split_reasoning(content)
    if keep_reasoning and reasoning is not None:
        parts.append(f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n" if reasoning else f"{THINK_OPEN}{THINK_CLOSE}\n")
    body = content
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call)
        body = (body + "\n" if body else "") + format_tool_call(fn["name"], _arguments_of(call))
    parts.append(body)
    return "".join(parts)


def system_text(system: str | None, tools: Sequence[dict[str, Any]] | None) -> str:
    text = system if system is not None else DEFAULT_SYSTEM
    if tools:
        lines = "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
        text += f"\n\n# Tools\n<tools>\n{lines}\n</tools>\n{TOOL_INSTRUCTIONS}"
    return text


def truncate_reasoning(reasoning: str, budget_tokens: int, tokenizer: Any) -> str:
    """Cut a reasoning trace to at most ``budget_tokens`` tokens (reasoning-budget control)."""
    ids = tokenizer.encode(reasoning, add_special_tokens=False)
    if len(ids) <= budget_tokens:
        return reasoning
    return tokenizer.decode(ids[:budget_tokens]).rstrip()


# --------------------------------------------------------------------------- token level


@dataclass
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is trained on (assistant-written)

    def __len__(self) -> int:
        return len(self.input_ids)


def _last_user_index(messages: Sequence[Message]) -> int:
    idx = -1
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            idx = i
    return idx


def render_segments(
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    reasoning: bool = True,
) -> list[tuple[str, bool]]:
    """The conversation as (text, trained) segments, before tokenization.

    ``reasoning=False`` renders the reasoning-off mode: ``/no_think`` in the system prompt and an
    empty think block opening the generation prompt.
    """
    msgs = list(messages)
    system = None
    if msgs and msgs[0].get("role") == "system":
        system = msgs.pop(0).get("content") or ""
    sys_text = system_text(system, tools)
    if not reasoning and NO_THINK_FLAG not in sys_text:
        sys_text = f"{sys_text}\n{NO_THINK_FLAG}"
    segs: list[tuple[str, bool]] = [(f"{IM_START}system\n{sys_text}{IM_END}\n", False)]
    last_user = _last_user_index(msgs)
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "assistant":
            keep = reasoning and i > last_user  # earlier turns' reasoning is dropped
            body = assistant_text(m, keep_reasoning=keep)
            if not reasoning and i > last_user:
                body = f"{THINK_OPEN}{THINK_CLOSE}\n" + body
            segs.append((f"{IM_START}assistant\n", False))
            segs.append((f"{body}{IM_END}", True))
            segs.append(("\n", False))
        elif role in ("user", "tool"):
            segs.append((f"{IM_START}{role}\n{m.get('content') or ''}{IM_END}\n", False))
        else:
            raise ValueError(f"message {i}: unknown role {role!r} (system must come first)")
    if add_generation_prompt:
        opener = f"{IM_START}assistant\n" + ("" if reasoning else f"{THINK_OPEN}{THINK_CLOSE}\n")
        segs.append((opener, False))
    return segs


def render(
    tokenizer: Any,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    reasoning: bool = True,
) -> Rendered:
    """Token ids plus the assistant-token loss mask for one conversation."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in render_segments(messages, tools, add_generation_prompt, reasoning):
        seg = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(seg)
        mask.extend([int(trained)] * len(seg))
    return Rendered(ids, mask)


def render_text(
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    reasoning: bool = True,
) -> str:
    return "".join(t for t, _ in render_segments(messages, tools, add_generation_prompt, reasoning))

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

Why XML tool calls: a parameter value is written (almost) raw between tags, so code and quotes
inside arguments need no JSON escaping (the recipe's reason).

Tool-call values, exactly (the rule both this module and ``chat_template.jinja`` implement):

* **Writing.** A string value is written as its text; any other value as its JSON text
  (``json.dumps``, ``ensure_ascii=False``). Then, in that value text only, every ``&`` that starts
  ``&lt;`` or ``&amp;`` becomes ``&amp;``, and every ``<`` that starts ``</``, ``<|``,
  ``<tool_call>``, ``<parameter=`` or ``<function=`` becomes ``&lt;``. Nothing else changes, so
  ordinary values (code with ``a < b``, ``&&``, HTML like ``<b>``) render byte-for-byte as before;
  only sequences that a parser (ours, vLLM's, a tokenizer's special tokens ``<|im_end|>``) would
  read as markup are escaped, and the literal text ``&lt;`` / ``&amp;`` is escaped so that it
  survives. Reading undoes it: ``&lt;`` → ``<`` and ``&amp;`` → ``&``, left to right; a raw ``<``
  or ``&`` written by a model is kept as it is. So a value cannot close its parameter, open
  another one (``</parameter><parameter=admin>``) or end the call (``</tool_call>``).
* **Reading is schema-directed** (``parse_tool_calls(text, tools)``): a parameter whose schema
  type is ``"string"`` (or an enum of strings) is the exact text between the tags, minus the one
  newline the renderer puts on each side, so "2022", "3.10", "1e5" and "[1, 2]" stay strings. A
  parameter whose schema type is not string is decoded as JSON; text that is not JSON stays text,
  for the tool's schema check to reject as a bad type. A type list that allows string and other
  types (``["string", "null"]``) takes the JSON value only when it is one of the other types
  (so for such a parameter the string "null" cannot be told from null). With no schema for the
  parameter (no ``tools``, an unknown tool or parameter) the old rule applies: JSON-looking text
  that decodes is decoded, anything else is text; the round trip is exact only with a schema.
* **Bounds.** Parsing is linear in the text. JSON values nested deeper than ``MAX_JSON_DEPTH``
  and integers longer than Python's int-conversion limit are refused with ``ToolCallParseError``
  (``argument_too_deep`` / ``argument_number_too_long``) where the schema asks for JSON; without a
  schema such text stays text. Text longer than ``MAX_TOOL_TEXT_CHARS`` that contains tool calls
  is refused (``tool_text_too_large``). Every failure is a ``ToolCallParseError`` with a ``reason``
  code; nothing else escapes the parser.
* Parameter and function names cannot be escaped: a function name is a letter or ``_`` then word
  characters, ``.`` or ``-``; a parameter name is non-empty, without ``<``, ``>``, line breaks or
  surrounding whitespace; the renderer raises ``ToolCallParseError`` (``bad_function_name`` /
  ``bad_parameter_name``) rather than write a call that parses as something else.

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
import reprlib
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


def response_parts(messages: Sequence[dict[str, Any]]) -> tuple[str, str, dict[str, Any] | None]:
    """(all reasoning, all answer text, the last assistant message) of a rollout's messages."""
    think, answer, last = [], [], None
    for m in messages:
        if m.get("role") != "assistant":
            continue
        last = m
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        reasoning, visible = split_reasoning(content or "")
        reasoning = m.get("reasoning_content") or reasoning
        think.append(reasoning or "")
        answer.append(visible)
    return "".join(think), "".join(answer), last


# --------------------------------------------------------------------------- tool calls
# The value rules are in the module docstring; chat_template.jinja repeats the escaping with
# ``replace`` filters in the same order, and a test checks both render the same text.

MAX_JSON_DEPTH = 64  # deeper JSON is refused: json / jsonschema / deepcopy recurse per level
MAX_TOOL_TEXT_CHARS = 4_000_000  # a message with tool calls larger than this is refused unread

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAM_OPEN, _PARAM_CLOSE = "<parameter=", "</parameter>"

# One pass, left to right; the Jinja template does the same with sequential replaces (equivalent:
# no replacement creates or destroys a match of another).
_ESCAPE_RE = re.compile(r"&(?=lt;|amp;)|<(?=/|\||tool_call>|parameter=|function=)")
_UNESCAPE_RE = re.compile(r"&(lt|amp);")
_FUNCTION_NAME_RE = re.compile(r"[A-Za-z_][\w.\-]*")
_BAD_PARAM_NAME_RE = re.compile(r"[<>\r\n]|^\s|\s$")
_WS_RE = re.compile(r"\s*")
_JSON_SPECIAL_RE = re.compile(r'["\\\[\]{}]')


def escape_value(text: str) -> str:
    """A parameter value's text as written between the tags (see the module docstring)."""
    return _ESCAPE_RE.sub(lambda m: "&amp;" if m.group() == "&" else "&lt;", text)


def unescape_value(text: str) -> str:
    """Inverse of ``escape_value``; raw ``<`` and ``&`` (not forming an escape) are kept."""
    return _UNESCAPE_RE.sub(lambda m: "<" if m.group(1) == "lt" else "&", text)


def _format_value(value: Any) -> str:
    return escape_value(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def _check_names(name: str, arguments: dict[str, Any]) -> None:
    # Names are written unescaped, so one that would read back as something else is refused.
    if not isinstance(name, str) or not _FUNCTION_NAME_RE.fullmatch(name):
        raise ToolCallParseError("bad_function_name", repr(name)[:80])
    for k in arguments:
        if not isinstance(k, str) or not k or _BAD_PARAM_NAME_RE.search(k):
            raise ToolCallParseError("bad_parameter_name", f"{name}.{k!r}"[:80])


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the model's XML format; values escaped so that ``parse_tool_calls`` gives back
    exactly ``arguments`` (given the tool's schema). Raises ``ToolCallParseError`` for a function or
    parameter name that cannot be written."""
    _check_names(name, arguments)
    params = "".join(
        f"<parameter={k}>\n{_format_value(v)}\n</parameter>\n" for k, v in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _json_too_deep(s: str, limit: int) -> bool:
    """Whether JSON text nests deeper than ``limit`` (brackets inside strings do not count).

    Linear; only the structural characters are visited, and only when there are enough brackets
    to matter."""
    if s.count("[") + s.count("{") <= limit:
        return False
    depth, in_string, skip_to = 0, False, -1
    for m in _JSON_SPECIAL_RE.finditer(s):
        i = m.start()
        if i < skip_to:  # the character after a backslash inside a string
            continue
        c = s[i]
        if in_string:
            if c == "\\":
                skip_to = i + 2
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _nesting_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def load_json_bounded(text: str, where: str) -> Any:
    """``json.loads`` that cannot crash the caller: ``json.JSONDecodeError`` for text that is not
    JSON, ``ToolCallParseError`` for JSON too deep (``argument_too_deep``) or with an integer past
    Python's int-conversion limit (``argument_number_too_long``)."""
    if _json_too_deep(text, MAX_JSON_DEPTH):
        raise ToolCallParseError("argument_too_deep", f"{where}: JSON nested deeper than {MAX_JSON_DEPTH}")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise ToolCallParseError("argument_number_too_long", f"{where}: {e}") from None
    except RecursionError:  # unreachable after the depth check; kept so nothing escapes
        raise ToolCallParseError("argument_too_deep", f"{where}: JSON too deep") from None


def _arguments_of(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    where = str(fn.get("name"))[:80]
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = load_json_bounded(args, where) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolCallParseError("bad_arguments_json", f"{where}: {e}") from None
    if not isinstance(args, dict):
        raise ToolCallParseError("arguments_not_object", f"{where}: {reprlib.repr(args)}")
    if _nesting_depth(args) > MAX_JSON_DEPTH:
        raise ToolCallParseError("argument_too_deep", f"{where}: arguments nested deeper than {MAX_JSON_DEPTH}")
    return args


# --------------------------------------------------------------------------- schema-directed values

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), "object")


def _schema_types(spec: Any) -> set[str] | None:
    """The JSON types a property schema allows, or None when it does not say."""
    if not isinstance(spec, dict):
        return None
    t = spec.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and t and all(isinstance(x, str) for x in t):
        return set(t)
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return {_json_type(v) for v in spec["enum"]}
    if "const" in spec:
        return {_json_type(spec["const"])}
    for key in ("anyOf", "oneOf"):
        if isinstance(spec.get(key), list) and spec[key]:
            branches = [_schema_types(b) for b in spec[key]]
            if any(b is None for b in branches):
                return None
            return set().union(*branches)
    return None


def _property_types(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, set[str] | None]]:
    """tool name → parameter name → allowed JSON types (None: unknown), from OpenAI-format tools
    (``{"type": "function", "function": {...}}``) or the flat Responses form."""
    out: dict[str, dict[str, set[str] | None]] = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(props, dict):
            out[fn["name"]] = {k: _schema_types(v) for k, v in props.items()}
    return out


def _looks_like_json(s: str) -> bool:
    return bool(s) and (s[0] in "[{\"-0123456789" or s in ("true", "false", "null"))


def _decode_value(text: str, types: set[str] | None, where: str) -> Any:
    """A parameter's value from its (unescaped) text, as the module docstring says."""
    if types is None:  # no schema: JSON-looking text that decodes is decoded, anything else is text
        s = text.strip()
        if _looks_like_json(s):
            try:
                return load_json_bounded(s, where)
            except (json.JSONDecodeError, ToolCallParseError):
                pass
        return text
    if types == {"string"}:
        return text
    try:
        value = load_json_bounded(text.strip(), where)
    except json.JSONDecodeError:
        return text  # not JSON: the tool's schema check reports the bad type
    except ToolCallParseError:
        if "string" in types:  # could be meant as the string; it is one
            return text
        raise
    if "string" in types:  # string or something else: JSON only when it is one of the others
        kind = _json_type(value)
        if kind == "string" or not (kind in types or (kind == "integer" and "number" in types)):
            return text
    return value


# --------------------------------------------------------------------------- parsing


def _tool_call_blocks(text: str) -> tuple[str, list[str]]:
    """(text outside the calls, the inside of each ``<tool_call>`` block). Linear."""
    opens, closes = text.count(TOOL_CALL_OPEN), text.count(TOOL_CALL_CLOSE)
    if opens != closes:
        raise ToolCallParseError("unbalanced_tool_call_tags", f"{opens} open vs {closes} close")
    outside: list[str] = []
    blocks: list[str] = []
    pos = 0
    while True:
        i = text.find(TOOL_CALL_OPEN, pos)
        if i < 0:
            outside.append(text[pos:])
            break
        j = text.find(TOOL_CALL_CLOSE, i + len(TOOL_CALL_OPEN))
        if j < 0:
            raise ToolCallParseError("unbalanced_tool_call_tags", "a <tool_call> is never closed")
        outside.append(text[pos:i])
        blocks.append(text[i + len(TOOL_CALL_OPEN):j])
        pos = j + len(TOOL_CALL_CLOSE)
    rest = "".join(outside)
    if TOOL_CALL_CLOSE in rest:  # a close before its open; counts alone cannot see it
        raise ToolCallParseError("unbalanced_tool_call_tags", "a </tool_call> without its <tool_call>")
    return rest.strip(), blocks


def _parse_call(block: str, properties: dict[str, dict[str, set[str] | None]]) -> ToolCall:
    """One ``<function=NAME>...</function>`` block. Each step moves forward through the text and
    no search is repeated from the same place, so the cost is linear in the block."""
    stripped = block.strip()
    name_end = stripped.find(">")
    if not (stripped.startswith(_FUNCTION_OPEN) and stripped.endswith(_FUNCTION_CLOSE)) or name_end < 0 \
            or "\n" in stripped[:name_end] or name_end + 1 > len(stripped) - len(_FUNCTION_CLOSE):
        raise ToolCallParseError("missing_function_tag", stripped[:80])
    name = stripped[len(_FUNCTION_OPEN):name_end].strip()
    if not _FUNCTION_NAME_RE.fullmatch(name):
        raise ToolCallParseError("bad_function_name", name[:80])
    body = stripped[name_end + 1:len(stripped) - len(_FUNCTION_CLOSE)]
    types = properties.get(name, {})
    args: dict[str, Any] = {}
    pos, n = 0, len(body)
    while True:
        pos = _WS_RE.match(body, pos).end()
        if pos >= n:
            break
        if not body.startswith(_PARAM_OPEN, pos):
            raise ToolCallParseError("stray_text_in_function", f"{name}: {body[pos:pos + 80].strip()}")
        start = pos + len(_PARAM_OPEN)
        close = body.find(">", start)
        newline = body.find("\n", start, close if close >= 0 else n)
        if close < 0 or newline >= 0:
            raise ToolCallParseError("stray_text_in_function", f"{name}: {body[pos:pos + 80].strip()}")
        pname = body[start:close].strip()
        if not pname:
            raise ToolCallParseError("stray_text_in_function", f"{name}: {body[pos:pos + 80].strip()}")
        end = body.find(_PARAM_CLOSE, close + 1)
        if end < 0:
            raise ToolCallParseError("unclosed_parameter", f"{name}.{pname[:40]}: no </parameter>")
        if pname in args:
            raise ToolCallParseError("duplicate_parameter", f"{name}.{pname}")
        raw = body[close + 1:end]
        raw = raw[1:] if raw.startswith("\n") else raw  # the newline the renderer writes after the tag
        raw = raw[:-1] if raw.endswith("\n") else raw  # ... and before the closing tag
        args[pname] = _decode_value(unescape_value(raw), types.get(pname), f"{name}.{pname}"[:80])
        pos = end + len(_PARAM_CLOSE)
    return ToolCall(name, args)


def parse_tool_calls(text: str, tools: Sequence[dict[str, Any]] | None = None) -> tuple[str, list[ToolCall]]:
    """Extract XML tool calls from assistant text. Returns (text without the calls, calls).

    ``tools`` (the OpenAI-format definitions the model was given) directs how each value is read;
    see the module docstring. Raises ``ToolCallParseError`` naming what is wrong: an unbalanced
    ``<tool_call>``, a block with no ``<function=...>``, a bad function name, leftover text inside
    a function block that is not a parameter, an unclosed or repeated parameter, a JSON value too
    deep or with too long a number, or tool-call text over ``MAX_TOOL_TEXT_CHARS``.
    """
    if TOOL_CALL_OPEN not in text and TOOL_CALL_CLOSE not in text:
        return text.strip(), []
    if len(text) > MAX_TOOL_TEXT_CHARS:
        raise ToolCallParseError("tool_text_too_large", f"{len(text)} characters (limit {MAX_TOOL_TEXT_CHARS})")
    rest, blocks = _tool_call_blocks(text)
    properties = _property_types(tools)
    return rest, [_parse_call(b, properties) for b in blocks]


def calls_a_tool(text: str) -> bool:
    """True when the reply's answer part tries to call a tool (a tool-call tag, well-formed or not):
    what counts as a tool call when measuring tool hallucination (``train/dpo_pairs.py``) and tool
    use where a tool fits (``eval/tool_decisions.py``)."""
    _, answer = split_reasoning(text)
    return TOOL_CALL_OPEN in answer or TOOL_CALL_CLOSE in answer or "<function=" in answer


def parse_assistant(text: str, tools: Sequence[dict[str, Any]] | None = None) -> AssistantTurn:
    """Parse raw generated assistant text (special tokens already removed); ``tools`` directs how
    tool-call values are read (see ``parse_tool_calls``)."""
    reasoning, answer = split_reasoning(text)
    content, calls = parse_tool_calls(answer, tools)
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

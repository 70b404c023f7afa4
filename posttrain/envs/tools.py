"""Shared machinery of the tool-use environments (workplace, banking): tools, execution, state.

A ``Toolbox`` is a registry of Python functions, each described by a JSON schema in OpenAI function
format. ``Toolbox.execute`` turns one parsed ``ToolCall`` into a ``ToolResult``; it never raises on
model mistakes. Every failure becomes an error observation with a short, countable reason:

* ``unknown_tool``: the name is not in the toolbox;
* ``missing_argument`` / ``unexpected_argument`` / ``bad_argument_type`` / ``bad_argument_value``:
  the arguments break the tool's JSON schema (checked with ``jsonschema`` before the function runs,
  so tool code can trust its inputs);
* whatever ``ToolError`` a tool raises for a domain failure (``not_found``, ...);
* ``sql_error`` for a database error, ``internal_error`` for anything else (a bug worth counting,
  not a crash of the rollout).

XML calls are parsed against the toolbox's schemas (``parse_turn(message, tools)``), so a string
parameter is exactly the text the model wrote ("2022" stays "2022", "3.10" stays "3.10") and only
non-string parameters are decoded as JSON (the value rules are in ``models/chat_template.py``). A
call that does not parse (unbalanced tags, an unclosed parameter, JSON nested too deep, a number
too long to convert, ...) executes nothing and becomes one error observation with the parser's
reason, counted like any other error; it never raises. Structured (OpenAI JSON) calls keep one
leniency: a JSON scalar for a string parameter is turned into its JSON text.

Transcripts are replayed, not trusted. ``parse_turn`` reads the calls of one assistant message
(OpenAI ``tool_calls`` if present, else the XML calls in ``content``), and ``replay`` executes every
assistant message of a transcript in order against a fresh state. The live episode (``ToolEpisode``)
and the stateless verifier go through the same two functions, so they cannot disagree about what a
transcript did: a message whose calls do not parse executes nothing in both.

State comparison: ``snapshot`` reads the mutable tables of a SQLite database into normalized,
JSON-able form. Rows that existed when the database was built are keyed by their id; rows created
during the episode get ids from ``NEW_ID_BASE`` up and are compared as a multiset without their id,
so creating two things in a different order than the reference still matches. Free-text columns are
compared after ``normalize_text`` (case, whitespace, surrounding quotes, final full stop).
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import jsonschema

from posttrain.envs.base import Episode, Message, Task
from posttrain.envs.splits import check_split, split_of
from posttrain.models.chat_template import ToolCall, ToolCallParseError, _arguments_of, parse_assistant

NEW_ID_BASE = 100_000  # ids of rows created during an episode start here (seed rows stay below)

# jsonschema's failing keyword → the reason we count. Anything not listed is a bad value.
_SCHEMA_REASONS = {
    "required": "missing_argument",
    "additionalProperties": "unexpected_argument",
    "type": "bad_argument_type",
}


class ToolError(Exception):
    """A domain-level failure inside a tool (unknown id, action not allowed): an error observation."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]  # fn(state, **arguments) -> JSON-able result

    def definition(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolResult:
    name: str
    output: Any  # JSON-able; for errors {"error": reason, "message": ...}
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def message(self) -> Message:
        return {"role": "tool", "name": self.name, "content": json.dumps(self.output, ensure_ascii=False)}


def error_result(name: str, reason: str, message: str) -> ToolResult:
    return ToolResult(name, {"error": reason, "message": message}, error=reason)


def object_schema(properties: dict[str, Any], optional: Iterable[str] = ()) -> dict[str, Any]:
    """A strict JSON object schema: every property required unless listed in ``optional``."""
    opt = set(optional)
    unknown = opt - set(properties)
    if unknown:
        raise ValueError(f"optional names no property: {sorted(unknown)}")
    return {
        "type": "object",
        "properties": properties,
        "required": [k for k in properties if k not in opt],
        "additionalProperties": False,
    }


def _coerce_scalar_strings(args: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    # Only reachable from structured JSON calls ({"text": 1234}) and direct ToolCall objects: XML
    # calls are parsed against the schema, so their string parameters are already text.
    props = schema.get("properties", {})
    out = dict(args)
    for k, v in args.items():
        if props.get(k, {}).get("type") == "string" and (v is None or isinstance(v, (bool, int, float))):
            out[k] = json.dumps(v)
    return out


def _schema_error_reason(error: jsonschema.ValidationError) -> str:
    return _SCHEMA_REASONS.get(str(error.validator), "bad_argument_value")


class Toolbox:
    """A named registry of tools with schema-checked, exception-free execution."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._definitions: list[dict[str, Any]] | None = None

    def tool(
        self, description: str, properties: dict[str, Any], optional: Iterable[str] = ()
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(state, **arguments)`` under its own name."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(Tool(fn.__name__, description, object_schema(properties, optional), fn))
            return fn

        return deco

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice in {self.name}")
        validator_cls = jsonschema.validators.validator_for(tool.parameters)
        validator_cls.check_schema(tool.parameters)
        self._tools[tool.name] = tool
        self._validators[tool.name] = validator_cls(tool.parameters)
        self._definitions = None

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [self._tools[n].definition() for n in self.names()]

    def _parser_tools(self) -> list[dict[str, Any]]:
        # The definitions the XML parser reads, built once (every parsed turn needs them); kept
        # private so no caller can mutate the cached copy.
        if self._definitions is None:
            self._definitions = self.definitions()
        return self._definitions

    def execute(self, state: Any, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self.names())
            return error_result(call.name, "unknown_tool", f"no tool named {call.name!r}; available: {known}")
        args = _coerce_scalar_strings(call.arguments, tool.parameters)
        error = jsonschema.exceptions.best_match(self._validators[call.name].iter_errors(args))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            return error_result(call.name, _schema_error_reason(error), f"{where}: {error.message}")
        try:
            return ToolResult(call.name, tool.fn(state, **args))
        except ToolError as e:
            return error_result(call.name, e.reason, e.message)
        except sqlite3.Error as e:
            return error_result(call.name, "sql_error", str(e))
        except Exception as e:  # a tool bug must not kill the rollout; it is counted instead
            return error_result(call.name, "internal_error", f"{type(e).__name__}: {e}")


# --------------------------------------------------------------------------- transcripts


@dataclass
class ParsedTurn:
    """The tool calls and user-visible text of one assistant message."""

    calls: list[ToolCall]
    text: str
    parse_error: ToolCallParseError | None = None


def _content_text(content: Any) -> str:
    """Message content as text: a string, or OpenAI content parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def parse_turn(message: Message, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
    """Read one assistant message; never raises (a parse error is returned, with no calls).

    ``tools`` (OpenAI-format definitions, e.g. ``Toolbox.definitions()``) directs how XML values
    are read: a string parameter stays the exact text. Without it, JSON-looking text is decoded."""
    try:
        turn = parse_assistant(_content_text(message.get("content")), tools)
        if message.get("tool_calls"):
            calls = [ToolCall(str(c.get("function", c).get("name", "")), _arguments_of(c))
                     for c in message["tool_calls"]]
            return ParsedTurn(calls, turn.content)
        return ParsedTurn(turn.tool_calls, turn.content)
    except ToolCallParseError as e:
        return ParsedTurn([], "", e)
    except (AttributeError, TypeError) as e:  # tool_calls that are not a list of call objects
        return ParsedTurn([], "", ToolCallParseError("malformed_tool_calls", f"{type(e).__name__}: {e}"))


def parse_error_result(error: ToolCallParseError) -> ToolResult:
    hint = "write each call as <tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>"
    return error_result("tool_call", error.reason, f"{error.detail} ({hint})")


@dataclass
class ReplayStats:
    tool_calls: int = 0
    errors: Counter = field(default_factory=Counter)  # every error observation, by reason
    parse_errors: Counter = field(default_factory=Counter)  # the subset from unparsable messages

    def add(self, result: ToolResult) -> None:
        if result.error is not None:
            self.errors[result.error] += 1

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())


def run_turn(toolbox: Toolbox, state: Any, turn: ParsedTurn, stats: ReplayStats) -> list[ToolResult]:
    """Execute one parsed turn: its calls in order, or the parse error as the single result."""
    if turn.parse_error is not None:
        results = [parse_error_result(turn.parse_error)]
        stats.parse_errors[turn.parse_error.reason] += 1
    else:
        results = [toolbox.execute(state, c) for c in turn.calls]
        stats.tool_calls += len(turn.calls)
    for r in results:
        stats.add(r)
    return results


def replay(toolbox: Toolbox, state: Any, messages: Iterable[Message]) -> ReplayStats:
    """Execute the tool calls of every assistant message, in order (observations are ignored)."""
    stats = ReplayStats()
    tools = toolbox._parser_tools()
    for m in messages:
        if m.get("role") == "assistant":
            run_turn(toolbox, state, parse_turn(m, tools), stats)
    return stats


def replay_calls(toolbox: Toolbox, state: Any, calls: Iterable[dict[str, Any]]) -> list[ToolResult]:
    """Execute reference calls stored as ``{"name", "arguments"}`` dicts (task ground truth)."""
    return [toolbox.execute(state, ToolCall(c["name"], c["arguments"])) for c in calls]


def reference_state(
    toolbox: Toolbox, db: Any, calls: list[dict[str, Any]], specs: Iterable[TableSpec]
) -> dict[str, Any]:
    """The state after running a task's reference calls on ``db`` (a fresh database wrapper with a
    ``conn``; closed afterwards). A failing reference call is a generator bug and raises."""
    try:
        for c, r in zip(calls, replay_calls(toolbox, db, calls)):
            if not r.ok:
                raise ValueError(f"reference call {c} failed: {r.output}")
        return snapshot(db.conn, specs)
    finally:
        db.close()


def calls_message(calls: Iterable[dict[str, Any]], content: str = "") -> Message:
    """An assistant message carrying ``calls`` in OpenAI form (scripted assistants, reference runs)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                       for c in calls],
    }


class ToolEpisode(Episode):
    """Bookkeeping shared by tool episodes: a live state, a turn limit, error counts in ``stats``.

    ``stats`` keys: ``turns``, ``tool_calls`` and ``error:<reason>`` for every failed call.
    """

    def __init__(self, task: Task, toolbox: Toolbox, state: Any, max_turns: int) -> None:
        super().__init__(task)
        self.toolbox = toolbox
        self.state = state
        self.max_turns = max_turns
        self.turns = 0
        self.done = False
        self._replay = ReplayStats()

    def begin_turn(self, message: Message) -> ParsedTurn:
        if self.done:
            raise RuntimeError("step() called on a finished episode")
        self.turns += 1
        self.count("turns")
        return parse_turn(message, self.toolbox._parser_tools())

    def execute(self, turn: ParsedTurn) -> list[Message]:
        results = run_turn(self.toolbox, self.state, turn, self._replay)
        self.stats["tool_calls"] = self._replay.tool_calls
        for r in results:
            if r.error is not None:
                self.count(f"error:{r.error}")
        return [r.message() for r in results]

    @property
    def out_of_turns(self) -> bool:
        return self.turns >= self.max_turns

    def close(self) -> None:
        close = getattr(self.state, "close", None)
        if close is not None:  # sqlite connections (and wrappers of them) may be closed twice
            close()


# --------------------------------------------------------------------------- database state


def normalize_text(value: Any) -> Any:
    """Free text compared loosely: case, inner whitespace, wrapping quotes and a final '.' ignored."""
    if not isinstance(value, str):
        return value
    s = " ".join(value.split()).casefold()
    while len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        s = s[1:-1].strip()
    return s.rstrip(".").rstrip()


@dataclass(frozen=True)
class TableSpec:
    """Which part of a table counts as state. ``ordered`` tables (logs) compare as a sequence."""

    table: str
    key: str
    columns: tuple[str, ...]
    text_columns: tuple[str, ...] = ()
    ordered: bool = False


def next_id(conn: sqlite3.Connection, table: str, key: str) -> int:
    (top,) = conn.execute(f"SELECT MAX({key}) FROM {table}").fetchone()
    return max(NEW_ID_BASE - 1, top or 0) + 1


def snapshot(conn: sqlite3.Connection, specs: Iterable[TableSpec]) -> dict[str, Any]:
    """The normalized, JSON-able state of the given tables (see the module docstring)."""
    state: dict[str, Any] = {}
    for spec in specs:
        cols = (spec.key, *spec.columns)
        rows = conn.execute(f"SELECT {', '.join(cols)} FROM {spec.table} ORDER BY {spec.key}").fetchall()
        norm = [
            [normalize_text(v) if c in spec.text_columns else v for c, v in zip(cols[1:], row[1:])] for row in rows
        ]
        if spec.ordered:
            state[spec.table] = {"log": norm}
            continue
        kept = {str(row[0]): r for row, r in zip(rows, norm) if row[0] < NEW_ID_BASE}
        new = sorted((r for row, r in zip(rows, norm) if row[0] >= NEW_ID_BASE), key=lambda r: json.dumps(r))
        state[spec.table] = {"kept": kept, "new": new}
    return state


def state_hash(state: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def diff_states(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """One human-readable line per table whose state differs (empty list = states match)."""
    lines: list[str] = []
    for table in sorted(set(expected) | set(actual)):
        e, a = expected.get(table, {}), actual.get(table, {})
        if e == a:
            continue
        if "log" in e or "log" in a:
            lines.append(f"{table}: log differs ({len(a.get('log', []))} entries, expected {len(e.get('log', []))})")
            continue
        ek, ak = e.get("kept", {}), a.get("kept", {})
        changed = sum(1 for k in set(ek) & set(ak) if ek[k] != ak[k])
        en = Counter(json.dumps(r) for r in e.get("new", []))
        an = Counter(json.dumps(r) for r in a.get("new", []))
        lines.append(
            f"{table}: {changed} differ, {len(set(ek) - set(ak))} wrongly deleted, "
            f"{len(set(ak) - set(ek))} not deleted, {sum((an - en).values())} unexpected new, "
            f"{sum((en - an).values())} expected new missing"
        )
    return lines


@dataclass
class StateCheck:
    """Outcome of replaying a transcript and comparing the state with the reference."""

    diffs: list[str]
    stats: ReplayStats

    @property
    def match(self) -> bool:
        return not self.diffs

    def components(self) -> dict[str, float]:
        return {"state_match": float(self.match), "tool_calls": float(self.stats.tool_calls),
                "tool_errors": float(self.stats.n_errors)}

    def reason(self) -> str:
        text = "state matches" if self.match else "state differs: " + "; ".join(self.diffs)
        if self.stats.parse_errors:  # say why calls did not run (an unparsable call executes nothing)
            counts = ", ".join(f"{r} x{n}" for r, n in sorted(self.stats.parse_errors.items()))
            text += f"; unparsable tool calls: {counts}"
        return text


def check_transcript(
    toolbox: Toolbox,
    fresh_db: Callable[[], Any],
    task: Task,
    specs: Iterable[TableSpec],
    messages: Iterable[Message],
) -> StateCheck:
    """Stateless grading of a tool task: expected state from the task's reference calls (checked
    against the stored ``state_hash``), actual state from replaying ``messages``, both on fresh
    databases from ``fresh_db()`` (a wrapper with ``conn`` and ``close``)."""
    specs = tuple(specs)
    expected = reference_state(toolbox, fresh_db(), task.ground_truth["reference_calls"], specs)
    if state_hash(expected) != task.ground_truth["state_hash"]:
        raise ValueError(f"task {task.id} is stale: its reference calls no longer give the stored state")
    db = fresh_db()
    try:
        stats = replay(toolbox, db, messages)
        actual = snapshot(db.conn, specs)
    finally:
        db.close()
    return StateCheck(diff_states(expected, actual), stats)


# --------------------------------------------------------------------------- task universes


def select_tasks(
    n_candidates: int,
    split: str,
    n: int | None,
    seed: int,
    id_of: Callable[[int], str],
    build: Callable[[int], Task | None],
) -> list[Task]:
    """The first ``n`` tasks of ``split`` among candidates 0..n_candidates-1 shuffled by ``seed``.

    ``id_of`` must be cheap (it decides the split before anything is built); ``build`` may return
    None for a candidate with no valid instance."""
    check_split(split)
    order = list(range(n_candidates))
    random.Random(seed).shuffle(order)
    out: list[Task] = []
    for index in order:
        if n is not None and len(out) >= n:
            break
        if split_of(id_of(index)) != split:
            continue
        task = build(index)
        if task is not None:
            out.append(task)
    return out

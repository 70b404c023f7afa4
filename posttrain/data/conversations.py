"""OpenAI-style conversation JSONL: reading with validation that names file, line and field.

One row: ``{"messages": [...], "tools": [...]?, ...}``. Messages have a ``role`` (system, user,
assistant, tool) and string ``content``; assistant messages may carry ``reasoning_content`` and
``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``, arguments an object or
a JSON string). Extra top-level keys (provenance, domain, ...) are kept.

Bad rows are never dropped silently: ``read_conversations(..., on_error="raise")`` stops and lists
every bad row (file:line: field: problem); ``on_error="skip"`` skips them, and the returned
``ReadReport`` counts and lists them so the caller prints the summary. A line that is not UTF-8 is
such a bad row (``file:line: not UTF-8 (byte 0xe9 at column 47)``); the rest of the file is read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from posttrain.errors import UserError
from posttrain.models.chat_template import ToolCallParseError, _arguments_of, _check_names


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCallSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSpec

    @model_validator(mode="after")
    def _arguments_parse(self) -> "ToolCallSpec":
        try:  # names too: the chat template refuses to write one that would parse as something else
            _check_names(self.function.name, _arguments_of(self.model_dump()))
        except ToolCallParseError as e:
            raise ValueError(str(e)) from None
        return self


class MessageSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallSpec] | None = None

    @model_validator(mode="after")
    def _content_rules(self) -> "MessageSpec":
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"{self.role} message needs a string content")
        if self.role == "assistant" and not (self.content or self.tool_calls or self.reasoning_content):
            raise ValueError("assistant message is empty (no content, reasoning or tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages may carry tool_calls")
        return self


class ConversationSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[MessageSpec] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None

    @field_validator("messages")
    @classmethod
    def _order(cls, msgs: list[MessageSpec]) -> list[MessageSpec]:
        for i, m in enumerate(msgs):
            if m.role == "system" and i != 0:
                raise ValueError(f"messages.{i}: a system message may only come first")
        if not any(m.role == "assistant" for m in msgs):
            raise ValueError("no assistant message: nothing to train on")
        return msgs

    @model_validator(mode="after")
    def _tool_calls_need_tools(self) -> "ConversationSpec":
        uses = any(m.tool_calls for m in self.messages)
        if uses and not self.tools:
            raise ValueError("tool_calls present but no tools are defined")
        return self


@dataclass
class BadRow:
    path: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


@dataclass
class ReadReport:
    read: int = 0
    kept: int = 0
    bad: list[BadRow] = field(default_factory=list)

    def summary(self) -> str:
        s = f"{self.kept}/{self.read} rows kept"
        if self.bad:
            s += f", {len(self.bad)} bad:\n" + "\n".join(f"  {b}" for b in self.bad[:20])
            if len(self.bad) > 20:
                s += f"\n  ... and {len(self.bad) - 20} more"
        return s


class DataError(UserError, ValueError):
    pass


def validate_row(row: Any) -> dict[str, Any]:
    """Validate one parsed row; raises ``ValueError`` whose message names the field."""
    if not isinstance(row, dict):
        raise ValueError(f"row must be a JSON object, got {type(row).__name__}")
    try:
        ConversationSpec.model_validate(row)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(row)"
        raise ValueError(f"{loc}: {first['msg']}") from None
    return row


# Bytes that are not UTF-8 are decoded with ``surrogateescape`` (byte 0xNN → U+DCNN) and found per
# line. Strict decoding raised one UnicodeDecodeError for the whole file, from inside the read loop:
# a traceback with no file:line, and no way to skip just that line.
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def not_utf8(line: str) -> str | None:
    """The problem with a line read with ``errors="surrogateescape"``: ``"not UTF-8 (byte 0xff at
    column 7)"`` (the column of the first bad byte, in characters from 1), or None if it is clean."""
    m = _ESCAPED_BYTE.search(line)
    return None if m is None else f"not UTF-8 (byte 0x{ord(m.group()) - 0xDC00:02x} at column {m.start() + 1})"


def iter_jsonl(path: str | Path, on_bad_line: Callable[[BadRow], None] | None = None) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers. A line that is not UTF-8 raises ``DataError``
    (``path:line: not UTF-8 (byte 0x.. at column N)``), or goes to ``on_bad_line`` and is skipped."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            problem = not_utf8(line)
            if problem is not None:
                bad = BadRow(str(path), lineno, problem)
                if on_bad_line is None:
                    raise DataError(str(bad))
                on_bad_line(bad)
                continue
            yield lineno, line


def read_conversations(
    paths: str | Path | Iterable[str | Path],
    on_error: Literal["raise", "skip"] = "raise",
) -> tuple[list[dict[str, Any]], ReadReport]:
    if isinstance(paths, (str, Path)):
        paths = [paths]
    report = ReadReport()
    rows: list[dict[str, Any]] = []
    for p in paths:
        if not Path(p).exists():
            raise DataError(f"data file not found: {p}")
        def undecodable(bad: BadRow) -> None:  # a bad row like any other: listed, or skipped and counted
            report.read += 1
            report.bad.append(bad)

        for lineno, line in iter_jsonl(p, undecodable):
            report.read += 1
            try:
                row = json.loads(line)
                rows.append(validate_row(row))
                report.kept += 1
            except (json.JSONDecodeError, ValueError) as e:
                problem = f"not valid JSON: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
                report.bad.append(BadRow(str(p), lineno, problem))
    if report.bad and on_error == "raise":
        raise DataError(
            f"{len(report.bad)} bad row(s); fix them or pass data.on_error=skip to skip them:\n"
            + "\n".join(f"  {b}" for b in report.bad[:50])
        )
    return rows, report


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path, append: bool = False) -> int:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(p, "a" if append else "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n

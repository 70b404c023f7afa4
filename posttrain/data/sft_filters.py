"""Filters every SFT candidate must pass, whatever its domain (docs/recipe.md §1).

A filter is a pure function of one OpenAI-style conversation row (``{"messages": [...], "tools":
[...], ...}``) returning ``(keep, reason)``: ``(True, None)`` to keep, ``(False, "short_label")`` to
drop. Each filter is a small pydantic model: its fields are its settings (documented, with bounds,
validated when built) and ``__call__`` is the check, so a filter is configured data and stays pure.
``FILTERS`` maps names to filter classes; ``FilterStack`` applies a list of them in order, stops at
the first failure and counts drops as ``"<filter>:<reason>"``.

The filters:

* ``truncated``: the candidate was cut off — the token limit (``finish_reason == "length"`` in its
  provenance), or for an episode the turn or context limit. The trainer learns to stop at
  ``<|im_end|>``; a cut-off trace would teach it to stop mid-sentence.
* ``tool_calls``: malformed tool use — calls but no tool definitions, a call to a tool that is not
  defined, a missing required argument, arguments that are not a JSON object, and XML tool-call
  text that ``chat_template.parse_assistant`` cannot parse (``malformed:<ToolCallParseError
  reason>``).
* ``repetition``: pathological repetition on word tokens, two ways. *Window*: some n-gram occurs
  more than ``window_max_repeats`` times inside a span of ``window`` tokens (a generation stuck in a
  loop). *Trajectory*: the fraction of n-gram occurrences that repeat an earlier one exceeds
  ``max_dup_fraction`` (the same paragraph restated again and again, too far apart for the window).
  Tool-call markup is removed first: five legitimate calls to one tool repeat their tags.
* ``keywords``: named regexes for unwanted narratives (the recipe's example: "our nation/party ...,
  our values"); a small default list ships, any list can be configured.
* ``length``: min/max characters and words of the assistant output.

Only assistant messages are checked: the prompt is given, and a user may well ask about politics.

Speed: the repetition check is the costly one, so it is vectorised. Words are hashed with Python's
``hash`` into an int64 array, n-gram ids are polynomial combinations of those (uint64 wraparound),
one stable argsort groups equal n-grams with their positions ascending, and "occurrence j and
occurrence j+r of the same n-gram lie within the window" is one vectorised comparison. ``hash`` is
salted per process, which is harmless: ids are only compared within one text.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from posttrain.configs.curate import FiltersConfig
from posttrain.models.chat_template import ToolCallParseError, _arguments_of, parse_assistant, split_reasoning
from posttrain.registry import Registry

Row = dict[str, Any]
Verdict = tuple[bool, "str | None"]
KEEP: Verdict = (True, None)

# --------------------------------------------------------------------------- text of a row


_TOOL_CALL_BLOCK_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)


def assistant_messages(row: Row) -> list[dict[str, Any]]:
    return [m for m in row.get("messages") or [] if m.get("role") == "assistant"]


def reasoning_and_answer(msg: dict[str, Any]) -> tuple[str, str]:
    """(reasoning, visible text) of one assistant message, reasoning inline or in its own field."""
    content = msg.get("content") or ""
    if msg.get("reasoning_content") is not None:
        return msg["reasoning_content"], content
    reasoning, answer = split_reasoning(content)
    return reasoning or "", answer


def assistant_output(row: Row, include_reasoning: bool = True) -> str:
    """All assistant text of a row (reasoning first), tool-call markup removed."""
    parts: list[str] = []
    for m in assistant_messages(row):
        reasoning, answer = reasoning_and_answer(m)
        if include_reasoning and reasoning:
            parts.append(reasoning)
        answer = _TOOL_CALL_BLOCK_RE.sub(" ", answer).strip()
        if answer:
            parts.append(answer)
    return "\n".join(parts)


# --------------------------------------------------------------------------- registry


class Filter(BaseModel):
    """Base: settings are fields; ``__call__(row) -> (keep, reason)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: ClassVar[str] = ""

    def __call__(self, row: Row) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError


FILTERS: Registry[type[Filter]] = Registry("filter")


def _register(cls: type[Filter]) -> type[Filter]:
    return FILTERS.register(cls.name)(cls)


# --------------------------------------------------------------------------- truncated


# finish reasons of a generation (or an episode, episodes/multiturn.py) that did not end by itself
_CUT_OFF = {"length": "hit_length_limit", "max_turns": "hit_turn_limit", "context": "hit_context_limit"}


@_register
class TruncatedFilter(Filter):
    """Drops generations cut off by a limit (``provenance.finish_reason``: length, max_turns, context)."""

    name: ClassVar[str] = "truncated"

    def __call__(self, row: Row) -> Verdict:
        reason = _CUT_OFF.get((row.get("provenance") or {}).get("finish_reason"))
        return (False, reason) if reason else KEEP


# --------------------------------------------------------------------------- tool calls


def tool_name(tool: dict[str, Any]) -> str | None:
    """A tool definition's name, chat-completions (``{"function": {...}}``) or flat form."""
    fn = tool.get("function", tool)
    return fn.get("name") if isinstance(fn, dict) else None


def _required_params(tool: dict[str, Any]) -> list[str]:
    fn = tool.get("function", tool)
    params = fn.get("parameters") if isinstance(fn, dict) else None
    req = params.get("required") if isinstance(params, dict) else None
    return list(req) if isinstance(req, list) else []


def tool_calls_of(msg: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of every call in an assistant message: structured ``tool_calls`` and XML
    calls written in its content (read against ``tools``' schemas when given). Raises
    ``ToolCallParseError`` for anything unparsable."""
    calls = [(str((c.get("function", c) or {}).get("name", "")), _arguments_of(c))
             for c in msg.get("tool_calls") or []]
    content = msg.get("content") or ""
    if "<tool_call>" in content or "</tool_call>" in content:
        calls += [(c.name, c.arguments) for c in parse_assistant(content, tools).tool_calls]
    return calls


@_register
class ToolCallFilter(Filter):
    """Malformed tool use: calls without tools, unknown tools, unparsable calls, missing arguments."""

    name: ClassVar[str] = "tool_calls"
    check_required: bool = Field(True, description="drop calls that omit a parameter the schema requires")

    def __call__(self, row: Row) -> Verdict:
        tools = {tool_name(t): t for t in row.get("tools") or [] if isinstance(t, dict)}
        for m in assistant_messages(row):
            try:
                calls = tool_calls_of(m, list(tools.values()))
            except ToolCallParseError as e:
                return False, f"malformed:{e.reason}"
            except (AttributeError, TypeError):  # tool_calls that are not a list of call objects
                return False, "malformed:tool_calls_shape"
            for name, args in calls:
                if not tools:
                    return False, "calls_without_tools"
                if name not in tools:
                    return False, "unknown_tool"
                if self.check_required and any(p not in args for p in _required_params(tools[name])):
                    return False, "missing_required_argument"
        return KEEP


# --------------------------------------------------------------------------- repetition

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio): polynomial n-gram ids


def word_hashes(words: Sequence[str]) -> np.ndarray:
    return np.fromiter(map(hash, words), dtype=np.int64, count=len(words)).view(np.uint64)


def ngram_ids(words: Sequence[str] | np.ndarray, n: int) -> np.ndarray:
    """uint64 id of every word n-gram (len(words) - n + 1 of them; empty if too few words).
    ``words`` may be given already hashed (``word_hashes``) to share the hashing between sizes."""
    if len(words) < n:
        return np.empty(0, dtype=np.uint64)
    h = words if isinstance(words, np.ndarray) else word_hashes(words)
    m = len(h) - n + 1
    ids = h[:m].copy()
    for k in range(1, n):  # wraparound multiply is intended: ids only need to be distinct
        ids *= _MIX
        ids ^= h[k:k + m]
    return ids


def max_repeats_in_window(ids: np.ndarray, n: int, window: int, repeats: int) -> bool:
    """True if some n-gram occurs more than ``repeats`` times with all occurrences inside ``window``
    tokens (first token of the first occurrence to last token of the last)."""
    if len(ids) <= repeats:
        return False
    order = np.argsort(ids, kind="stable")  # equal ids grouped, positions ascending within a group
    sorted_ids = ids[order]
    same = sorted_ids[repeats:] == sorted_ids[:-repeats]
    span = order[repeats:] - order[:-repeats] + n  # tokens covered by repeats+1 occurrences
    return bool(np.any(same & (span <= window)))


def duplicate_fraction(ids: np.ndarray) -> float:
    """Fraction of n-gram occurrences that repeat an earlier one (0 = all distinct)."""
    if len(ids) == 0:
        return 0.0
    s = np.sort(ids)  # a plain sort is ~10x faster than np.unique on a few hundred ids
    distinct = 1 + int(np.count_nonzero(s[1:] != s[:-1]))
    return 1.0 - distinct / len(ids)


def words_of(text: str) -> list[str]:
    return text.lower().split()


@_register
class RepetitionFilter(Filter):
    """Pathological repetition: n-gram loops inside a sliding window, or a trajectory made of repeats."""

    name: ClassVar[str] = "repetition"
    window_ngram: int = Field(5, ge=1, description="n of the n-grams counted inside the window")
    window: int = Field(200, ge=2, description="window size in word tokens")
    window_max_repeats: int = Field(5, ge=1, description="an n-gram may occur this many times in a window; one more drops")
    trajectory_ngram: int = Field(10, ge=1, description="n of the n-grams for the whole-trajectory duplicate fraction")
    max_dup_fraction: float = Field(0.35, gt=0, le=1, description="drop if more than this fraction of n-grams are repeats")
    min_words: int = Field(40, ge=0, description="the trajectory check needs at least this many words (short answers repeat by chance)")
    include_reasoning: bool = True

    @model_validator(mode="after")
    def _window_fits(self) -> "RepetitionFilter":
        if self.window < self.window_ngram:
            raise ValueError(f"window ({self.window}) must be at least window_ngram ({self.window_ngram})")
        return self

    def __call__(self, row: Row) -> Verdict:
        h = word_hashes(words_of(assistant_output(row, self.include_reasoning)))
        if max_repeats_in_window(ngram_ids(h, self.window_ngram), self.window_ngram,
                                 self.window, self.window_max_repeats):
            return False, "window"
        if len(h) >= max(self.min_words, self.trajectory_ngram):
            if duplicate_fraction(ngram_ids(h, self.trajectory_ngram)) > self.max_dup_fraction:
                return False, "trajectory"
        return KEEP


# --------------------------------------------------------------------------- keywords

# The recipe's example of an unwanted narrative, "our nation/party ..., our values", and two
# relatives. A small, illustrative list: real deployments pass their own (``patterns``).
DEFAULT_PATTERNS: dict[str, str] = {
    "nation_party_values": (
        r"\bour (?:great |glorious |beloved )?(?:nation|party|motherland|fatherland|homeland)\b"
        r"[^.!?\n]{0,160}\bour (?:core |shared |national |socialist )?values\b"
    ),
    "party_always_right": r"\bthe party (?:is|was|has) (?:always )?(?:been )?(?:right|correct|infallible)\b",
    "leader_worship": r"\bour (?:great|glorious|dear|beloved|wise) leader\b",
}


@_register
class KeywordFilter(Filter):
    """Named regexes searched in the assistant output (reasoning included); the first pattern (in
    the given order) that matches names the drop."""

    name: ClassVar[str] = "keywords"
    patterns: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_PATTERNS),
                                     description="name → regex; the name is the drop reason")
    case_sensitive: bool = False
    include_reasoning: bool = True
    _compiled: list[tuple[str, re.Pattern[str]]] = PrivateAttr(default_factory=list)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, patterns: dict[str, str]) -> dict[str, str]:
        for name, p in patterns.items():
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"pattern {name!r} is not a valid regex: {e}") from None
        return patterns

    def model_post_init(self, _: Any) -> None:
        flags = 0 if self.case_sensitive else re.IGNORECASE
        # One search per pattern; a single alternation of all of them measured no faster.
        self._compiled = [(n, re.compile(p, flags)) for n, p in self.patterns.items()]

    def __call__(self, row: Row) -> Verdict:
        text = assistant_output(row, self.include_reasoning)
        for pname, rx in self._compiled:
            if rx.search(text):
                return False, pname
        return KEEP


# --------------------------------------------------------------------------- length


@_register
class LengthFilter(Filter):
    """Bounds on the assistant output, in characters and in words (``None`` = no bound)."""

    name: ClassVar[str] = "length"
    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(None, ge=1)
    min_words: int = Field(0, ge=0)
    max_words: int | None = Field(None, ge=1)
    include_reasoning: bool = True

    def __call__(self, row: Row) -> Verdict:
        text = assistant_output(row, self.include_reasoning)
        n_chars = len(text)
        n_words = len(text.split()) if (self.min_words or self.max_words is not None) else 0
        if n_chars < self.min_chars or n_words < self.min_words:
            return False, "too_short"
        if (self.max_chars is not None and n_chars > self.max_chars) or (
            self.max_words is not None and n_words > self.max_words
        ):
            return False, "too_long"
        return KEEP


# --------------------------------------------------------------------------- the stack


def check_names(cfg: FiltersConfig) -> None:
    """Every filter ``cfg`` orders or sets options for is registered (a ``ValueError`` naming it).
    The config lives in ``configs/``, which sees no registry, so the stack checks."""
    for name in [*cfg.order, *cfg.options]:
        if name not in FILTERS:
            raise ValueError(f"unknown filter {name!r}; known: {', '.join(FILTERS.names())}")

class FilterStack:
    """Applies filters in order; counts drops by ``"<filter>:<reason>"``."""

    def __init__(self, filters: Sequence[tuple[str, Callable[[Row], Verdict]]]) -> None:
        self.filters = list(filters)
        self.seen = 0
        self.kept = 0
        self.dropped: Counter[str] = Counter()

    @classmethod
    def from_config(cls, cfg: FiltersConfig | None = None) -> "FilterStack":
        cfg = cfg or FiltersConfig()
        check_names(cfg)
        return cls([(n, FILTERS.get(n)(**cfg.options.get(n, {}))) for n in cfg.order])

    def evaluate(self, row: Row) -> str | None:
        """The drop reason of the first failing filter, or None (pure: counts nothing)."""
        for name, f in self.filters:
            keep, reason = f(row)
            if not keep:
                return f"{name}:{reason}"
        return None

    def check(self, row: Row) -> str | None:
        """``evaluate`` and count the outcome."""
        reason = self.evaluate(row)
        self.seen += 1
        if reason is None:
            self.kept += 1
        else:
            self.dropped[reason] += 1
        return reason

    def apply(self, rows: Iterable[Row]) -> list[Row]:
        return [r for r in rows if self.check(r) is None]

    def summary(self) -> dict[str, Any]:
        return {"seen": self.seen, "kept": self.kept, "dropped": dict(self.dropped.most_common())}

"""Pure text helpers shared by the single-turn environments (math, mcq, structured).

Everything here is a typed function of strings, so each rule is unit-tested on hand-made
positives and negatives (tests/unit/test_extract.py) and the verifiers stay a few lines long.
The verifiers call these on ``final_answer_text(messages)``: a ``<think>`` block is removed
before extraction, so reasoning is never graded.

Final math answer — ``extract_math_answer``, rules tried in this order, first hit wins:
  1. the last ``\\boxed{...}`` (nested braces balanced);
  2. the last answer marker ("Answer:", "answer is", "Final answer =", any case); the rest of
     that line up to its first sentence end (". "), or the next non-empty line when the marker
     ends its line; markdown emphasis, ``$...$`` and a final full stop are stripped;
  3. the last number in the text (integer, decimal, fraction ``a/b``, thousands commas), unless
     the text is nothing but several numbers and separators ("1 2 3 4 5 6", "5 or 6": a list of
     candidates, ``is_number_list``), which is no answer.
  Nothing found → ``None`` (the verifier gives reward 0, reason "no_answer").
  Decoration around the answer is removed (``_strip_decoration``): markdown emphasis, ``$``,
  ``\\(..\\)``, a final full stop, wrapping quotes ('The answer is "6".', ‘6’, «6»), one pair of
  wrapping parentheses ("(6)"), a leading "+", and full-width digits (NFKC). Rules 1–2 count as
  following the requested format; rule 3 is a fallback the verifier reports as format 0.

Multiple-choice letter — ``extract_choice``:
  1. the last ``\\boxed{...}``, else the text after the last answer marker ("Answer: B",
     "the answer is b", "the correct option is (C)"), else the last non-empty line when it is a
     lone letter ("B", "(B)", "B.", "B) 12 m/s");
  2. letters in that segment: a leading letter (any case), bracketed or ``X)`` letters (any case),
     and bare capital letters — except after a closed leading letter such as "B)" or "(B)",
     where the rest is option text ("B) 4 kg A ..." names only B);
     A segment that is only single letters joined by separators, "or" or "and" ("a b c d",
     "a or b") counts every letter, in any case; a last line labelled like an option ("D) 12 m/s")
     right after another such line is the option list, not a choice ("ambiguous");
  3. one distinct letter → that letter; several → "ambiguous" (no credit for hedging); none →
     when the options are given and the segment equals one option's text, that option; else
     "no_answer".

JSON payload — ``extract_json``: the content of the single fenced block (```json or a bare
```), text around it ignored; otherwise the whole text. Several fenced blocks → "multiple_json_blocks"
(which one is the answer would be a guess). ``NaN``/``Infinity`` are rejected: they are not JSON.

Task splits — ``take_split`` filters a deterministic candidate stream down to one split, read from
each task's id by ``splits.split_of`` (a hash of its content key), so the same question can never
land in two of train, dev and test, whatever seed or generator stream produced it.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar

from posttrain.envs.splits import check_split, split_of

# --------------------------------------------------------------------------- shared text rules

# "Answer: 5", "the answer is 5", "**Answer**: 5", "Final answer = 5"; multiple choice also
# accepts "the correct option is C" / "choice: C". A dash counts only when spaced ("answer - B"),
# so "answer -5" keeps its sign.
_MARKER_TAIL = r"\b[*_\s]*(?:is\b[*_\s]*:?|:|=|-(?=\s))[*_\s]*"
MATH_MARKER = re.compile(r"\banswer" + _MARKER_TAIL, re.I)
CHOICE_MARKER = re.compile(r"\b(?:answer|option|choice)" + _MARKER_TAIL, re.I)
_BOXED = re.compile(r"\\boxed\s*\{")
_UNICODE_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u2014": "-"})


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces; None if absent or unclosed."""
    for m in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def after_last_marker(text: str, marker: re.Pattern[str] = MATH_MARKER) -> str | None:
    """The text after the last answer marker on its line (or the next non-empty line)."""
    matches = list(marker.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():]
    line, _, tail = rest.partition("\n")
    if line.strip(" \t*_$"):
        return line.strip()
    for nxt in tail.split("\n"):
        if nxt.strip():
            return nxt.strip()
    return None


# Quote marks that may wrap a whole answer: "6", '6', “6”, ‘6’, «6», „6“.
_QUOTE_PAIRS = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb",
                "\u201e": "\u201c"}


def _strip_decoration(s: str) -> str:
    """Remove markdown emphasis, math delimiters, wrapping quotes or parentheses and a trailing
    full stop around an answer."""
    s = unicodedata.normalize("NFKC", s).translate(_UNICODE_MINUS).strip()
    for _ in range(4):  # decorations nest: "**$42$**.", '**"6"**.'
        s = s.strip().strip("*_`").strip()
        s = re.sub(r"^\\[\[(]|\\[\])]$", "", s).strip()
        if len(s) >= 2 and s[0] == s[-1] == "$":
            s = s.strip("$").strip()
        s = re.sub(r"\.$", "", s).strip()
        if len(s) >= 2 and _QUOTE_PAIRS.get(s[0]) == s[-1]:
            s = s[1:-1].strip()
        if len(s) >= 2 and s[0] == "(" and s[-1] == ")" and "(" not in s[1:-1] and ")" not in s[1:-1]:
            s = s[1:-1].strip()  # "(6)"; "(2, 3)" stays a pair and is not a number
    # "- 3" is read as 3 by math_verify; a leading sign belongs to the number; "+6" is 6.
    s = re.sub(r"^\+\s*(?=\d)", "", s)
    return re.sub(r"^-\s+(?=\d)", "-", s)


# --------------------------------------------------------------------------- math answers


@dataclass(frozen=True)
class MathAnswer:
    text: str
    rule: str  # "boxed" | "answer_marker" | "last_number"

    @property
    def formatted(self) -> bool:
        """Did the model mark its answer as asked (rather than us guessing the last number)?"""
        return self.rule != "last_number"


_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?")


def extract_math_answer(text: str) -> MathAnswer | None:
    """The final answer in a math reply (rule order in the module docstring), or None."""
    text = text.translate(_UNICODE_MINUS)
    boxed = last_boxed(text)
    if boxed:
        return MathAnswer(_strip_decoration(boxed), "boxed")
    marked = after_last_marker(text)
    if marked is not None:
        # Keep the first sentence: "$42$. I hope it is correct." grades "$42$", while a period
        # inside a decimal ("3.5") has no space after it.
        inner = last_boxed(marked) or re.split(r"\.\s", marked, maxsplit=1)[0]
        cleaned = _strip_decoration(inner)
        if cleaned:
            return MathAnswer(cleaned, "answer_marker")
    numbers = _NUMBER.findall(text)
    if len(numbers) > 1 and is_number_list(text):
        return None  # "1 2 3 4 5 6" lists candidates; it does not commit to one
    if numbers:
        return MathAnswer(re.sub(r"\s+", "", numbers[-1]), "last_number")
    return None


def is_number_list(text: str) -> bool:
    """True when ``text`` is nothing but numbers and separators (spaces, punctuation, "or",
    "and"): a list of candidates such as "1 2 3 4 5 6" or "5 or 6", not an answer."""
    rest = _NUMBER.sub(" ", unicodedata.normalize("NFKC", text))
    rest = re.sub(r"\b(?:or|and)\b", " ", rest, flags=re.I)
    return not re.search(r"[^\s,;.:|/()\[\]{}*_`$-]", rest)


# --------------------------------------------------------------------------- multiple choice


@dataclass(frozen=True)
class Choice:
    letter: str | None
    reason: str  # "ok" | "no_answer" | "ambiguous"


_LEAD = re.compile(r"^[\s*_(\[{]*([A-Za-z])(?![A-Za-z0-9'])\s*([)\]}.:]?)")
_BRACKETED = re.compile(r"[(\[]\s*([A-Za-z])\s*[)\]]|(?<![A-Za-z0-9])([A-Za-z])\)")
_BARE_CAPITAL = re.compile(r"(?<![A-Za-z0-9'])([A-Z])(?![A-Za-z0-9'])")
# A segment that is nothing but single letters joined by punctuation, spaces, "or" / "and".
_LIST_SEP = r"[\s.,;:/|()\[\]{}*_-]+"
_LETTER_LIST = re.compile(
    rf"[\s*_(\[{{]*[A-Za-z](?:{_LIST_SEP}(?:(?:or|and){_LIST_SEP})?[A-Za-z])+[\s.,;:)\]}}*_!?]*", re.I)
_LONE_LETTER = re.compile(r"^[\s*_(\[{]*[A-Za-z]\s*[)\]}.:]?[\s*_]*$")


def _normalise_option(s: str) -> str:
    return re.sub(r"\s+", " ", _strip_decoration(s)).lower()


def _letters_in(segment: str, valid: str) -> set[str]:
    found: set[str] = set()
    rest = segment
    closed = False
    lead = _LEAD.match(segment)
    if lead and lead.group(1).upper() in valid:
        found.add(lead.group(1).upper())
        bracketed = segment[: lead.start(1)].rstrip().endswith(("(", "["))
        closed = bool(lead.group(2)) or bracketed
        rest = segment[lead.end():]
    for a, b in _BRACKETED.findall(rest):
        found.add((a or b).upper())
    if not closed:
        found.update(_BARE_CAPITAL.findall(rest))
    return {x for x in found if x in valid}


def _labels_option(line: str, valid: str) -> bool:
    """Does ``line`` start like an option label ("C) 161 m/s", "(C) ...")?"""
    lead = _LEAD.match(line)
    return bool(lead and lead.group(1).upper() in valid
                and (lead.group(2) or line.lstrip(" *_").startswith(("(", "["))))


def extract_choice(
    text: str, valid: str = "ABCD", options: Mapping[str, str] | None = None
) -> Choice:
    """The option letter a reply commits to (rules in the module docstring)."""
    segment = last_boxed(text)
    if segment is None:
        segment = after_last_marker(text, CHOICE_MARKER)
    if segment is None:
        lines = [ln for ln in text.strip().split("\n") if ln.strip()]
        last = lines[-1] if lines else ""
        lead = _LEAD.match(last)
        is_lone = bool(_LONE_LETTER.match(last))
        starts_closed = bool(lead and (lead.group(2) or last.lstrip(" *_").startswith(("(", "["))))
        if not (is_lone or starts_closed):
            return Choice(None, "no_answer")
        if len(lines) > 1 and starts_closed and _labels_option(lines[-2], valid):
            return Choice(None, "ambiguous")  # "C) ...\nD) ...": the options listed, not one chosen
        segment = last
    listed = _LETTER_LIST.fullmatch(segment.strip())
    if listed:  # "a b c d", "a or b", "b. or c": a list of letters in any case hedges
        letters = {x.upper() for x in re.findall(r"[A-Za-z]+", segment)
                   if len(x) == 1 and x.upper() in valid}
    else:
        letters = _letters_in(segment, valid)
    if len(letters) == 1:
        return Choice(letters.pop(), "ok")
    if len(letters) > 1:
        return Choice(None, "ambiguous")
    if options:
        target = _normalise_option(segment)
        hits = [k for k, v in options.items() if _normalise_option(v) == target]
        if len(hits) == 1:
            return Choice(hits[0], "ok")
    return Choice(None, "no_answer")


# --------------------------------------------------------------------------- JSON payloads


@dataclass(frozen=True)
class JsonPayload:
    ok: bool
    value: Any = None
    reason: str = "ok"


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)\n?[ \t]*```", re.S)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def extract_json(text: str) -> JsonPayload:
    """Parse the JSON a reply gives (the fence rule is in the module docstring)."""
    fences = _FENCE.findall(text)
    if len(fences) > 1:
        return JsonPayload(False, reason="multiple_json_blocks")
    payload = (fences[0] if fences else text).strip()
    if not payload:
        return JsonPayload(False, reason="empty_output")
    try:
        return JsonPayload(True, json.loads(payload, parse_constant=_reject_constant))
    except json.JSONDecodeError as e:
        return JsonPayload(False, reason=f"invalid_json: {e.msg} (line {e.lineno}, column {e.colno})")
    except (ValueError, RecursionError) as e:
        return JsonPayload(False, reason=f"invalid_json: {str(e)[:80]}")


# --------------------------------------------------------------------------- splits

T = TypeVar("T")


def content_id(prefix: str, key: str) -> str:
    """A short stable task id derived from the content key (so ids and splits agree)."""
    return f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def take_split(candidates: Iterable[T], split: str, n: int, id_of: Callable[[T], str]) -> list[T]:
    """The first ``n`` candidates of ``split`` with distinct ids, in stream order.

    Split membership is read from the id (``split_of(id)``). Raises if the stream runs dry
    first: a short task list would silently change the domain mix downstream.
    """
    check_split(split)
    out: list[T] = []
    seen: set[str] = set()
    for c in candidates:
        if len(out) >= n:
            break
        tid = id_of(c)
        if tid in seen or split_of(tid) != split:
            continue
        seen.add(tid)
        out.append(c)
    if len(out) < n:
        raise ValueError(f"only {len(out)} distinct {split} tasks could be generated, asked for {n}")
    return out

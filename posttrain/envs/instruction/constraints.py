"""Verifiable instruction constraints (IFEval / IFBench style) and their registry.

Each constraint type is a small frozen dataclass registered in ``CONSTRAINTS`` under its ``kind``:

* its fields are the parameters (``WordCount(low=50, high=None)``);
* ``describe()`` is the instruction a user would write ("Answer with at least 50 words.");
* ``evaluate(text)`` is a pure check returning ``Check(ok, reason)``; ``check(text)`` is its bool;
* ``sample(rng, keywords)`` draws parameters (``keywords`` are words related to the task's topic,
  used by the keyword constraint so its instruction reads naturally);
* ``conflicts`` names the kinds it cannot be combined with. Conflicts are declared on one side and
  read symmetrically by ``conflicting``; task generation never puts two conflicting kinds together
  (tested), and ``writer.write_response`` proves each sampled combination satisfiable by
  constructing a response that passes every check.
* ``shape(draft)`` tells the scripted writer (``writer.py``) how to satisfy the constraint.
  Counting constraints (words, sentences, letters) have no shape: the writer meets them by adding
  filler sentences until every check passes.

Where a check needs a definition, it follows IFEval, made stricter where IFEval is loose:
words are ``\\w+`` runs (apostrophes join), sentences end at ``.``/``!``/``?`` or a blank line,
keyword matching is whole-word and case-insensitive, start/end phrases compare case-insensitively
(so they combine with all-lowercase / all-uppercase), sections must be numbered 1..N in order.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from posttrain.registry import Registry

if TYPE_CHECKING:
    from posttrain.envs.instruction.writer import Draft


@dataclass(frozen=True)
class Check:
    ok: bool
    reason: str


class Constraint:
    """Base class. Subclasses are frozen dataclasses whose fields are the parameters."""

    kind: ClassVar[str] = ""
    conflicts: ClassVar[frozenset[str]] = frozenset()

    def describe(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def evaluate(self, text: str) -> Check:  # pragma: no cover - interface
        raise NotImplementedError

    def check(self, text: str) -> bool:
        return self.evaluate(text).ok

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> "Constraint":
        return cls()

    def shape(self, draft: "Draft") -> None:
        """Adjust the scripted writer's draft; counting constraints leave it to the fill loop."""

    def to_dict(self) -> dict[str, Any]:
        params = asdict(self)  # type: ignore[call-overload]
        return {"kind": self.kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}}


CONSTRAINTS: Registry[type[Constraint]] = Registry("constraint")


def register(cls: type[Constraint]) -> type[Constraint]:
    return CONSTRAINTS.register(cls.kind)(cls)


def constraint_from_dict(d: dict[str, Any]) -> Constraint:
    d = dict(d)
    cls = CONSTRAINTS.get(d.pop("kind"))
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
    return cls(**params)


def conflicting(a: str, b: str) -> bool:
    """Two kinds conflict if either declares the other (a kind also 'conflicts' with itself:
    a task holds at most one constraint of each kind)."""
    return a == b or b in CONSTRAINTS.get(a).conflicts or a in CONSTRAINTS.get(b).conflicts


def compatible(kind: str, kinds: Sequence[str]) -> bool:
    return not any(conflicting(kind, k) for k in kinds)


def sample_constraints(
    rng: random.Random, n: int, keywords: Sequence[str], exclude: Sequence[str] = ()
) -> list[Constraint]:
    """``n`` constraints of distinct, mutually compatible kinds (also compatible with ``exclude``)."""
    chosen: list[Constraint] = []
    kinds = list(exclude)
    candidates = CONSTRAINTS.names()
    rng.shuffle(candidates)
    for kind in candidates:
        if len(chosen) == n:
            break
        if compatible(kind, kinds):
            chosen.append(CONSTRAINTS.get(kind).sample(rng, keywords))
            kinds.append(kind)
    if len(chosen) < n:
        raise ValueError(f"cannot find {n} compatible constraints besides {list(exclude)}")
    return chosen


# --------------------------------------------------------------------------- text measures

_WORD_RE = re.compile(r"\w+(?:['’]\w+)*")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_BULLET_RE = re.compile(r"^\s*[*\-•]\s+\S", re.M)
_PLACEHOLDER_RE = re.compile(r"\[[^\[\]\n]+\]")
_TITLE_RE = re.compile(r"<<[^<>\n]*\w[^<>\n]*>>")
_HIGHLIGHT_RE = re.compile(r"\*[^\s*](?:[^\n*]*[^\s*])?\*")  # "*x*" but not a "* bullet" marker
_CAPITAL_WORD_RE = re.compile(r"\b[A-Z]{2,}\b")
_JSON_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*(.*?)\s*```", re.S)


def count_words(text: str) -> int:
    return len(_WORD_RE.findall(text))


def count_sentences(text: str) -> int:
    return sum(1 for s in _SENTENCE_SPLIT_RE.split(text.strip()) if re.search(r"\w", s))


def count_keyword(text: str, keyword: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(keyword)}(?!\w)", text, re.I))


def _bounds_phrase(low: int | None, high: int | None, unit: str) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high} {unit}"
    if low is not None:
        return f"at least {low} {unit}"
    return f"at most {high} {unit}"


def _within(n: int, low: int | None, high: int | None) -> bool:
    return (low is None or n >= low) and (high is None or n <= high)


def _plural(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _quote_list(words: Sequence[str]) -> str:
    quoted = [f'"{w}"' for w in words]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


# --------------------------------------------------------------------------- pools
# Phrase pools are disjoint from FORBIDDEN_WORDS and contain no commas, so any sampled combination
# stays satisfiable (checked in the tests).

FORBIDDEN_WORDS = (
    "very", "really", "basically", "actually", "literally", "stuff", "nice", "amazing",
    "awesome", "totally", "simply", "honestly", "perhaps", "obviously", "definitely",
)
START_PHRASES = (  # the writer follows each with "." so they read as short sentences
    "Here is my answer", "Dear reader", "Hello everyone", "Good day to you", "Let me begin",
)
END_PHRASES = (
    "Is there anything else I can help with?", "Let me know if you have additional questions.",
    "Thank you for reading.", "That is all for now.", "Any other questions?",
)
POSTSCRIPT_MARKERS = ("P.S.", "P.P.S.")
SECTION_MARKERS = ("SECTION", "PART")
FREQUENT_LETTERS = "eatonsril"


# --------------------------------------------------------------------------- length


@register
@dataclass(frozen=True)
class WordCount(Constraint):
    kind: ClassVar[str] = "word_count"
    low: int | None = None
    high: int | None = None

    def describe(self) -> str:
        return f"Your response should contain {_bounds_phrase(self.low, self.high, 'words')}."

    def evaluate(self, text: str) -> Check:
        n = count_words(text)
        return Check(_within(n, self.low, self.high), f"{n} words, needs {_bounds_phrase(self.low, self.high, 'words')}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        relation = rng.choice(("at_least", "at_most", "between"))
        if relation == "at_least":
            return cls(low=rng.choice((30, 50, 80, 100, 150)))
        if relation == "at_most":
            return cls(high=rng.choice((120, 150, 200, 250, 300)))
        low = rng.choice((40, 60, 80, 100))
        return cls(low=low, high=low + rng.choice((80, 100, 150)))


@register
@dataclass(frozen=True)
class SentenceCount(Constraint):
    kind: ClassVar[str] = "sentence_count"
    conflicts: ClassVar[frozenset[str]] = frozenset({"bullet_count", "postscript", "json_format"})
    low: int | None = None
    high: int | None = None

    def describe(self) -> str:
        unit = "sentences (a sentence ends with '.', '!' or '?')"
        return f"Your response should contain {_bounds_phrase(self.low, self.high, unit)}."

    def evaluate(self, text: str) -> Check:
        n = count_sentences(text)
        return Check(_within(n, self.low, self.high), f"{n} sentences, needs {_bounds_phrase(self.low, self.high, 'sentences')}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        relation = rng.choice(("at_least", "at_most", "between"))
        if relation == "at_least":
            return cls(low=rng.randint(3, 10))
        if relation == "at_most":
            return cls(high=rng.randint(12, 20))
        low = rng.randint(4, 8)
        return cls(low=low, high=low + rng.randint(6, 10))


@register
@dataclass(frozen=True)
class ParagraphCount(Constraint):
    kind: ClassVar[str] = "paragraph_count"
    conflicts: ClassVar[frozenset[str]] = frozenset({"section_count", "postscript", "json_format"})
    n: int = 2
    separator: str = "***"  # "***" (markdown divider) or "blank_line"

    def describe(self) -> str:
        how = ("Separate paragraphs with the markdown divider: ***" if self.separator == "***"
               else "Separate paragraphs from each other with one blank line.")
        return f"There should be exactly {self.n} paragraphs. {how}"

    def evaluate(self, text: str) -> Check:
        if self.separator == "***":
            parts = [p.strip() for p in re.split(r"\s*\*\*\*\s*", text.strip())]
            inner = parts[1:-1]
            if any(not p for p in inner):
                return Check(False, "an empty paragraph between two *** dividers")
            parts = [p for p in parts if p]
        else:
            parts = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
        return Check(len(parts) == self.n, f"{len(parts)} paragraphs, needs exactly {self.n}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(n=rng.randint(2, 4), separator=rng.choice(("***", "blank_line")))

    def shape(self, draft: "Draft") -> None:
        draft.blocks = self.n
        draft.block_separator = "\n\n***\n\n" if self.separator == "***" else "\n\n"


# --------------------------------------------------------------------------- keywords


@register
@dataclass(frozen=True)
class KeywordsRequired(Constraint):
    kind: ClassVar[str] = "keywords_required"
    keywords: tuple[str, ...] = ()
    min_count: int = 1

    def describe(self) -> str:
        each = " each" if len(self.keywords) > 1 else ""
        times = "" if self.min_count == 1 else f" at least {self.min_count} times{each}"
        noun = "the keyword" if len(self.keywords) == 1 else "the keywords"
        return f"Include {noun} {_quote_list(self.keywords)}{times} in your response."

    def evaluate(self, text: str) -> Check:
        short = [f"{k!r} x{c}" for k in self.keywords if (c := count_keyword(text, k)) < self.min_count]
        return Check(not short, f"too few: {', '.join(short)}" if short else "all keywords present")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        if rng.random() < 0.5:
            return cls(keywords=tuple(rng.sample(list(keywords), 2)), min_count=1)
        return cls(keywords=(rng.choice(list(keywords)),), min_count=rng.randint(2, 3))

    def shape(self, draft: "Draft") -> None:
        for keyword in self.keywords:
            draft.sentences.extend(draft.keyword_sentences(keyword, self.min_count))


@register
@dataclass(frozen=True)
class KeywordsForbidden(Constraint):
    kind: ClassVar[str] = "keywords_forbidden"
    keywords: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"Do not include the words {_quote_list(self.keywords)} in your response."

    def evaluate(self, text: str) -> Check:
        found = [k for k in self.keywords if count_keyword(text, k)]
        return Check(not found, f"forbidden words used: {', '.join(found)}" if found else "none used")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(keywords=tuple(rng.sample(FORBIDDEN_WORDS, 2)))


@register
@dataclass(frozen=True)
class LetterFrequency(Constraint):
    kind: ClassVar[str] = "letter_frequency"
    letter: str = "e"
    min_count: int = 5

    def describe(self) -> str:
        return f"In your response, the letter '{self.letter}' should appear at least {self.min_count} times."

    def evaluate(self, text: str) -> Check:
        n = text.lower().count(self.letter)
        return Check(n >= self.min_count, f"letter '{self.letter}' x{n}, needs at least {self.min_count}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(letter=rng.choice(FREQUENT_LETTERS), min_count=rng.randint(5, 15))


@register
@dataclass(frozen=True)
class CapitalWordFrequency(Constraint):
    kind: ClassVar[str] = "capital_word_frequency"
    conflicts: ClassVar[frozenset[str]] = frozenset({"all_lowercase", "all_uppercase"})
    min_count: int = 2

    def describe(self) -> str:
        return (f"Use words written entirely in capital letters (two or more letters, like IMPORTANT) "
                f"at least {self.min_count} times.")

    def evaluate(self, text: str) -> Check:
        n = len(_CAPITAL_WORD_RE.findall(text))
        return Check(n >= self.min_count, f"{n} all-capital words, needs at least {self.min_count}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(min_count=rng.randint(2, 4))

    def shape(self, draft: "Draft") -> None:
        draft.sentences.append(draft.capital_sentence(self.min_count))


@register
@dataclass(frozen=True)
class Placeholders(Constraint):
    kind: ClassVar[str] = "placeholders"
    min_count: int = 1

    def describe(self) -> str:
        return (f"The response must contain at least {_plural(self.min_count, 'placeholder')} in square "
                "brackets, such as [address].")

    def evaluate(self, text: str) -> Check:
        n = len(_PLACEHOLDER_RE.findall(text))
        return Check(n >= self.min_count, f"{n} placeholders, needs at least {self.min_count}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(min_count=rng.randint(1, 3))

    def shape(self, draft: "Draft") -> None:
        draft.sentences.append(draft.placeholder_sentence(self.min_count))


@register
@dataclass(frozen=True)
class Highlights(Constraint):
    kind: ClassVar[str] = "highlights"
    conflicts: ClassVar[frozenset[str]] = frozenset({"json_format"})
    min_count: int = 1

    def describe(self) -> str:
        return (f"Highlight at least {_plural(self.min_count, 'part')} of your answer with markdown, "
                "for example *highlighted section*.")

    def evaluate(self, text: str) -> Check:
        n = len(_HIGHLIGHT_RE.findall(text))
        return Check(n >= self.min_count, f"{n} highlighted parts, needs at least {self.min_count}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(min_count=rng.randint(1, 3))

    def shape(self, draft: "Draft") -> None:
        draft.sentences.append(draft.highlight_sentence(self.min_count))


# --------------------------------------------------------------------------- structure


@register
@dataclass(frozen=True)
class BulletCount(Constraint):
    kind: ClassVar[str] = "bullet_count"
    conflicts: ClassVar[frozenset[str]] = frozenset({"json_format"})
    n: int = 3

    def describe(self) -> str:
        return (f"Your answer must contain exactly {self.n} bullet points. Use markdown bullet points "
                "such as: * This is a point.")

    def evaluate(self, text: str) -> Check:
        n = len(_BULLET_RE.findall(text))
        return Check(n == self.n, f"{n} bullet points, needs exactly {self.n}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(n=rng.randint(2, 5))

    def shape(self, draft: "Draft") -> None:
        draft.bullets = self.n


@register
@dataclass(frozen=True)
class SectionCount(Constraint):
    kind: ClassVar[str] = "section_count"
    conflicts: ClassVar[frozenset[str]] = frozenset({"all_lowercase", "json_format"})
    n: int = 2
    marker: str = "SECTION"

    def describe(self) -> str:
        return (f"Your response must have exactly {self.n} sections. Begin each section with a line "
                f"'{self.marker} X' numbered from 1, such as: {self.marker} 1")

    def evaluate(self, text: str) -> Check:
        # Markdown decoration before the marker is fine ("## SECTION 1", "**SECTION 1**").
        pattern = re.compile(rf"^[^\w\n]*{re.escape(self.marker)}\s+(\d+)\b[^\n]*$", re.M)
        numbers = [int(m.group(1)) for m in pattern.finditer(text)]
        if numbers != list(range(1, self.n + 1)):
            return Check(False, f"section markers {numbers}, needs {self.marker} 1..{self.n}")
        bodies = pattern.split(text)[2::2]  # split() interleaves the captured numbers
        if any(not re.search(r"\w", b) for b in bodies):
            return Check(False, "an empty section")
        return Check(True, f"{self.n} sections")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(n=rng.randint(2, 4), marker=rng.choice(SECTION_MARKERS))

    def shape(self, draft: "Draft") -> None:
        draft.blocks = self.n
        draft.section_marker = self.marker


@register
@dataclass(frozen=True)
class JsonFormat(Constraint):
    kind: ClassVar[str] = "json_format"
    # JSON-only output leaves no room for prose layout, wrappers, or a comma-free text.
    conflicts: ClassVar[frozenset[str]] = frozenset({
        "title", "start_phrase", "end_phrase", "quotation", "postscript", "no_commas",
        "all_uppercase", "capital_word_frequency",
    })

    def describe(self) -> str:
        return ("Your entire output should be a single JSON object; you may wrap it in markdown "
                "ticks such as ```.")

    def evaluate(self, text: str) -> Check:
        s = text.strip()
        fence = _JSON_FENCE_RE.fullmatch(s)
        if fence:
            s = fence.group(1)
        try:
            value = json.loads(s)
        except (json.JSONDecodeError, RecursionError) as e:
            return Check(False, f"not valid JSON: {str(e)[:60]}")
        return Check(isinstance(value, dict), "a JSON object" if isinstance(value, dict) else "JSON but not an object")

    def shape(self, draft: "Draft") -> None:
        draft.as_json = True


# --------------------------------------------------------------------------- case and punctuation


@register
@dataclass(frozen=True)
class AllLowercase(Constraint):
    kind: ClassVar[str] = "all_lowercase"
    # P.S. markers are capitals by definition.
    conflicts: ClassVar[frozenset[str]] = frozenset({"all_uppercase", "postscript"})

    def describe(self) -> str:
        return "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."

    def evaluate(self, text: str) -> Check:
        if not re.search(r"[^\W\d_]", text):
            return Check(False, "no letters at all")
        return Check(text == text.lower(), "all lowercase" if text == text.lower() else "has capital letters")

    def shape(self, draft: "Draft") -> None:
        draft.case = "lower"


@register
@dataclass(frozen=True)
class AllUppercase(Constraint):
    kind: ClassVar[str] = "all_uppercase"

    def describe(self) -> str:
        return "Your entire response should be in English, and in all capital letters."

    def evaluate(self, text: str) -> Check:
        if not re.search(r"[^\W\d_]", text):
            return Check(False, "no letters at all")
        return Check(text == text.upper(), "all uppercase" if text == text.upper() else "has lowercase letters")

    def shape(self, draft: "Draft") -> None:
        draft.case = "upper"


@register
@dataclass(frozen=True)
class NoCommas(Constraint):
    kind: ClassVar[str] = "no_commas"

    def describe(self) -> str:
        return "In your entire response, refrain from the use of any commas."

    def evaluate(self, text: str) -> Check:
        n = text.count(",")
        return Check(n == 0, f"{n} commas" if n else "no commas")

    def shape(self, draft: "Draft") -> None:
        draft.no_commas = True


# --------------------------------------------------------------------------- wrappers


@register
@dataclass(frozen=True)
class Title(Constraint):
    kind: ClassVar[str] = "title"
    conflicts: ClassVar[frozenset[str]] = frozenset({"start_phrase"})

    def describe(self) -> str:
        return "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."

    def evaluate(self, text: str) -> Check:
        ok = bool(_TITLE_RE.search(text))
        return Check(ok, "has a <<title>>" if ok else "no <<title>>")

    def shape(self, draft: "Draft") -> None:
        draft.title = True


@register
@dataclass(frozen=True)
class StartPhrase(Constraint):
    kind: ClassVar[str] = "start_phrase"
    conflicts: ClassVar[frozenset[str]] = frozenset({"quotation"})
    phrase: str = START_PHRASES[0]

    def describe(self) -> str:
        return f"Start your response with the exact phrase '{self.phrase}'."

    def evaluate(self, text: str) -> Check:
        ok = text.strip().lower().startswith(self.phrase.lower())
        return Check(ok, "starts with the phrase" if ok else f"does not start with {self.phrase!r}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(phrase=rng.choice(START_PHRASES))

    def shape(self, draft: "Draft") -> None:
        draft.start = self.phrase


@register
@dataclass(frozen=True)
class EndPhrase(Constraint):
    kind: ClassVar[str] = "end_phrase"
    conflicts: ClassVar[frozenset[str]] = frozenset({"quotation", "postscript"})
    phrase: str = END_PHRASES[0]

    def describe(self) -> str:
        return f"Finish your response with this exact phrase: '{self.phrase}' No other words should follow it."

    def evaluate(self, text: str) -> Check:
        ok = text.strip().lower().endswith(self.phrase.lower())
        return Check(ok, "ends with the phrase" if ok else f"does not end with {self.phrase!r}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(phrase=rng.choice(END_PHRASES))

    def shape(self, draft: "Draft") -> None:
        draft.end = self.phrase


@register
@dataclass(frozen=True)
class Quotation(Constraint):
    kind: ClassVar[str] = "quotation"

    def describe(self) -> str:
        return "Wrap your entire response with double quotation marks."

    def evaluate(self, text: str) -> Check:
        s = text.strip()
        ok = len(s) > 2 and s[0] == '"' and s[-1] == '"'
        return Check(ok, "wrapped in quotes" if ok else "not wrapped in double quotes")

    def shape(self, draft: "Draft") -> None:
        draft.quote = True


@register
@dataclass(frozen=True)
class Postscript(Constraint):
    kind: ClassVar[str] = "postscript"
    marker: str = POSTSCRIPT_MARKERS[0]

    def describe(self) -> str:
        return f"At the end of your response, please explicitly add a postscript starting with {self.marker}"

    def evaluate(self, text: str) -> Check:
        ok = bool(re.search(rf"^\W*{re.escape(self.marker)}[^\n]*\w", text, re.M))
        return Check(ok, "has a postscript" if ok else f"no line starting with {self.marker}")

    @classmethod
    def sample(cls, rng: random.Random, keywords: Sequence[str]) -> Constraint:
        return cls(marker=rng.choice(POSTSCRIPT_MARKERS))

    def shape(self, draft: "Draft") -> None:
        draft.postscript = self.marker

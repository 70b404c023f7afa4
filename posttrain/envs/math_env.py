"""Math environment (docs/recipe.md §2.1): binary reward for the correct final answer.

Tasks come from reasoning-gym generators (offline, procedural), arranged as *families* with three
difficulty levels each, so a curriculum has easy tasks to start from: the embedded 135M model
solves about 56% of one-digit additions but about 6% of two-digit ones, hence the "addition"
family with 1-, 2- and 3-digit operands and the heavier weight on level 1. Every task records
``metadata["difficulty"]`` (1 easy .. 3 hard) and a human-readable ``difficulty_note``.

Task stream: for one ``seed``, each (family, level) is an endless reasoning-gym dataset stream; a
seeded RNG picks which stream yields next, by weight. A stream that keeps repeating questions
(one-digit addition has only 121 distinct sums) is dropped from the mix, so small pools run dry
instead of duplicating. The task id is a hash of the question text, and the split is a hash of the
id (``splits.split_of``): a question is in one of train, dev and test for every seed.

Grading: ``extract_math_answer`` (rule order documented in extract.py) on the reply with its
``<think>`` block removed; then the answer must be a number literal of the family's form, and
math_verify ``parse`` + ``verify`` must find that literal equivalent to the reference ("1/2" =
"0.5" = "\\frac{2}{4}").

Answer form: equivalence alone would pay for echoing the question ("Answer: 6 + 9*-5" equals -39;
"Answer: 20/25" equals 4/5), so the answer must be one number literal (integer, decimal, ``a/b``
or ``\\frac{a}{b}``), optionally after "x =" and before a unit word ("12 apples"), else reason
"not_a_number"; families may ask more (``ANSWER_FORMS``, in ``metadata["answer_form"]``):
"lowest_terms" = an integer or a fraction with coprime terms, else "not_in_lowest_terms".

Timeouts: math_verify's own use ``signal.alarm``, which fails off the main thread (HTTP servers,
Ray workers, thread pools) and would clobber any other SIGALRM user, so they are switched off
(``parsing_timeout=None``, ``timeout_seconds=None``). That is safe because sympy only ever sees
the number literal (at most ``MAX_ANSWER_CHARS`` characters), never an arbitrary expression
such as ``10^10^10``, which would hang ``verify``.

Echoes: when the answer is the last-number fallback, that number must not be the end of a span
copied from the prompt (``copied_number``: its last ``ECHO_TOKENS`` = 3 tokens, number included,
occur in that order in the prompt), else reason "echoes_question". Repeating the question
("What is the LCM of 3 and 12?") otherwise scored 1.0 on 95 of 2,000 training tasks, whenever the
question's last number was the answer.

Components: ``format`` = 1 when the answer was marked as asked (boxed or "Answer:"), 0 when we fell
back to the last number; ``correct`` = the reward.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from posttrain.envs.base import (
    ENVIRONMENTS,
    Environment,
    Message,
    Split,
    Task,
    VerifyResult,
    final_answer_text,
)
from posttrain.envs.extract import content_id, extract_math_answer, take_split

ANSWER_INSTRUCTION = 'Show your work if it helps, then give your final answer on the last line as "Answer: <answer>".'
MAX_ANSWER_CHARS = 200
DEFAULT_N = {"train": 5000, "dev": 500, "test": 500}
LEVEL_WEIGHT = {1: 0.5, 2: 0.3, 3: 0.2}  # easy-heavy: a curriculum needs tasks the model can solve
_CHUNK = 1000  # reasoning-gym dataset size per chunk of a stream (item i uses Random(seed + i))
_MAX_REPEATS = 200  # consecutive repeated questions before a stream counts as exhausted


@dataclass(frozen=True)
class Level:
    config: dict[str, Any]
    note: str


@dataclass(frozen=True)
class Family:
    """One kind of problem: a reasoning-gym dataset and its config at each difficulty level."""

    dataset: str
    weight: float
    levels: dict[int, Level]
    answer_form: str = "number"  # a key of ANSWER_FORMS


_ADD = dict(min_terms=2, max_terms=2, operators=("+",), allow_parentheses=False, allow_negation=False)
_MIXED = dict(operators=("+", "-", "*"), allow_parentheses=True, allow_negation=False)

FAMILIES: dict[str, Family] = {
    "addition": Family("basic_arithmetic", 3.0, {
        1: Level(dict(_ADD, min_digits=1, max_digits=1), "two 1-digit operands (0-10)"),
        2: Level(dict(_ADD, min_digits=2, max_digits=2), "two 2-digit operands (0-100)"),
        3: Level(dict(_ADD, min_digits=3, max_digits=3), "two 3-digit operands (0-1000)"),
    }),
    "chain_sum": Family("chain_sum", 1.0, {
        1: Level(dict(min_terms=3, max_terms=3, min_digits=1, max_digits=1), "3 one-digit terms"),
        2: Level(dict(min_terms=3, max_terms=4, min_digits=2, max_digits=2), "3-4 two-digit terms"),
        3: Level(dict(min_terms=4, max_terms=5, min_digits=3, max_digits=3), "4-5 three-digit terms"),
    }),
    "multiplication": Family("products", 1.0, {
        1: Level(dict(min_digits=1, max_digits=1), "1-digit factors"),
        2: Level(dict(min_digits=2, max_digits=2), "2-digit factors"),
        3: Level(dict(min_digits=3, max_digits=3), "3-digit factors"),
    }),
    "mixed_arithmetic": Family("basic_arithmetic", 1.0, {
        1: Level(dict(_MIXED, min_terms=2, max_terms=3, min_digits=1, max_digits=1), "2-3 one-digit terms, + - * and brackets"),
        2: Level(dict(_MIXED, min_terms=3, max_terms=4, min_digits=2, max_digits=2), "3-4 two-digit terms, + - * and brackets"),
    }),
    "linear_equation": Family("simple_equations", 1.0, {
        1: Level(dict(min_terms=2, max_terms=2, max_value=10), "ax + b = c, values up to 10"),
        2: Level(dict(min_terms=2, max_terms=3, max_value=30), "2-3 terms, values up to 30"),
        3: Level(dict(min_terms=3, max_terms=4, max_value=100), "3-4 terms, values up to 100"),
    }),
    "gcd": Family("gcd", 0.5, {
        1: Level(dict(max_value=30), "two numbers up to 30"),
        2: Level(dict(max_value=100), "two numbers up to 100"),
        3: Level(dict(max_value=1000), "two numbers up to 1000"),
    }),
    "lcm": Family("lcm", 0.5, {
        1: Level(dict(max_value=12), "two numbers up to 12"),
        2: Level(dict(max_value=30), "two numbers up to 30"),
        3: Level(dict(max_value=100), "two numbers up to 100"),
    }),
    "fraction_simplification": Family("fraction_simplification", 0.5, answer_form="lowest_terms", levels={
        1: Level(dict(max_value=10, min_factor=2, max_factor=5), "terms up to 10, common factor up to 5"),
        2: Level(dict(max_value=30, min_factor=2, max_factor=10), "terms up to 30, common factor up to 10"),
        3: Level(dict(max_value=1000, min_factor=2, max_factor=100), "terms up to 1000, common factor up to 100"),
    }),
    "leg_counting": Family("leg_counting", 0.5, {
        1: Level(dict(min_animals=2, max_animals=2, max_instances=3), "2 kinds of animal, up to 3 each"),
        2: Level(dict(min_animals=3, max_animals=5, max_instances=8), "3-5 kinds, up to 8 each"),
        3: Level(dict(min_animals=6, max_animals=10, max_instances=15), "6-10 kinds, up to 15 each"),
    }),
    "word_problem": Family("gsm_symbolic", 0.5, {
        3: Level({}, "GSM8K-style word problem (templated)"),
    }),
}


def operands(question: str) -> list[int]:
    """The whole numbers of a question's first line ("... of these numbers: 94, 36" → [94, 36])."""
    return [int(x) for x in re.findall(r"\d+", question.strip().split("\n")[0])]


# Answers that need less than the family's skill, by family: name → the answer it gives from the
# question's operands. The test table reports how often each is right and how often a checkpoint gives
# it (experiments/evidence.py), because a policy can be paid for one: GCD questions answer 1 about two
# times in five, and an RL stage learned to say 1; LCM's product is right whenever the numbers are
# coprime (36% of 300 dev questions), its larger number whenever one divides the other (16%).
SHORTCUTS: dict[str, dict[str, Callable[[list[int]], int]]] = {
    "gcd": {"always 1": lambda xs: 1, "smaller number": min},
    "lcm": {"product": math.prod, "larger number": max},
}


def shortcuts_of(task: Task) -> dict[str, str]:
    """Shortcut name → the answer it gives to ``task`` (its family's ``SHORTCUTS``; empty for the others)."""
    xs = operands(task.messages[0]["content"])
    return {name: str(cut(xs)) for name, cut in SHORTCUTS.get(task.metadata.get("family", ""), {}).items()}


# --------------------------------------------------------------------------- grading

_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_LITERAL = re.compile(
    rf"-?{_INT}(?:\.\d+)?|-?\d+\s*/\s*\d+|-?\\[dt]?frac\{{\s*\d+\s*\}}\{{\s*\d+\s*\}}"
)
_LEADING_VARIABLE = re.compile(r"^[A-Za-z]\w*\s*=\s*")
# A letter run must end at a non-letter ((?![A-Za-z])): without that, "[A-Za-z]+" inside the outer
# "+" can split one word in exponentially many ways, and a reply like "Answer: 11 so the total..."
# followed by a comma backtracks for minutes.
_TRAILING_UNIT = re.compile(r"(?:\s*(?:\\text\{[^{}]*\}|\\?%|°|\^?\\circ|[A-Za-z]+(?![A-Za-z])\.?))+$")


def number_core(pred: str) -> str | None:
    """The number literal an answer consists of ("x = 12 apples" → "12"), or None."""
    core = _TRAILING_UNIT.sub("", _LEADING_VARIABLE.sub("", pred.strip())).strip()
    return core if _LITERAL.fullmatch(core) else None


def in_lowest_terms(core: str) -> bool:
    """An integer, or a fraction whose terms are coprime (decimals are not fractions)."""
    if "." in core:
        return False
    terms = [int(x) for x in re.findall(r"\d+", core.replace(",", ""))]
    return len(terms) == 1 or math.gcd(*terms) == 1


# Extra conditions on the number literal, by family: name → (check, reason when it fails).
ANSWER_FORMS: dict[str, tuple[Callable[[str], bool], str]] = {
    "number": (lambda core: True, ""),
    "lowest_terms": (in_lowest_terms, "not_in_lowest_terms"),
}


@functools.lru_cache(maxsize=65536)
def _parse_gold(gold: str) -> list[Any]:
    # Reference answers repeat across epochs and group samples; parse each once.
    from math_verify import parse

    return parse(gold, parsing_timeout=None)


def grade_math(pred: str, gold: str, form: str = "number") -> tuple[bool, str]:
    """Is the extracted answer ``pred`` a number literal of the given form, equivalent to
    ``gold``? → (correct, reason)."""
    from math_verify import parse, verify  # sympy-heavy: imported on first use, not with the registry

    if len(pred) > MAX_ANSWER_CHARS:
        return False, "answer_too_long"
    core = number_core(pred)
    if core is None:
        return False, "not_a_number"
    has_form, failure = ANSWER_FORMS[form]
    if not has_form(core):
        return False, failure
    try:
        # \frac parses only as LaTeX, i.e. inside $...$; plain literals parse as expressions.
        target = parse(f"${core}$" if "\\" in core else core, parsing_timeout=None)
        ok = bool(target) and verify(_parse_gold(gold), target, timeout_seconds=None)
    except Exception as e:  # a sympy corner case must not take the trainer down
        return False, f"grading_error: {type(e).__name__}"
    return (True, "correct") if ok else (False, "wrong_answer")


ECHO_TOKENS = 3
_TOKEN = re.compile(r"\d+(?:[.,/]\d+)*|\w+|[^\w\s]")


def copied_number(reply: str, prompt: str, n: int = ECHO_TOKENS) -> bool:
    """Is the reply's last number the end of a run of ``n`` tokens copied from the prompt?"""
    tokens = _TOKEN.findall(reply.lower())
    last = max((i for i, tok in enumerate(tokens) if tok[0].isdigit()), default=None)
    if last is None or last + 1 < n:
        return False
    window = tokens[last + 1 - n: last + 1]
    source = _TOKEN.findall(prompt.lower())
    return any(source[i:i + n] == window for i in range(len(source) - n + 1))


# --------------------------------------------------------------------------- environment


def _stream_seed(seed: int, family: str, level: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{family}/{level}".encode()).digest()[:4], "big")


@ENVIRONMENTS.register("math")
class MathEnv(Environment):
    name = "math"
    domain = "math"

    def __init__(self, families: list[str] | None = None) -> None:
        names = families or list(FAMILIES)
        unknown = [f for f in names if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown math families {unknown}; known: {sorted(FAMILIES)}")
        self.families = names

    def _stream(self, family: str, level: int, seed: int) -> Iterator[Task]:
        import reasoning_gym  # heavy import, only when tasks are generated

        fam = FAMILIES[family]
        spec = fam.levels[level]
        base = _stream_seed(seed, family, level)
        seen: set[str] = set()
        repeats = 0
        for start in itertools.count(0, _CHUNK):
            # Chunks, not one huge dataset: some generators precompute a table per index.
            ds = reasoning_gym.create_dataset(fam.dataset, size=_CHUNK, seed=base + start, **spec.config)
            for i in range(_CHUNK):
                item = ds[i]
                question = item["question"].strip()
                if question in seen:
                    repeats += 1
                    if repeats >= _MAX_REPEATS:
                        return
                    continue
                repeats = 0
                seen.add(question)
                yield Task(
                    id=content_id("math", question),
                    domain=self.domain,
                    messages=[{"role": "user", "content": f"{question}\n\n{ANSWER_INSTRUCTION}"}],
                    ground_truth=str(item["answer"]),
                    metadata={
                        "family": family,
                        "difficulty": level,
                        "difficulty_note": spec.note,
                        "answer_form": fam.answer_form,
                        "source": f"reasoning_gym/{fam.dataset}",
                    },
                )

    def _candidates(self, seed: int) -> Iterator[Task]:
        streams = {
            (f, lvl): self._stream(f, lvl, seed) for f in self.families for lvl in FAMILIES[f].levels
        }
        weight = {
            (f, lvl): FAMILIES[f].weight * LEVEL_WEIGHT[lvl] / sum(LEVEL_WEIGHT[x] for x in FAMILIES[f].levels)
            for (f, lvl) in streams
        }
        rng = random.Random(f"math-mix/{seed}")
        while streams:
            keys = list(streams)
            key = rng.choices(keys, weights=[weight[k] for k in keys])[0]
            try:
                yield next(streams[key])
            except StopIteration:
                del streams[key]

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return take_split(self._candidates(seed), split, n or DEFAULT_N[split], lambda t: t.id)

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        answer = extract_math_answer(final_answer_text(messages))
        if answer is None:
            return VerifyResult(0.0, {"format": 0.0, "correct": 0.0}, "no_answer")
        form = task.metadata.get("answer_form", "number")
        if answer.rule == "last_number":
            prompt = "\n".join(str(m.get("content") or "") for m in task.messages if m.get("role") == "user")
            if copied_number(final_answer_text(messages), prompt):
                return VerifyResult(0.0, {"format": 0.0, "correct": 0.0}, "echoes_question")
        correct, reason = grade_math(answer.text, str(task.ground_truth), form)
        score = 1.0 if correct else 0.0
        return VerifyResult(score, {"format": float(answer.formatted), "correct": score}, reason)

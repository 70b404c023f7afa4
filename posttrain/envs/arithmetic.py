"""``arithmetic``: the pipeline's own problems (+, −, × of 1–3 digit numbers) as an RL environment.

The problems, their wording and the train/dev/test split are the ones ``posttrain make-data
arithmetic`` writes SFT rows for (data/synthetic.py builds its rows and traces on this module), so an
RL stage can train on exactly the distribution the pipeline's held-out accuracy measures. A problem's
split is a hash of its bare form (``splits.split_of``), so no seed, size or wording can leak a dev or
test problem into training. Grading is the math environment's verifier
(``Answer: N`` extraction, exact integer match).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Literal

from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult
from posttrain.envs.math_env import MathEnv
from posttrain.envs.splits import check_split, split_of

Op = Literal["+", "-", "*"]
INSTRUCTION = " Think step by step, then give the result as 'Answer: <number>'."
PROMPT = "What is {a} {op} {b}?" + INSTRUCTION
Phrasing = Literal["plain", "words", "story"]
# Two wordings per operation and kind; a subtraction may go below zero, so its stories are of
# quantities that can (a temperature, a bank balance).
WORDINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "words": {
        "+": ("What is the sum of {a} and {b}?", "What do you get when you add {b} to {a}?"),
        "-": ("What is {a} minus {b}?", "What do you get when you subtract {b} from {a}?"),
        "*": ("What is the product of {a} and {b}?", "What do you get when you multiply {a} by {b}?"),
    },
    "story": {
        "+": ("A shop has {a} boxes and receives {b} more. How many boxes does it have now?",
              "A library had {a} books and bought {b} new ones. How many books does it have?"),
        "-": ("The temperature was {a} degrees and fell by {b} degrees. What is the temperature now?",
              "An account held {a} dollars and {b} dollars were taken out. What is the balance now?"),
        "*": ("A hall has {a} rows of {b} chairs. How many chairs are there?",
              "Each of {a} crates holds {b} bottles. How many bottles are there in all?"),
    },
}


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: Op

    @property
    def text(self) -> str:
        return PROMPT.format(a=self.a, op=self.op, b=self.b)

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def digits(self) -> int:
        return max(len(str(self.a)), len(str(self.b)))


def _hash(p: Problem, salt: str = "") -> int:
    """A stable hash of the problem for a choice independent of its split (``salt``: the wording, its kind)."""
    key = f"{salt}|{p.a}{p.op}{p.b}" if salt else f"{p.a}{p.op}{p.b}"
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)


def split_of_problem(p: Problem) -> Split:
    """The problem's split: ``splits.split_of`` of its bare form ("12+7"), whatever its wording."""
    return split_of(f"{p.a}{p.op}{p.b}")


def sample_problems(n: int, seed: int, split: Split, ops: tuple[Op, ...] = ("+", "-", "*"),
                    max_digits: int = 2, min_digits: int = 1) -> list[Problem]:
    """``n`` distinct problems of the split. Digits are drawn uniformly in 1..max_digits; problems
    whose longer operand has fewer than ``min_digits`` digits are skipped (min_digits=1 skips none,
    so the default draws exactly the problems it always has)."""
    check_split(split)
    rng = random.Random(seed)
    out: list[Problem] = []
    seen: set[Problem] = set()
    tries = 0
    while len(out) < n and tries < 200 * n:
        tries += 1
        op = rng.choice(ops)
        d = rng.randint(1, max_digits)
        hi = 10**d - 1
        a, b = rng.randint(0, hi), rng.randint(0, hi if op != "*" else min(hi, 99))
        p = Problem(a, b, op)
        if p in seen or split_of_problem(p) != split or p.digits < min_digits:
            continue
        seen.add(p)
        out.append(p)
    return out


DEFAULT_N = {"train": 2000, "dev": 200, "test": 200}


def phrase(p: Problem, phrasings: tuple[Phrasing, ...]) -> tuple[Phrasing, str]:
    """(the wording a problem gets among ``phrasings``, its prompt): chosen by a hash of the
    problem, so it does not depend on the seed or the split's size."""
    kind = phrasings[_hash(p, "kind") % len(phrasings)]
    if kind == "plain":
        return kind, p.text
    options = WORDINGS[kind][p.op]
    return kind, options[_hash(p, "wording") % len(options)].format(a=p.a, b=p.b) + INSTRUCTION


def phrasing_of(task_id: str) -> Phrasing:
    """The wording a task of this environment was asked in, read from its id (``problem_task``)."""
    kind = task_id.removeprefix("arith-").split("-", 1)[0]
    return kind if kind in WORDINGS else "plain"  # type: ignore[return-value]


def problem_task(p: Problem, phrasings: tuple[Phrasing, ...] = ("plain",)) -> Task:
    kind, text = phrase(p, phrasings)
    prefix = "arith-" if kind == "plain" else f"arith-{kind}-"  # plain ids are the SFT data's, unchanged
    return Task(id=f"{prefix}{p.a}{p.op}{p.b}", domain="math", messages=[{"role": "user", "content": text}],
                ground_truth=str(p.answer),
                metadata={"digits": p.digits, "op": p.op, "answer_form": "number", "phrasing": kind})


@ENVIRONMENTS.register("arithmetic")
class ArithmeticEnv(Environment):
    name = "arithmetic"
    domain = "math"

    def __init__(self, max_digits: int = 2, ops: list[str] | None = None, phrasings: list[str] | None = None,
                 min_digits: int = 1) -> None:
        if not 1 <= max_digits <= 3:
            raise ValueError(f"max_digits must be 1, 2 or 3, got {max_digits}")
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"min_digits must be between 1 and max_digits ({max_digits}), got {min_digits}")
        unknown = [o for o in ops or [] if o not in ("+", "-", "*")]
        if unknown or ops == []:
            raise ValueError(f"ops must be a non-empty subset of ['+', '-', '*'], got {ops}")
        bad = [k for k in phrasings or [] if k not in ("plain", *WORDINGS)]
        if bad or phrasings == [] or len(set(phrasings or [])) != len(phrasings or []):
            raise ValueError(f"phrasings must be distinct names among ['plain', 'words', 'story'], got {phrasings}")
        self.max_digits, self.min_digits = max_digits, min_digits
        self.ops: tuple[Op, ...] = tuple(ops or ("+", "-", "*"))  # type: ignore[arg-type]
        self.phrasings: tuple[Phrasing, ...] = tuple(phrasings or ("plain",))  # type: ignore[arg-type]

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        probs = sample_problems(n or DEFAULT_N[split], seed, split, self.ops, self.max_digits, self.min_digits)
        return [problem_task(p, self.phrasings) for p in probs]

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        return _MATH.verify(task, messages)


_MATH = MathEnv(["addition"])  # its verify reads only the task and the reply

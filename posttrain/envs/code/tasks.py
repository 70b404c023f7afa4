"""Write-a-function task families for the ``code`` environment, generated offline.

A family is a small programming problem with

* a natural-language spec and a function signature shown to the model,
* a **reference implementation** (the functions below; the ground truth is what they return),
* variant parameters that change the problem itself (divisors, word lists, allowed steps...), so
  a family yields many distinct prompts, not one prompt with different tests,
* an input generator and a few hand-picked edge inputs.

A task is (family, variant index k). Everything about it (parameters, test inputs, expected
outputs, the two examples in the prompt) is drawn from a ``random.Random`` seeded by the task id,
so tasks are reproducible without storing data. Tests are at most ``MAX_TESTS`` = 50 per task, as
in the recipe's competitive-coding environment; the first test inputs are the family's edge cases.
Families span difficulty 1 (string/list one-liners) to 3 (dynamic programming) so that a tiny
model solves some and RL has a gradient on the rest.

Values crossing the wire are plain JSON (lists, not tuples; string dict keys), because tasks
travel over HTTP; ``canonical`` converts a reference output to that form.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Any, Callable

from posttrain.envs.splits import check_split, split_of

MAX_TESTS = 50
DEFAULT_TESTS = 20
VARIANTS_PER_FAMILY = 200  # task ids code/<family>/<k> with 0 <= k < this


@dataclass(frozen=True)
class Family:
    name: str
    difficulty: int  # 1 easy, 2 medium, 3 dynamic programming
    signature: str  # "def name(arg: type, ...) -> type"; the function the model must write
    spec: str  # str.format template over the variant parameters
    reference: Callable[..., Any]  # reference(*args, **params)
    inputs: Callable[[random.Random, dict], tuple]  # one random test input (an args tuple)
    params: Callable[[random.Random], dict] = lambda rng: {}
    edges: Callable[[dict], list[tuple]] = lambda p: []

    @property
    def entry(self) -> str:
        match = re.match(r"def (\w+)\(", self.signature)
        assert match, self.signature
        return match.group(1)


FAMILIES: dict[str, Family] = {}


def family(name: str, difficulty: int, signature: str, spec: str, **kw: Any) -> Callable:
    """Register the decorated reference implementation as a task family."""

    def deco(reference: Callable[..., Any]) -> Callable[..., Any]:
        if name in FAMILIES:
            raise ValueError(f"task family {name!r} is registered twice")
        FAMILIES[name] = Family(name, difficulty, signature, spec, reference, **kw)
        return reference

    return deco


# -- input helpers ----------------------------------------------------------------------------

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "paper", "green", "night", "ocean",
         "delta", "piano", "amber", "robot", "maple", "sugar", "light", "quiet", "zebra", "echo")


def rand_text(rng: random.Random, n: int, alphabet: str = string.ascii_letters + " ,.!?019"
              ) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def rand_sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def rand_ints(rng: random.Random, n: int, lo: int = -50, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


# -- difficulty 1 -----------------------------------------------------------------------------

CHAR_CLASSES = {
    "vowels": ("vowels (a, e, i, o, u, in either case)", lambda c: c in "aeiouAEIOU"),
    "digits": ("decimal digits 0-9", lambda c: c in string.digits),
    "upper": ("uppercase ASCII letters", lambda c: c in string.ascii_uppercase),
    "punct": ("one of the punctuation marks . , ! ?", lambda c: c in ".,!?"),
}


@family(
    "count_chars", 1, "def count_chars(s: str) -> int",
    "Return how many characters of the string `s` are {label}.",
    params=lambda rng: (lambda k: {"cls": k, "label": CHAR_CLASSES[k][0]})(
        rng.choice(sorted(CHAR_CLASSES))),
    inputs=lambda rng, p: (rand_text(rng, rng.randint(0, 30)),),
    edges=lambda p: [("",), ("AEIOU aeiou 12345 XYZ.,!?",)],
)
def count_chars(s: str, cls: str, label: str) -> int:
    return sum(1 for c in s if CHAR_CLASSES[cls][1](c))


@family(
    "reverse_words", 1, "def reverse_words(s: str) -> str",
    "Return the words of `s` in reverse order, joined by single spaces. Words are separated by "
    "one or more spaces; leading and trailing spaces are ignored.",
    inputs=lambda rng, p: ("  ".join(rand_sentence(rng, rng.randint(1, 6)).split(" "))
                           if rng.random() < 0.3 else rand_sentence(rng, rng.randint(0, 7)),),
    edges=lambda p: [("",), ("one",), ("  lead and trail  ",)],
)
def reverse_words(s: str) -> str:
    return " ".join(reversed(s.split()))


@family(
    "sum_multiples", 1, "def sum_multiples(n: int) -> int",
    "Return the sum of all positive integers smaller than `n` that are divisible by {a} or by {b}.",
    params=lambda rng: dict(zip("ab", rng.choice(
        [(a, b) for a in range(2, 12) for b in range(2, 12) if a % b and b % a]))),
    inputs=lambda rng, p: (rng.randint(-5, 500),),
    edges=lambda p: [(0,), (1,), (p["a"],), (p["a"] * p["b"] + 1,)],
)
def sum_multiples(n: int, a: int, b: int) -> int:
    return sum(i for i in range(1, max(n, 1)) if i % a == 0 or i % b == 0)


@family(
    "is_palindrome", 1, "def is_palindrome(s: str) -> bool",
    "Return True if `s` reads the same forwards and backwards when {rule}, else False.",
    params=lambda rng: rng.choice([
        {"strict": False, "rule": "case is ignored and every character that is not a letter or "
                                  "a digit is skipped"},
        {"strict": True, "rule": "compared character by character exactly as written"},
    ]),
    inputs=lambda rng, p: ((lambda w: w + rng.choice(["", "x", " "]) + w[::-1])(
        rand_text(rng, rng.randint(0, 6), "abcAB ,1")) if rng.random() < 0.6
        else rand_text(rng, rng.randint(0, 9), "abcAB ,1"),),
    edges=lambda p: [("",), ("A man, a plan, a canal: Panama",), ("ab",)],
)
def is_palindrome(s: str, strict: bool, rule: str) -> bool:
    t = s if strict else [c.lower() for c in s if c.isalnum()]
    return list(t) == list(t)[::-1]


@family(
    "fizzbuzz", 1, "def fizzbuzz(n: int) -> list[str]",
    "Return a list with one string for each integer i from 1 to `n` inclusive: '{wa}{wb}' if i "
    "is divisible by both {a} and {b}, '{wa}' if only by {a}, '{wb}' if only by {b}, and "
    "otherwise the decimal digits of i.",
    params=lambda rng: {**dict(zip("ab", rng.sample([2, 3, 4, 5, 7], 2))),
                        **dict(zip(("wa", "wb"), rng.sample(["Fizz", "Buzz", "Ping", "Pong",
                                                             "Zip", "Zap"], 2)))},
    inputs=lambda rng, p: (rng.randint(0, 40),),
    edges=lambda p: [(0,), (1,), (p["a"] * p["b"],)],
)
def fizzbuzz(n: int, a: int, b: int, wa: str, wb: str) -> list[str]:
    return [(wa if i % a == 0 else "") + (wb if i % b == 0 else "") or str(i)
            for i in range(1, n + 1)]


DIGIT_OPS = {
    "sum": "the sum of its decimal digits",
    "product": "the product of its decimal digits",
    "root": "its digital root: sum its decimal digits, then sum the digits of the result, and "
            "so on until a single digit remains",
    "reverse": "the integer whose decimal digits are those of n in reverse order (leading zeros "
               "dropped)",
}


@family(
    "digits", 1, "def digits(n: int) -> int",
    "Given a non-negative integer `n`, return {label}.",
    params=lambda rng: (lambda k: {"op": k, "label": DIGIT_OPS[k]})(rng.choice(sorted(DIGIT_OPS))),
    inputs=lambda rng, p: (rng.choice([rng.randint(0, 99), rng.randint(0, 10**9)]),),
    edges=lambda p: [(0,), (7,), (1200,), (99999,)],
)
def digits(n: int, op: str, label: str) -> int:
    ds = [int(c) for c in str(n)]
    if op == "sum":
        return sum(ds)
    if op == "product":
        out = 1
        for d in ds:
            out *= d
        return out
    if op == "root":
        while n >= 10:
            n = sum(int(c) for c in str(n))
        return n
    return int(str(n)[::-1])


RUNNING_OPS = {"sum": ("running sums", sum), "max": ("running maxima", max),
               "min": ("running minima", min)}


@family(
    "running", 1, "def running(xs: list[int]) -> list[int]",
    "Return the {label} of `xs`: a list whose i-th element is the {fn} of xs[0], ..., xs[i].",
    params=lambda rng: (lambda k: {"op": k, "label": RUNNING_OPS[k][0],
                                   "fn": {"sum": "sum", "max": "maximum", "min": "minimum"}[k]})(
        rng.choice(sorted(RUNNING_OPS))),
    inputs=lambda rng, p: (rand_ints(rng, rng.randint(0, 12)),),
    edges=lambda p: [([],), ([5],)],
)
def running(xs: list[int], op: str, label: str, fn: str) -> list[int]:
    return [RUNNING_OPS[op][1](xs[: i + 1]) for i in range(len(xs))]


# -- difficulty 2 -----------------------------------------------------------------------------


@family(
    "second_largest", 2, "def second_largest(xs: list[int]) -> int | None",
    "Return the second largest *distinct* value in `xs`, or None if `xs` has fewer than two "
    "distinct values.",
    inputs=lambda rng, p: (rand_ints(rng, rng.randint(0, 8), -5, 5),),
    edges=lambda p: [([],), ([3],), ([4, 4, 4],), ([1, 9, 9],)],
)
def second_largest(xs: list[int]) -> int | None:
    distinct = sorted(set(xs))
    return distinct[-2] if len(distinct) >= 2 else None


@family(
    "run_length", 2, "def run_length(s: str) -> str",
    "Run-length encode `s`: replace every maximal run of a repeated character by {form} (for "
    "example {example}). Return the empty string for an empty input.",
    params=lambda rng: rng.choice([
        {"count_first": False, "form": "the character followed by the run length",
         "example": "'aaabcc' -> 'a3b1c2'"},
        {"count_first": True, "form": "the run length followed by the character",
         "example": "'aaabcc' -> '3a1b2c'"},
    ]),
    inputs=lambda rng, p: ("".join(rng.choice("abcxy") * rng.randint(1, 4)
                                   for _ in range(rng.randint(0, 6))),),
    edges=lambda p: [("",), ("z",), ("aaaaaaaaaaaa",)],
)
def run_length(s: str, count_first: bool, form: str, example: str) -> str:
    out = []
    for m in re.finditer(r"(.)\1*", s, re.S):
        c, n = m.group(1), str(len(m.group(0)))
        out.append(n + c if count_first else c + n)
    return "".join(out)


@family(
    "caesar", 2, "def caesar(s: str, k: int) -> str",
    "Shift every ASCII letter of `s` {direction} the alphabet by `k` positions, wrapping around "
    "from z to a (and Z to A), keeping its case; leave all other characters unchanged. `k` may "
    "be negative or larger than 26.",
    params=lambda rng: rng.choice([{"sign": 1, "direction": "forward in"},
                                   {"sign": -1, "direction": "backward in"}]),
    inputs=lambda rng, p: (rand_text(rng, rng.randint(0, 20)), rng.randint(-30, 60)),
    edges=lambda p: [("", 3), ("xyz XYZ", 3), ("abc", 26), ("Hello, World!", -1)],
)
def caesar(s: str, k: int, sign: int, direction: str) -> str:
    def shift(c: str) -> str:
        for alphabet in (string.ascii_lowercase, string.ascii_uppercase):
            if c in alphabet:
                return alphabet[(alphabet.index(c) + sign * k) % 26]
        return c

    return "".join(shift(c) for c in s)


@family(
    "merge_intervals", 2, "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]",
    "Each interval [start, end] stands for the integers start, start + 1, ..., end (start <= end)."
    " Merge all intervals that {rule}, and return the merged intervals sorted by start.",
    params=lambda rng: rng.choice([
        {"adjacent": False, "rule": "share at least one integer ([1, 3] and [3, 5] merge into "
                                    "[1, 5]; [1, 2] and [3, 4] stay apart)"},
        {"adjacent": True, "rule": "share an integer or are adjacent ([1, 2] and [3, 4] merge "
                                   "into [1, 4]; [1, 2] and [4, 5] stay apart)"},
    ]),
    inputs=lambda rng, p: ([sorted(rng.sample(range(30), 2)) for _ in range(rng.randint(0, 6))],),
    edges=lambda p: [([],), ([[1, 3], [3, 5]],), ([[5, 6], [1, 2], [3, 3]],)],
)
def merge_intervals(intervals: list[list[int]], adjacent: bool, rule: str) -> list[list[int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + (1 if adjacent else 0):
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


@family(
    "balanced", 2, "def balanced(s: str) -> bool",
    "Return True if the brackets {pairs} in `s` are balanced and properly nested, else False. "
    "All other characters are ignored.",
    params=lambda rng: rng.choice([{"pairs": "()"}, {"pairs": "()[]"}, {"pairs": "()[]{}"}]),
    inputs=lambda rng, p: (rand_text(rng, rng.randint(0, 12), p["pairs"] * 2 + "ab"),),
    edges=lambda p: [("",), ("(()",), ("a(b)c",), ("())(",)],
)
def balanced(s: str, pairs: str) -> bool:
    closing = {pairs[i + 1]: pairs[i] for i in range(0, len(pairs), 2)}
    stack: list[str] = []
    for c in s:
        if c in closing.values():
            stack.append(c)
        elif c in closing:
            if not stack or stack.pop() != closing[c]:
                return False
    return not stack


ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),
         (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


@family(
    "roman", 2, "def roman(n: int) -> str",
    "Return the Roman numeral for `n` (1 <= n <= 3999) in standard subtractive form, in "
    "{case} letters (for example 1994 -> '{example}').",
    params=lambda rng: rng.choice([{"lower": False, "case": "uppercase", "example": "MCMXCIV"},
                                   {"lower": True, "case": "lowercase", "example": "mcmxciv"}]),
    inputs=lambda rng, p: (rng.choice([rng.randint(1, 50), rng.randint(1, 3999)]),),
    edges=lambda p: [(1,), (4,), (9,), (3999,)],
)
def roman(n: int, lower: bool, case: str, example: str) -> str:
    out = ""
    for value, numeral in ROMAN:
        count, n = divmod(n, value)
        out += numeral * count
    return out.lower() if lower else out


@family(
    "count_primes", 2, "def count_primes(n: int) -> int",
    "Return how many prime numbers are {bound} `n`.",
    params=lambda rng: rng.choice([{"inclusive": True, "bound": "less than or equal to"},
                                   {"inclusive": False, "bound": "strictly less than"}]),
    inputs=lambda rng, p: (rng.choice([rng.randint(0, 30), rng.randint(0, 20000)]),),
    edges=lambda p: [(0,), (2,), (3,), (100,)],
)
def count_primes(n: int, inclusive: bool, bound: str) -> int:
    limit = n + 1 if inclusive else n
    if limit < 3:
        return 0
    sieve = bytearray([1]) * limit
    sieve[0] = sieve[1] = 0
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, limit, i)))
    return sum(sieve)


@family(
    "word_counts", 2, "def word_counts(s: str) -> dict[str, int]",
    "Return a dict mapping each word of `s` to the number of times it occurs. A word is a maximal "
    "run of ASCII letters; words are compared {case}.",
    params=lambda rng: rng.choice([{"fold": True, "case": "in lowercase (the keys are lowercase)"},
                                   {"fold": False, "case": "exactly, case-sensitively"}]),
    inputs=lambda rng, p: (" ".join(rng.choice(WORDS[:6]).capitalize() if rng.random() < 0.3
                                    else rng.choice(WORDS[:6]) + rng.choice(["", ",", "!", "2"])
                                    for _ in range(rng.randint(0, 8))),),
    edges=lambda p: [("",), ("Echo echo ECHO",), ("a-b a_b",)],
)
def word_counts(s: str, fold: bool, case: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in re.findall(r"[A-Za-z]+", s):
        w = w.lower() if fold else w
        counts[w] = counts.get(w, 0) + 1
    return counts


@family(
    "two_sum", 2, "def two_sum(nums: list[int], target: int) -> list[int]",
    "Return [i, j] with i < j and nums[i] + nums[j] == target. If several pairs work, return the "
    "one with the smallest j, and among those the smallest i. Return [] if there is none.",
    inputs=lambda rng, p: (rand_ints(rng, rng.randint(0, 8), -9, 9), rng.randint(-12, 12)),
    edges=lambda p: [([], 0), ([3, 3], 6), ([1, 2, 3, 4], 100)],
)
def two_sum(nums: list[int], target: int) -> list[int]:
    for j in range(len(nums)):
        for i in range(j):
            if nums[i] + nums[j] == target:
                return [i, j]
    return []


@family(
    "rotate", 2, "def rotate(m: list[list[int]]) -> list[list[int]]",
    "`m` is a matrix given as a list of rows (possibly not square). Return it rotated by 90 "
    "degrees {direction}.",
    params=lambda rng: rng.choice([{"clockwise": True, "direction": "clockwise"},
                                   {"clockwise": False, "direction": "counterclockwise"}]),
    inputs=lambda rng, p: (lambda r, c: ([rand_ints(rng, c, 0, 9) for _ in range(r)],))(
        rng.randint(1, 4), rng.randint(1, 4)),
    edges=lambda p: [([[1]],), ([[1, 2], [3, 4]],), ([[1, 2, 3]],)],
)
def rotate(m: list[list[int]], clockwise: bool, direction: str) -> list[list[int]]:
    if clockwise:
        return [list(row) for row in zip(*m[::-1])]
    return [list(row) for row in zip(*m)][::-1]


def _nested(rng: random.Random, depth: int) -> list:
    out: list = []
    for _ in range(rng.randint(0, 4)):
        out.append(_nested(rng, depth - 1) if depth and rng.random() < 0.35 else rng.randint(0, 9))
    return out


@family(
    "flatten", 2, "def flatten(xs: list) -> list[int]",
    "`xs` is a list whose items are integers or lists of the same kind, nested to any depth. "
    "Return all the integers in order{order}.",
    params=lambda rng: rng.choice([{"dedupe": False, "order": ", left to right"},
                                   {"dedupe": True, "order": ", left to right, keeping only the "
                                                             "first occurrence of each value"}]),
    inputs=lambda rng, p: (_nested(rng, 3),),
    edges=lambda p: [([],), ([[[]]],), ([1, [2, [3, [4]]], 1],)],
)
def flatten(xs: list, dedupe: bool, order: str) -> list[int]:
    out: list[int] = []

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif not (dedupe and x in out):
            out.append(x)

    walk(xs)
    return out


@family(
    "max_subarray", 2, "def max_subarray(xs: list[int]) -> int",
    "Return the largest sum of a non-empty contiguous sublist of the non-empty list `xs`.",
    inputs=lambda rng, p: (rand_ints(rng, rng.randint(1, 12), -10, 10),),
    edges=lambda p: [([-3],), ([-2, -1, -5],), ([2, -1, 2],)],
)
def max_subarray(xs: list[int]) -> int:
    best = current = xs[0]
    for x in xs[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best


# -- difficulty 3: dynamic programming --------------------------------------------------------


@family(
    "lcs", 3, "def lcs(a: str, b: str) -> int",
    "Return the length of the longest common subsequence of the strings `a` and `b` (characters "
    "in order, not necessarily adjacent).",
    inputs=lambda rng, p: (rand_text(rng, rng.randint(0, 12), "abcd"),
                           rand_text(rng, rng.randint(0, 12), "abcd")),
    edges=lambda p: [("", "abc"), ("abc", "abc"), ("abcde", "ace")],
)
def lcs(a: str, b: str) -> int:
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


@family(
    "edit_distance", 3, "def edit_distance(a: str, b: str) -> int",
    "Return the minimum total cost of turning `a` into `b` when inserting a character costs "
    "{ins}, deleting one costs {dele} and replacing one by another costs {sub}.",
    params=lambda rng: rng.choice([{"ins": 1, "dele": 1, "sub": 1}, {"ins": 1, "dele": 1, "sub": 2},
                                   {"ins": 2, "dele": 1, "sub": 1}]),
    inputs=lambda rng, p: (rand_text(rng, rng.randint(0, 8), "abc"),
                           rand_text(rng, rng.randint(0, 8), "abc")),
    edges=lambda p: [("", ""), ("", "ab"), ("ab", ""), ("kitten", "sitting")],
)
def edit_distance(a: str, b: str, ins: int, dele: int, sub: int) -> int:
    prev = [j * ins for j in range(len(b) + 1)]
    for i, ca in enumerate(a, 1):
        cur = [i * dele]
        for j, cb in enumerate(b, 1):
            replace = prev[j - 1] + (0 if ca == cb else sub)
            cur.append(min(prev[j] + dele, cur[j - 1] + ins, replace))
        prev = cur
    return prev[-1]


@family(
    "coins", 3, "def coins(coins: list[int], amount: int) -> int",
    "`coins` lists distinct positive coin values, each available in unlimited number. {task}",
    params=lambda rng: rng.choice([
        {"ways": False, "task": "Return the fewest coins that add up to `amount`, 0 for amount 0, "
                                "or -1 if the amount cannot be made."},
        {"ways": True, "task": "Return the number of different multisets of coins that add up to "
                               "`amount` (order does not matter; amount 0 has one way)."},
    ]),
    inputs=lambda rng, p: (sorted(rng.sample(range(1, 15), rng.randint(1, 4))), rng.randint(0, 40)),
    edges=lambda p: [([1], 0), ([2], 3), ([1, 2, 5], 11)],
)
def coins(coins: list[int], amount: int, ways: bool, task: str) -> int:
    if ways:
        count = [1] + [0] * amount
        for c in coins:
            for v in range(c, amount + 1):
                count[v] += count[v - c]
        return count[amount]
    inf = amount + 1
    best = [0] + [inf] * amount
    for v in range(1, amount + 1):
        best[v] = min([best[v - c] + 1 for c in coins if c <= v] + [inf])
    return -1 if best[amount] >= inf else best[amount]


@family(
    "lis", 3, "def lis(xs: list[int]) -> int",
    "Return the length of the longest {kind} subsequence of `xs` (elements in order, not "
    "necessarily adjacent).",
    params=lambda rng: rng.choice([{"strict": True, "kind": "strictly increasing"},
                                   {"strict": False, "kind": "non-decreasing"}]),
    inputs=lambda rng, p: (rand_ints(rng, rng.randint(0, 12), 0, 9),),
    edges=lambda p: [([],), ([5, 5, 5],), ([10, 9, 2, 5, 3, 7, 101, 18],)],
)
def lis(xs: list[int], strict: bool, kind: str) -> int:
    best = [1] * len(xs)
    for i in range(len(xs)):
        for j in range(i):
            if xs[j] < xs[i] or (not strict and xs[j] == xs[i]):
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)


@family(
    "stairs", 3, "def stairs(n: int) -> int",
    "A staircase has `n` steps. Each move climbs {steps_text} steps. Return the number of "
    "different sequences of moves that reach exactly the top (1 for n = 0).",
    params=lambda rng: (lambda s: {"steps": s, "steps_text": " or ".join(map(str, s))})(
        rng.choice([[1, 2], [1, 2, 3], [1, 3], [2, 3], [1, 3, 5]])),
    inputs=lambda rng, p: (rng.randint(0, 40),),
    edges=lambda p: [(0,), (1,), (2,)],
)
def stairs(n: int, steps: list[int], steps_text: str) -> int:
    ways = [1] + [0] * n
    for v in range(1, n + 1):
        ways[v] = sum(ways[v - s] for s in steps if s <= v)
    return ways[n]


@family(
    "knapsack", 3, "def knapsack(weights: list[int], values: list[int], capacity: int) -> int",
    "Item i has weight weights[i] and value values[i]. Return the largest total value of a set of "
    "items{reuse} whose total weight is at most `capacity`.",
    params=lambda rng: rng.choice([{"unbounded": False, "reuse": " (each item used at most once)"},
                                   {"unbounded": True, "reuse": " (each item may be used any "
                                                                "number of times)"}]),
    inputs=lambda rng, p: (lambda n: (rand_ints(rng, n, 1, 10), rand_ints(rng, n, 1, 20),
                                      rng.randint(0, 25)))(rng.randint(0, 6)),
    edges=lambda p: [([], [], 10), ([5], [10], 4), ([1, 3, 4], [15, 20, 30], 4)],
)
def knapsack(weights: list[int], values: list[int], capacity: int, unbounded: bool,
             reuse: str) -> int:
    best = [0] * (capacity + 1)
    for w, v in zip(weights, values):
        order = range(w, capacity + 1) if unbounded else range(capacity, w - 1, -1)
        for c in order:
            best[c] = max(best[c], best[c - w] + v)
    return best[capacity]


# -- tasks ------------------------------------------------------------------------------------


def canonical(value: Any) -> Any:
    """The JSON form of a plain value: tuples become lists (recursively)."""
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


@dataclass
class CodeProblem:
    """Everything about one task, before it is wrapped in an environment ``Task``."""

    task_id: str
    family: Family
    params: dict[str, Any]
    inputs: list[list[Any]]  # args of each test, JSON form
    expected: list[Any]  # reference outputs, JSON form

    @property
    def spec(self) -> str:
        return self.family.spec.format(**self.params)


def make_problem(family_name: str, k: int, n_tests: int = DEFAULT_TESTS) -> CodeProblem:
    """Variant ``k`` of a family with ``n_tests`` tests (edge cases first), deterministic."""
    if not 1 <= n_tests <= MAX_TESTS:
        raise ValueError(f"n_tests must be in [1, {MAX_TESTS}], got {n_tests}")
    fam = FAMILIES[family_name]
    task_id = f"code/{family_name}/{k}"
    rng = random.Random(task_id)
    params = fam.params(rng)
    seen: set[str] = set()
    inputs: list[list[Any]] = []
    expected: list[Any] = []
    counts: dict[str, int] = {}
    cap = max_same_output(n_tests)
    deferred: list[tuple[list[Any], Any]] = []  # random tests whose output was already at the cap
    candidates = iter(fam.edges(params))
    for _ in range(50 * n_tests):  # random inputs repeat for small domains; stop eventually
        edge = next(candidates, None)
        args = edge or fam.inputs(rng, params)
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        test = canonical(list(args))
        out = canonical(fam.reference(*_copy(test), **params))
        out_key = repr(out)
        if edge is None and counts.get(out_key, 0) >= cap:
            deferred.append((test, out))  # balance: "return False" must not pass most tests
            continue
        counts[out_key] = counts.get(out_key, 0) + 1
        inputs.append(test)
        expected.append(out)
        if len(inputs) == n_tests:
            break
    for test, out in deferred[: n_tests - len(inputs)]:  # a family that cannot be balanced
        inputs.append(test)
        expected.append(out)
    return CodeProblem(task_id, fam, params, inputs, expected)


def max_same_output(n_tests: int) -> int:
    """How many of a task's ``n_tests`` tests may share one expected output: half, rounded up.

    Tests are drawn until they are balanced this way (edge cases always stay), so a constant
    function passes at most half the tests, and with ``n_tests >= 8`` at least 4 tests disagree
    with any constant, so "hard-code the prompt's examples, return a constant otherwise" fails
    a hidden test too. ``distinct_output_margin`` measures it; the tests check every task.
    """
    return -(-n_tests // 2)


def distinct_output_margin(expected: list[Any]) -> int:
    """The number of tests whose output differs from the most common output: how many tests any
    constant function fails at least."""
    counts: dict[str, int] = {}
    for out in expected:
        counts[repr(out)] = counts.get(repr(out), 0) + 1
    return len(expected) - max(counts.values(), default=0)


def _copy(args: list[Any]) -> list[Any]:
    """Fresh copies, so a reference that mutates its input cannot change the stored test."""
    return [canonical(a) for a in args]


def task_ids(split: str, n: int | None, seed: int) -> list[str]:
    """Ids of ``n`` tasks of ``split`` (all if None), in a seeded order interleaving families; the
    split of ``code/<family>/<k>`` is ``splits.split_of`` of that id."""
    check_split(split)
    rng = random.Random(seed)
    per_family = []
    for name in sorted(FAMILIES):
        ks = [k for k in range(VARIANTS_PER_FAMILY) if split_of(f"code/{name}/{k}") == split]
        rng.shuffle(ks)
        per_family.append([f"code/{name}/{k}" for k in ks])
    rng.shuffle(per_family)
    ids = [tid for round_ in _zip_longest(per_family) for tid in round_]
    return ids if n is None else ids[:n]


def _zip_longest(lists: list[list[str]]) -> list[list[str]]:
    longest = max(len(x) for x in lists)
    return [[x[i] for x in lists if i < len(x)] for i in range(longest)]


def parse_task_id(task_id: str) -> tuple[str, int]:
    _, name, k = task_id.split("/")
    return name, int(k)

"""Long-context QA whose answer needs facts from at least five documents (docs/recipe.md §2.6).

Tasks are generated, not downloaded. A task is a set of ``n_docs`` short fictional company reports
(sector, city, founding year, head count, revenue, chief executive, plus distractors: last years'
head count and revenue, a competitor's revenue, filler sentences) and one question that aggregates
over a *group* of 5–7 of them — the companies of one sector or one city — so no single report
answers it:

* ``sum``         — combined head count / revenue of the group;
* ``count_above`` — how many in the group exceed a threshold;
* ``argmax`` / ``argmin`` — which company of the group has the most / least;
* ``order``       — list the group's companies sorted by a measure;
* ``spread``      — highest minus lowest value in the group.

The rest of the reports are distractors from other sectors or cities. Every value is unique within a
task, so every answer is deterministic. ``metadata["needed_docs"]`` lists the group's documents
(always ≥ 5; recomputing the answer from those documents alone gives the ground truth — tested) and
``metadata["facts"]`` the facts of every document, for analysis.

Length: about 75 words (≈110 tokens) per report, so the default 10 reports make a prompt of ~4.8k
characters (~1.2k tokens), small enough for the CPU model; ``n_docs`` (7–25) and
``filler_sentences`` (0–8, one sentence ≈ 10 words) scale it.

Verification is deterministic: the text after the last "Answer:" is parsed as a whole number
(thousands separators allowed; exactly one number, so a list led by the answer earns nothing) or, for names, by finding the task's company names in it in order of
appearance (so "A, B and C", "A > B > C" and "**Answer:** the winner is A." all work, and naming an
extra company fails). Optional judge mode (``judge=`` a judge or a ``make_judge`` spec; off by
default): when the deterministic check fails, e.g. a free-form answer with no parsable "Answer:"
line, the LLM judge compares the reply with the reference answer and its score is the reward. The
judge sees the question and reference, not the documents, so its prompt stays short.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar

from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult, final_answer_text
from posttrain.envs.instruction.common import Judge, LazyJudge, content_id, judge_score, sample_tasks
from posttrain.registry import Registry

SECTORS = ("software", "food processing", "logistics", "textiles", "renewable energy", "biotech",
           "furniture", "shipping")
CITIES = ("Port Ellery", "Marrowick", "Eastmere", "Holloway Bay", "Falcon Ridge", "Norhaven",
          "Oakridge Vale", "Saltmarsh", "Tarrow", "Brinley")
NAME_HEADS = ("Alder", "Brook", "Cinder", "Dune", "Ember", "Fern", "Granite", "Harbor", "Iris",
              "Juniper", "Kestrel", "Lumen", "Maple", "Nimbus", "Onyx", "Pine", "Quill", "Raven",
              "Sable", "Thistle", "Umber", "Vale", "Willow", "Yarrow", "Zephyr")
NAME_TAILS = ("Group", "Holdings", "Industries", "Partners", "Collective", "Corporation", "Ventures",
              "Works")
FIRST_NAMES = ("Ada", "Bruno", "Chen", "Dana", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas",
               "Kemi", "Lars", "Mira", "Nadia", "Omar", "Priya", "Rosa", "Sven", "Tomas", "Yara")
LAST_NAMES = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski",
              "Byrne", "Castillo", "Demir", "Ferrari", "Jansen", "Mehta", "Petrov", "Quinn")
YEAR_WORDS = {2: "Two", 3: "Three", 4: "Four", 5: "Five"}
FILLERS = (
    "The board expects steady demand over the coming year.",
    "A new warehouse opened on the east side of town last spring.",
    "Staff turnover remained low according to the annual survey.",
    "The company sponsors a local youth football club.",
    "Its main office moved to a larger building two years ago.",
    "Analysts describe its outlook as stable.",
    "Customers mostly praise its delivery times.",
    "The firm plans to publish a sustainability report next quarter.",
)


@dataclass(frozen=True)
class Company:
    name: str
    sector: str
    city: str
    founded: int
    employees: int
    revenue: int  # million credits
    ceo: str
    employees_before: int  # distractor: head count ``years_before`` years ago
    revenue_before: int  # distractor: revenue ``years_before`` years ago
    years_before: int
    competitor_revenue: int | None  # distractor: a competitor's revenue


def report(c: Company, rng: random.Random, filler_sentences: int) -> str:
    """One report: fact sentences in a shuffled order, phrasing varied per fact."""
    facts = [
        rng.choice((f"It was founded in {c.founded}.", f"The firm was established in {c.founded}.",
                    f"{c.name} traces its origins to {c.founded}.")),
        rng.choice((f"It currently employs {c.employees} people.",
                    f"The current headcount stands at {c.employees} employees.")),
        f"{YEAR_WORDS[c.years_before]} years earlier the company had {c.employees_before} employees"
        f" and revenue of {c.revenue_before} million credits.",
        rng.choice((f"Its latest annual revenue came to {c.revenue} million credits.",
                    f"For the most recent year it reported revenue of {c.revenue} million credits.")),
        f"The company is led by chief executive {c.ceo}.",
        *rng.sample(FILLERS, filler_sentences),
    ]
    if c.competitor_revenue is not None:
        facts.append(f"Its closest competitor reported {c.competitor_revenue} million credits in revenue.")
    rng.shuffle(facts)
    intro = rng.choice((f"{c.name} is a {c.sector} company headquartered in {c.city}.",
                        f"Based in {c.city}, {c.name} operates in the {c.sector} sector."))
    return " ".join([intro, *facts])


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class Measure:
    attr: str
    amount: str  # "What is the combined {amount} of ..."
    most: str
    least: str
    above: str  # "How many companies ... {above}?" with {t}
    order: str  # sorted from the highest value down
    spread: str  # full question with {where}
    summable: bool


MEASURES = {
    "employees": Measure(
        "employees", "current number of employees", "has the most employees",
        "has the fewest employees", "currently employ more than {t} people",
        "from the most to the fewest current employees",
        "What is the difference between the largest and the smallest current head count among the "
        "companies {where}?", True),
    "revenue": Measure(
        "revenue", "latest annual revenue, in million credits,", "has the highest latest annual revenue",
        "has the lowest latest annual revenue", "had a latest annual revenue above {t} million credits",
        "from the highest to the lowest latest annual revenue",
        "What is the difference, in million credits, between the highest and the lowest latest annual "
        "revenue among the companies {where}?", True),
    "founded": Measure(
        "founded", "founding year", "was founded most recently", "was founded earliest",
        "were founded after {t}", "from the most recently founded to the oldest",
        "How many years passed between the founding of the oldest and of the most recently founded "
        "company {where}?", False),
}


class QuestionKind:
    """One kind of aggregate question: its parameters, its wording and its answer from the group."""

    answer_type: ClassVar[str] = "number"  # "number" | "names" (one name for argmax/argmin)

    def applies(self, m: Measure) -> bool:
        return True

    def params(self, rng: random.Random, values: list[int]) -> dict[str, int]:
        return {}

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:  # pragma: no cover
        raise NotImplementedError

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> int | list[str]:  # pragma: no cover
        raise NotImplementedError


QUESTIONS: Registry[QuestionKind] = Registry("long-context question")


def _question(name: str) -> Callable[[type[QuestionKind]], type[QuestionKind]]:
    def deco(cls: type[QuestionKind]) -> type[QuestionKind]:
        QUESTIONS.register(name)(cls())  # kinds are stateless: the registry holds one instance each
        return cls

    return deco


def _value(c: Company, m: Measure) -> int:
    return getattr(c, m.attr)


@_question("sum")
class Sum(QuestionKind):
    def applies(self, m: Measure) -> bool:
        return m.summable

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return f"What is the combined {m.amount} of all companies {where}?"

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> int:
        return sum(_value(c, m) for c in members)


@_question("count_above")
class CountAbove(QuestionKind):
    def params(self, rng: random.Random, values: list[int]) -> dict[str, int]:
        values = sorted(values)
        j = rng.randint(1, len(values) - 1)  # 1..k-1 companies lie above the threshold
        return {"threshold": (values[j - 1] + values[j]) // 2}

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return f"How many companies {where} {m.above.format(t=params['threshold'])}?"

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> int:
        return sum(_value(c, m) > params["threshold"] for c in members)


@_question("argmax")
class ArgMax(QuestionKind):
    answer_type = "names"

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return f"Which company {where} {m.most}?"

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> list[str]:
        return [max(members, key=lambda c: _value(c, m)).name]


@_question("argmin")
class ArgMin(QuestionKind):
    answer_type = "names"

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return f"Which company {where} {m.least}?"

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> list[str]:
        return [min(members, key=lambda c: _value(c, m)).name]


@_question("order")
class Order(QuestionKind):
    answer_type = "names"

    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return f"List all companies {where} {m.order}."

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> list[str]:
        return [c.name for c in sorted(members, key=lambda c: _value(c, m), reverse=True)]


@_question("spread")
class Spread(QuestionKind):
    def text(self, where: str, m: Measure, params: dict[str, int]) -> str:
        return m.spread.format(where=where)

    def answer(self, members: list[Company], m: Measure, params: dict[str, int]) -> int:
        values = [_value(c, m) for c in members]
        return max(values) - min(values)


FORMAT_HINTS = {
    "number": "Give the answer as a single whole number, without units.",
    "names": "Give the full company name (for a list: all names in order, separated by commas).",
}

# A group is the companies sharing one value of an attribute; the template describes it in a question.
GROUPS = {
    "sector": ("in the {} sector", SECTORS),
    "city": ("headquartered in {}", CITIES),
}


# --------------------------------------------------------------------------- grading (pure)

_ANSWER_RE = re.compile(r"answer\s*[:：]\s*([^\n]*)", re.I)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The text after the last non-empty "Answer:" (markdown emphasis and end punctuation removed)."""
    found = [a.strip(" *_`\t.") for a in _ANSWER_RE.findall(text)]
    found = [a for a in found if a]
    return found[-1] if found else None


def parse_number(answer: str) -> float | None:
    m = _NUMBER_RE.search(answer)
    if not m:
        return None
    return float(m.group(0).replace(",", ""))


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def names_in_order(answer: str, candidates: list[str]) -> list[str]:
    """The candidate names mentioned in ``answer``, ordered by first mention."""
    norm = f" {_normalize(answer)} "
    found = []
    for name in candidates:
        pos = norm.find(f" {_normalize(name)} ")
        if pos >= 0:
            found.append((pos, name))
    return [name for _, name in sorted(found)]


def grade_answer(reply: str, ground_truth: dict[str, Any]) -> tuple[bool, str]:
    """(correct, reason) for a reply against ``{"answer", "answer_type", "candidates"}``."""
    answer = extract_answer(reply)
    if answer is None:
        return False, "no 'Answer:' line"
    truth = ground_truth["answer"]
    if ground_truth["answer_type"] == "number":
        value = parse_number(answer)
        if value is None:
            return False, f"no number in answer {answer[:40]!r}"
        if len(_NUMBER_RE.findall(answer)) > 1:  # "2857, 2858, 2859": a list, not an answer
            return False, f"several numbers in answer {answer[:40]!r}"
        return value == truth, f"answered {value:g}, expected {truth}"
    names = names_in_order(answer, ground_truth["candidates"])
    if not names:
        return False, f"no company named in answer {answer[:40]!r}"
    return names == truth, f"answered {names}, expected {truth}"


# --------------------------------------------------------------------------- environment


@ENVIRONMENTS.register("longctx")
class LongContextEnv(Environment):
    name = "longctx"
    domain = "long_context"

    def __init__(
        self,
        n_docs: int = 10,
        filler_sentences: int = 1,
        judge: Judge | str | None = None,
        default_size: int = 2000,
    ) -> None:
        if not 7 <= n_docs <= len(NAME_HEADS):  # 5+ group members, 2+ distractors, unique names
            raise ValueError(f"n_docs must lie in [7, {len(NAME_HEADS)}], got {n_docs}")
        if not 0 <= filler_sentences <= len(FILLERS):
            raise ValueError(f"filler_sentences must lie in [0, {len(FILLERS)}], got {filler_sentences}")
        self.n_docs = n_docs
        self.filler_sentences = filler_sentences
        self.judge = LazyJudge(judge)
        self.default_size = default_size

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        if n is None:
            n = self.default_size if split == "train" else max(1, self.default_size // 10)
        stream = f"{self.name}:{self.n_docs}:{self.filler_sentences}"
        return sample_tasks(self.make_task, split, n, seed, stream=stream)

    def _companies(self, rng: random.Random, attr: str, value: str, k: int) -> list[Company]:
        """``k`` group members (``attr == value``), then distractors; every number unique."""
        n = self.n_docs
        names = [f"{h} {t}" for h, t in zip(rng.sample(NAME_HEADS, n), rng.choices(NAME_TAILS, k=n))]
        founded = rng.sample(range(1950, 2021), n)
        employees = rng.sample(range(40, 5000), n)
        revenue = rng.sample(range(3, 900), n)
        outsiders = [v for v in GROUPS[attr][1] if v != value]
        companies = []
        for i in range(n):
            attrs = {a: rng.choice(pool) for a, (_, pool) in GROUPS.items()}
            attrs[attr] = value if i < k else rng.choice(outsiders)
            companies.append(Company(
                name=names[i], founded=founded[i], employees=employees[i], revenue=revenue[i],
                ceo=f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
                employees_before=max(10, employees[i] + rng.randint(-400, 400)),
                revenue_before=max(1, revenue[i] + rng.randint(-80, 80)), years_before=rng.randint(2, 5),
                competitor_revenue=rng.randint(3, 900) if rng.random() < 0.5 else None, **attrs,
            ))
        return companies

    def make_task(self, rng: random.Random) -> Task:
        attr = rng.choice(sorted(GROUPS))
        where_template, pool = GROUPS[attr]
        value = rng.choice(pool)
        companies = self._companies(rng, attr, value, k=rng.randint(5, min(7, self.n_docs - 2)))
        rng.shuffle(companies)
        members = [c for c in companies if getattr(c, attr) == value]
        kind_name, measure_name = rng.choice([
            (k, m) for k in QUESTIONS.names() for m in sorted(MEASURES) if QUESTIONS.get(k).applies(MEASURES[m])
        ])
        kind, measure = QUESTIONS.get(kind_name), MEASURES[measure_name]
        params = kind.params(rng, [_value(c, measure) for c in members])
        question = kind.text(where_template.format(value), measure, params)
        docs = "\n\n".join(
            f"[Document {i}]\n{report(c, rng, self.filler_sentences)}" for i, c in enumerate(companies, 1)
        )
        prompt = (
            f"Below are {len(companies)} short company reports. Answer the question using only these "
            "reports; the answer needs information from several of them.\n\n"
            f"{docs}\n\nQuestion: {question}\n{FORMAT_HINTS[kind.answer_type]} "
            "End your reply with a final line of the form \"Answer: <your answer>\"."
        )
        ground_truth = {
            "answer": kind.answer(members, measure, params),
            "answer_type": kind.answer_type,
            "candidates": [c.name for c in companies],
            "question": question,
        }
        return Task(
            id=content_id(self.name, {"prompt": prompt, "ground_truth": ground_truth}),
            domain=self.domain,
            messages=[{"role": "user", "content": prompt}],
            ground_truth=ground_truth,
            metadata={
                "question_kind": kind_name,
                "measure": measure_name,
                "params": params,
                "group": {"attr": attr, "value": value},
                "needed_docs": [i for i, c in enumerate(companies, 1) if c in members],
                "facts": [asdict(c) for c in companies],
            },
        )

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        reply = final_answer_text(messages)
        correct, reason = grade_answer(reply, task.ground_truth)
        if correct or not self.judge.configured or not reply.strip():
            return VerifyResult(float(correct), {"exact": float(correct)}, reason)
        verdict = self.judge.get().judge(judge_prompt(task, reply))
        score = judge_score(verdict)
        return VerifyResult(score, {"exact": 0.0, "judge": score}, f"{reason}; judge: {verdict.reason} {score:.1f}")


def reference_text(ground_truth: dict[str, Any]) -> str:
    answer = ground_truth["answer"]
    return ", ".join(answer) if isinstance(answer, list) else str(answer)


def judge_prompt(task: Task, reply: str) -> list[Message]:
    from posttrain.envs.judge import build_judge_prompt

    rubric = ("The question was answered from a set of documents the judge does not see. Compare the "
              "final answer in the response with the reference answer. Give 10 if they are "
              "equivalent (ignore wording, formatting and explanation), 0 if they differ or the "
              "response gives no definite answer. For a list, the order must match.")
    conversation = [{"role": "user", "content": task.ground_truth["question"]},
                    {"role": "assistant", "content": reply}]
    return build_judge_prompt(conversation, rubric, reference=reference_text(task.ground_truth))

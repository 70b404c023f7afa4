"""STEM multiple-choice environment (docs/recipe.md §2.3): binary reward for picking the right option.

Questions are generated procedurally and offline: each generator below draws the numbers of a
physics, chemistry, unit-conversion, geometry or biology problem, computes the answer, and
computes the distractors from the mistakes people actually make (forgetting the ½ in ½mv²,
skipping a unit conversion, ignoring subscripts in a formula, reversing a DNA strand). Options
always carry the same unit, so the unit never gives the answer away; when two mistakes happen to
give the same value, scaled copies of the answer (×2, ×½, ×10, ...) fill the gap.

Atomic masses (IUPAC standard values, 4–5 significant figures) are the only facts typed in; every
compound is assembled from ions or homologous series and its molar mass is computed.

Options are shuffled with the task seed and lettered A–D. The task id hashes the generator name
and the question stem (not the option order), and the split hashes the id, so a question is in
train or in validation whatever the seed. Units never use the letters A–D on their own (no
amperes, no coulombs), because a reply such as "Answer: 0.5 A" would read as option A.

Grading: ``extract_choice`` (rules in extract.py) on the reply without its ``<think>`` block.
A reply naming several letters as its final answer is "ambiguous" and gets 0: hedging across
options must not earn the reward. Components: ``format`` (a single letter was found) and
``correct`` (the reward).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Iterator

from posttrain.envs.base import (
    ENVIRONMENTS,
    Environment,
    Message,
    Split,
    Task,
    VerifyResult,
    final_answer_text,
)
from posttrain.envs.extract import content_id, extract_choice, take_split

LETTERS = "ABCD"
ANSWER_INSTRUCTION = (
    'Choose the single best option. Think it through if needed, then end your reply with a line of '
    'the form "Answer: X", where X is A, B, C or D.'
)
DEFAULT_N = {"train": 2000, "dev": 200, "test": 200}
G = 9.8  # m/s², stated in every stem that uses it


@dataclass(frozen=True)
class Question:
    stem: str
    answer: str
    distractors: list[str]  # most plausible first; duplicates and copies of the answer are dropped
    fillers: list[str]  # used only when the distractors give fewer than three distinct options


@dataclass(frozen=True)
class QuestionGenerator:
    """A family of generated questions: its topic, difficulty and the function that draws one."""

    topic: str
    difficulty: int  # 1: one formula; 2: a conversion or an extra step on top
    make: Callable[[random.Random], Question]


GENERATORS: dict[str, QuestionGenerator] = {}


def generator(name: str, topic: str, difficulty: int) -> Callable[[Callable[[random.Random], Question]], Callable[[random.Random], Question]]:
    def deco(fn: Callable[[random.Random], Question]) -> Callable[[random.Random], Question]:
        GENERATORS[name] = QuestionGenerator(topic, difficulty, fn)
        return fn

    return deco


def fmt(x: float, sig: int = 3) -> str:
    """``x`` to ``sig`` significant figures, plain notation, no trailing zeros (12.0 → "12")."""
    if x == 0:
        return "0"
    r = float(f"{x:.{sig}g}")
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(r))))
    s = f"{r:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def numeric(
    stem: str, answer: float, mistakes: list[float], unit: str, sig: int = 3,
    fillers: list[float] | None = None,
) -> Question:
    """A question whose options are numbers with one unit; fillers default to scaled answers."""
    gap = "" if unit == "%" else " "
    show = lambda x: f"{fmt(x, sig)}{gap}{unit}".strip()  # noqa: E731
    if fillers is None:
        fillers = [answer * k for k in (2, 0.5, 10, 0.1, 1.5, 3, 0.25)]
    return Question(stem, show(answer), [show(m) for m in mistakes], [show(f) for f in fillers])


# --------------------------------------------------------------------------- physics


@generator("kinetic_energy", "physics", 1)
def _kinetic_energy(rng: random.Random) -> Question:
    m, v = rng.randint(2, 160) / 2, rng.randint(2, 30)
    stem = f"An object of mass {fmt(m)} kg moves at {v} m/s. What is its kinetic energy?"
    return numeric(stem, 0.5 * m * v**2, [m * v**2, 0.5 * m * v, m * v], "J")


@generator("potential_energy", "physics", 1)
def _potential_energy(rng: random.Random) -> Question:
    m, h = rng.randint(1, 60), rng.randint(2, 50)
    stem = f"A box of mass {m} kg is lifted {h} m straight up. By how much does its gravitational potential energy increase? (g = {G} m/s²)"
    return numeric(stem, m * G * h, [m * h, 0.5 * m * G * h, m * G / h], "J")


@generator("free_fall", "physics", 1)
def _free_fall(rng: random.Random) -> Question:
    t = rng.randint(5, 100) / 10
    stem = f"A stone is dropped from rest and falls freely for {fmt(t)} s. How far does it fall? (g = {G} m/s², no air resistance)"
    return numeric(stem, 0.5 * G * t**2, [G * t**2, G * t, 0.5 * G * t], "m")


@generator("ohms_law", "physics", 2)
def _ohms_law(rng: random.Random) -> Question:
    volts, milliamps = rng.choice([1.5, 3, 4.5, 6, 9, 12, 24]), rng.randint(10, 500)
    stem = f"A current of {milliamps} mA flows through a resistor connected to a {fmt(volts)} V battery. What is the resistance?"
    amps = milliamps / 1000
    return numeric(stem, volts / amps, [volts / milliamps, volts * amps, amps / volts], "Ω")


@generator("momentum", "physics", 2)
def _momentum(rng: random.Random) -> Question:
    m, kmh = rng.randint(1, 120) * 10, rng.randint(2, 30) * 5
    stem = f"A car of mass {m} kg travels at {kmh} km/h. What is the magnitude of its momentum?"
    ms = kmh / 3.6
    return numeric(stem, m * ms, [m * kmh, m * kmh * 3.6, 0.5 * m * ms**2], "kg·m/s")


@generator("pressure", "physics", 2)
def _pressure(rng: random.Random) -> Question:
    force, cm2 = rng.randint(1, 100) * 10, rng.choice([2, 4, 5, 8, 10, 20, 25, 40, 50])
    stem = f"A force of {force} N acts evenly on an area of {cm2} cm². What pressure does it exert?"
    return numeric(stem, force / (cm2 / 10_000), [force / cm2, force / (cm2 / 100), force * cm2], "Pa")


@generator("wave_speed", "physics", 1)
def _wave_speed(rng: random.Random) -> Question:
    f, lam = rng.randint(2, 100) * 5, rng.randint(1, 40) / 10
    stem = f"A wave has a frequency of {f} Hz and a wavelength of {fmt(lam)} m. How fast does it travel?"
    return numeric(stem, f * lam, [f / lam, lam / f, f + lam], "m/s")


@generator("electric_energy", "physics", 2)
def _electric_energy(rng: random.Random) -> Question:
    watts, hours = rng.randint(1, 40) * 50, rng.randint(1, 12)
    stem = f"A heater rated at {watts} W runs for {hours} hours. How much electrical energy does it use?"
    return numeric(stem, watts * hours / 1000, [watts * hours, watts * hours / 100, watts / hours / 1000], "kWh")


@generator("density", "physics", 2)
def _density(rng: random.Random) -> Question:
    grams, cm3 = rng.randint(5, 500), rng.randint(2, 200)
    stem = f"A solid has a mass of {grams} g and a volume of {cm3} cm³. What is its density in kg/m³?"
    return numeric(stem, grams / cm3 * 1000, [grams / cm3, cm3 / grams * 1000, grams * cm3], "kg/m³")


# --------------------------------------------------------------------------- chemistry

# Standard atomic weights (IUPAC, abridged) and atomic numbers; the only chemical facts typed in.
ATOMS: dict[str, tuple[float, int]] = {
    "H": (1.008, 1), "Li": (6.94, 3), "C": (12.011, 6), "N": (14.007, 7), "O": (15.999, 8),
    "F": (18.998, 9), "Na": (22.990, 11), "Mg": (24.305, 12), "Al": (26.982, 13), "S": (32.06, 16),
    "Cl": (35.45, 17), "K": (39.098, 19), "Ca": (40.078, 20), "Fe": (55.845, 26),
    "Br": (79.904, 35), "Ba": (137.327, 56),
}
# Ions as (formula part, [(element, count)], charge). Compounds are built by balancing charges.
CATIONS = [("Li", [("Li", 1)], 1), ("Na", [("Na", 1)], 1), ("K", [("K", 1)], 1),
           ("Mg", [("Mg", 1)], 2), ("Ca", [("Ca", 1)], 2), ("Ba", [("Ba", 1)], 2),
           ("Al", [("Al", 1)], 3), ("Fe", [("Fe", 1)], 3), ("NH4", [("N", 1), ("H", 4)], 1)]
ANIONS = [("F", [("F", 1)], 1), ("Cl", [("Cl", 1)], 1), ("Br", [("Br", 1)], 1), ("O", [("O", 1)], 2),
          ("S", [("S", 1)], 2), ("OH", [("O", 1), ("H", 1)], 1), ("NO3", [("N", 1), ("O", 3)], 1),
          ("SO4", [("S", 1), ("O", 4)], 2), ("CO3", [("C", 1), ("O", 3)], 2)]

Group = tuple[list[tuple[str, int]], int]  # (elements with their counts, multiplier)


@dataclass(frozen=True)
class Compound:
    formula: str
    groups: list[Group]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for elements, mult in self.groups:
            for el, k in elements:
                out[el] = out.get(el, 0) + k * mult
        return out

    def molar_mass(self) -> float:
        return sum(ATOMS[el][0] * k for el, k in self.counts().items())


def _ion_text(part: str, atoms: list[tuple[str, int]], mult: int) -> str:
    if mult == 1:
        return part
    return f"({part}){mult}" if len(atoms) > 1 else f"{part}{mult}"


def random_compound(rng: random.Random) -> Compound:
    """An ionic compound (charges balanced) or a small alkane / alcohol."""
    kind = rng.choice(["ionic", "ionic", "alkane", "alcohol"])
    if kind == "ionic":
        (cp, ca, cq), (ap, aa, aq) = rng.choice(CATIONS), rng.choice(ANIONS)
        lcm = cq * aq // math.gcd(cq, aq)
        nc, na = lcm // cq, lcm // aq
        formula = _ion_text(cp, ca, nc) + _ion_text(ap, aa, na)
        return Compound(formula, [(ca, nc), (aa, na)])
    n = rng.randint(1, 8)
    if kind == "alkane":
        return Compound(f"C{n if n > 1 else ''}H{2 * n + 2}", [([("C", n), ("H", 2 * n + 2)], 1)])
    hs = 2 * n + 1
    return Compound(f"C{n if n > 1 else ''}H{hs}OH", [([("C", n), ("H", hs)], 1), ([("O", 1), ("H", 1)], 1)])


def _mass_ignoring_subscripts(c: Compound) -> float:
    return sum(ATOMS[el][0] for el in c.counts())


def _mass_from_atomic_numbers(c: Compound) -> float:
    return sum(ATOMS[el][1] * k for el, k in c.counts().items())


def _mass_ignoring_multipliers(c: Compound) -> float:
    return sum(ATOMS[el][0] * k for elements, _ in c.groups for el, k in elements)


@generator("molar_mass", "chemistry", 1)
def _molar_mass(rng: random.Random) -> Question:
    c = random_compound(rng)
    stem = f"What is the molar mass of {c.formula}?"
    mistakes = [_mass_ignoring_multipliers(c), _mass_ignoring_subscripts(c), _mass_from_atomic_numbers(c)]
    return numeric(stem, c.molar_mass(), mistakes, "g/mol", sig=4)


@generator("moles_from_mass", "chemistry", 2)
def _moles_from_mass(rng: random.Random) -> Question:
    c = random_compound(rng)
    grams = rng.randint(1, 100) * 5
    m = c.molar_mass()
    stem = f"How many moles are in {grams} g of {c.formula}?"
    return numeric(stem, grams / m, [m / grams, grams / _mass_ignoring_subscripts(c), grams * m / 1000], "mol")


@generator("molarity", "chemistry", 2)
def _molarity(rng: random.Random) -> Question:
    mol, ml = rng.randint(1, 40) / 20, rng.choice([50, 100, 200, 250, 400, 500, 750])
    stem = f"{fmt(mol)} mol of solute is dissolved in water to make {ml} mL of solution. What is the concentration?"
    return numeric(stem, mol / (ml / 1000), [mol / ml, mol * ml / 1000, ml / 1000 / mol], "mol/L")


@generator("mass_percent", "chemistry", 2)
def _mass_percent(rng: random.Random) -> Question:
    c = random_compound(rng)
    counts = c.counts()
    el = rng.choice(sorted(counts))
    part, total = ATOMS[el][0] * counts[el], c.molar_mass()
    stem = f"What percentage of the mass of {c.formula} is {el}?"
    mistakes = [ATOMS[el][0] / total * 100, counts[el] / sum(counts.values()) * 100,
                part / max(total - part, 1e-9) * 100]
    return numeric(stem, part / total * 100, mistakes, "%")


# --------------------------------------------------------------------------- unit conversions


@dataclass(frozen=True)
class Conversion:
    source: str
    target: str
    value: Callable[[random.Random], float]
    correct: Callable[[float], float]
    mistakes: tuple[Callable[[float], float], ...]


CONVERSIONS = [
    Conversion("km", "m", lambda r: r.randint(1, 500) / 10, lambda x: x * 1000,
               (lambda x: x / 1000, lambda x: x * 100, lambda x: x * 10)),
    Conversion("cm", "m", lambda r: r.randint(1, 900), lambda x: x / 100,
               (lambda x: x * 100, lambda x: x / 1000, lambda x: x / 10)),
    Conversion("h", "s", lambda r: r.randint(1, 48) / 4, lambda x: x * 3600,
               (lambda x: x * 60, lambda x: x / 3600, lambda x: x * 100)),
    Conversion("km/h", "m/s", lambda r: r.randint(2, 60) * 5, lambda x: x / 3.6,
               (lambda x: x * 3.6, lambda x: x / 60, lambda x: x * 1000 / 60)),
    Conversion("mL", "L", lambda r: r.randint(1, 400) * 5, lambda x: x / 1000,
               (lambda x: x * 1000, lambda x: x / 100, lambda x: x / 10)),
    Conversion("m²", "cm²", lambda r: r.randint(1, 50) / 10, lambda x: x * 10_000,
               (lambda x: x * 100, lambda x: x / 10_000, lambda x: x * 1000)),
    Conversion("°C", "K", lambda r: r.randint(-50, 150), lambda x: x + 273.15,
               (lambda x: x - 273.15, lambda x: x * 9 / 5 + 32, lambda x: x + 373.15)),
    Conversion("°C", "°F", lambda r: r.randint(-40, 120), lambda x: x * 9 / 5 + 32,
               (lambda x: x * 5 / 9 + 32, lambda x: (x + 32) * 9 / 5, lambda x: x * 9 / 5)),
]


@generator("unit_conversion", "units", 1)
def _unit_conversion(rng: random.Random) -> Question:
    conv = rng.choice(CONVERSIONS)
    x = conv.value(rng)
    stem = f"Convert {fmt(x, 4)} {conv.source} to {conv.target}."
    return numeric(stem, conv.correct(x), [m(x) for m in conv.mistakes], conv.target, sig=4)


# --------------------------------------------------------------------------- geometry


@generator("circle_area", "geometry", 1)
def _circle_area(rng: random.Random) -> Question:
    r = rng.randint(2, 100) / 2
    stem = f"What is the area of a circle with radius {fmt(r)} cm? (Use π ≈ 3.1416.)"
    return numeric(stem, math.pi * r**2, [2 * math.pi * r, math.pi * (2 * r) ** 2, math.pi * r], "cm²")


@generator("hypotenuse", "geometry", 1)
def _hypotenuse(rng: random.Random) -> Question:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    stem = f"A right triangle has legs of {a} cm and {b} cm. How long is the hypotenuse?"
    return numeric(stem, math.hypot(a, b), [a + b, a**2 + b**2, math.sqrt(abs(a**2 - b**2))], "cm")


@generator("cylinder_volume", "geometry", 2)
def _cylinder_volume(rng: random.Random) -> Question:
    r, h = rng.randint(1, 15), rng.randint(1, 30)
    stem = f"What is the volume of a cylinder with radius {r} cm and height {h} cm? (Use π ≈ 3.1416.)"
    pi = math.pi
    return numeric(stem, pi * r**2 * h, [2 * pi * r * h, pi * (2 * r) ** 2 * h, pi * r * h], "cm³")


@generator("sphere_volume", "geometry", 1)
def _sphere_volume(rng: random.Random) -> Question:
    r = rng.randint(2, 60) / 2
    stem = f"What is the volume of a sphere with radius {fmt(r)} cm? (Use π ≈ 3.1416.)"
    pi = math.pi
    return numeric(stem, 4 / 3 * pi * r**3, [4 * pi * r**2, pi * r**3, 4 / 3 * pi * r**2], "cm³")


@generator("triangle_area", "geometry", 1)
def _triangle_area(rng: random.Random) -> Question:
    b, h = rng.randint(2, 40), rng.randint(2, 40)
    stem = f"A triangle has a base of {b} m and a height of {h} m. What is its area?"
    return numeric(stem, b * h / 2, [b * h, b + h, (b + h) / 2], "m²")


# --------------------------------------------------------------------------- biology

TRAITS = [  # (gene letter, dominant phenotype, recessive phenotype, organisms, one organism)
    ("Y", "yellow seeds", "green seeds", "pea plants", "plant"),
    ("P", "purple flowers", "white flowers", "pea plants", "plant"),
    ("B", "brown fur", "white fur", "guinea pigs", "guinea pig"),
]
PERCENTS = ["0%", "25%", "50%", "75%", "100%"]


@generator("punnett", "biology", 2)
def _punnett(rng: random.Random) -> Question:
    gene, dom, rec, organisms, one = rng.choice(TRAITS)
    g1, g2 = (rng.choice([gene + gene, gene + gene.lower(), gene.lower() * 2]) for _ in range(2))
    offspring = [a + b for a in g1 for b in g2]  # the four equally likely Punnett squares
    ask = rng.choice(["recessive", "dominant", "heterozygous"])
    is_hit = {
        "recessive": lambda o: o.islower(),
        "dominant": lambda o: not o.islower(),
        "heterozygous": lambda o: o[0] != o[1],
    }[ask]
    pct = f"{sum(map(is_hit, offspring)) * 25}%"
    what = {"recessive": f"have {rec}", "dominant": f"have {dom}", "heterozygous": "be heterozygous"}[ask]
    stem = (f"In {organisms}, the allele for {dom} ({gene}) is dominant over the allele for {rec} "
            f"({gene.lower()}). A {g1} {one} "
            f"is crossed with a {g2} {one}. What fraction of the offspring is expected to {what}?")
    others = [p for p in PERCENTS if p != pct]
    rng.shuffle(others)
    return Question(stem, pct, others, [])


@generator("chargaff", "biology", 1)
def _chargaff(rng: random.Random) -> Question:
    a = rng.randint(10, 40)
    stem = f"A double-stranded DNA sample is {a}% adenine. What percentage of its bases are guanine?"
    return numeric(stem, 50 - a, [a, 100 - 2 * a, 100 - a], "%")


COMPLEMENT = str.maketrans("ATGC", "TACG")


@generator("complementary_strand", "biology", 1)
def _complementary_strand(rng: random.Random) -> Question:
    seq = "".join(rng.choice("ATGC") for _ in range(rng.randint(6, 9)))
    comp = seq.translate(COMPLEMENT)
    strand = lambda s: f"3'-{s}-5'"  # noqa: E731
    stem = f"Which strand pairs with the DNA strand 5'-{seq}-3' (written 3' to 5', aligned base by base)?"
    distractors = [strand(comp[::-1]), strand(comp.replace("T", "U")), strand(seq)]
    fillers = []
    for i in range(len(comp)):  # one wrong base at position i
        wrong = {"A": "G", "G": "A", "T": "C", "C": "T"}[comp[i]]
        fillers.append(strand(comp[:i] + wrong + comp[i + 1:]))
    return Question(stem, strand(comp), distractors, fillers)


@generator("cell_division", "biology", 1)
def _cell_division(rng: random.Random) -> Question:
    if rng.random() < 0.5:
        k = rng.randint(2, 8)
        stem = f"A single cell divides by mitosis, and every daughter cell divides again, for {k} rounds in all. How many cells are there at the end?"
        cells = 2**k
        return numeric(stem, cells, [2 * k, k**2, 2 * cells], "cells", fillers=[cells + 2, cells - 2, 3 * cells])
    diploid = 2 * rng.randint(3, 40)
    stem = f"A species has a diploid chromosome number of 2n = {diploid}. How many chromosomes does one of its gametes carry?"
    n = diploid // 2
    mistakes = [diploid, 2 * diploid] + ([n // 2] if n % 2 == 0 else [])  # halved twice
    return numeric(stem, n, mistakes, "chromosomes", fillers=[n + 1, n - 1, 3 * n])


# --------------------------------------------------------------------------- environment


def choose_options(q: Question, rng: random.Random) -> tuple[dict[str, str], str]:
    """Four distinct options, shuffled, lettered A-D → (options, letter of the answer)."""
    picked = [q.answer]
    for cand in q.distractors + q.fillers:
        if cand not in picked:
            picked.append(cand)
        if len(picked) == len(LETTERS):
            break
    if len(picked) < len(LETTERS):
        raise ValueError(f"question has fewer than {len(LETTERS)} distinct options: {q.stem!r}")
    rng.shuffle(picked)
    options = dict(zip(LETTERS, picked))
    return options, LETTERS[picked.index(q.answer)]


def render_prompt(stem: str, options: dict[str, str]) -> str:
    lines = "\n".join(f"{k}) {v}" for k, v in options.items())
    return f"{stem}\n\n{lines}\n\n{ANSWER_INSTRUCTION}"


@ENVIRONMENTS.register("mcq")
class McqEnv(Environment):
    name = "mcq"
    domain = "stem"

    def _candidates(self, seed: int) -> Iterator[Task]:
        rng = random.Random(f"mcq/{seed}")
        by_topic: dict[str, list[str]] = {}
        for name, gen in GENERATORS.items():
            by_topic.setdefault(gen.topic, []).append(name)
        topics = sorted(by_topic)
        while True:  # topics equally likely, then generators within a topic
            name = rng.choice(by_topic[rng.choice(topics)])
            gen = GENERATORS[name]
            q = gen.make(rng)
            options, letter = choose_options(q, rng)
            yield Task(
                id=content_id("mcq", f"{name}|{q.stem}"),
                domain=self.domain,
                messages=[{"role": "user", "content": render_prompt(q.stem, options)}],
                ground_truth=letter,
                metadata={"topic": gen.topic, "generator": name, "difficulty": gen.difficulty,
                          "options": options, "answer_text": q.answer},
            )

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return take_split(self._candidates(seed), split, n or DEFAULT_N[split], lambda t: t.id)

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        choice = extract_choice(final_answer_text(messages), LETTERS, task.metadata.get("options"))
        if choice.letter is None:
            return VerifyResult(0.0, {"format": 0.0, "correct": 0.0}, choice.reason)
        score = 1.0 if choice.letter == task.ground_truth else 0.0
        # the letter in both reasons: a policy that answers one letter whatever the question shows
        # in the validation records (eval/compare.py: modal_choice)
        reason = f"correct: chose {choice.letter}" if score else f"wrong_answer: chose {choice.letter}"
        return VerifyResult(score, {"format": 1.0, "correct": score}, reason)

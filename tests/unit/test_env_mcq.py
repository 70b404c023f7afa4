"""STEM multiple-choice environment: procedural questions, mistake-based distractors, letter grading."""

import random
import re
from collections import Counter

import pytest

from posttrain.envs.base import Task, make_env
from posttrain.envs.mcq import (
    GENERATORS,
    Compound,
    Question,
    choose_options,
    fmt,
    random_compound,
)


def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def env():
    return make_env("mcq")


@pytest.fixture(scope="module")
def train(env) -> list[Task]:
    return env.tasks("train", 400, seed=0)


def test_correct_letter_scores_one_and_others_zero(env, train):
    t = train[0]
    right, wrong = t.ground_truth, next(x for x in "ABCD" if x != t.ground_truth)
    assert env.verify(t, reply(f"Let me compute.\nAnswer: {right}")).reward == 1.0
    assert env.verify(t, reply(f"the answer is ({right.lower()})")).reward == 1.0
    assert env.verify(t, reply(right)).reward == 1.0
    assert env.verify(t, reply(f"Answer: {t.metadata['answer_text']}")).reward == 1.0  # option text
    result = env.verify(t, reply(f"Answer: {wrong}"))
    assert result.reward == 0.0 and result.components == {"format": 1.0, "correct": 0.0}


def test_hedging_and_missing_answers_score_zero(env, train):
    t = train[0]
    others = [x for x in "ABCD" if x != t.ground_truth]
    hedge = env.verify(t, reply(f"Answer: {t.ground_truth} or {others[0]}"))
    assert (hedge.reward, hedge.reason) == (0.0, "ambiguous")
    for text in ["", "\x00\ufffd garbage", "I am not sure.", "<think>Answer: " + t.ground_truth]:
        result = env.verify(t, reply(text))
        assert result.reward == 0.0 and result.reason == "no_answer"


def test_reasoning_is_never_graded(env, train):
    t = train[0]
    wrong = next(x for x in "ABCD" if x != t.ground_truth)
    assert env.verify(t, reply(f"<think>Answer: {t.ground_truth}</think>Answer: {wrong}")).reward == 0.0
    assert env.verify(t, reply(f"<think>Answer: {wrong}</think>Answer: {t.ground_truth}")).reward == 1.0


def test_every_generator_gives_four_distinct_options_with_the_answer(env):
    rng = random.Random(0)
    for name, gen in GENERATORS.items():
        for _ in range(40):
            q = gen.make(rng)
            options, letter = choose_options(q, rng)
            assert sorted(options) == list("ABCD") and len(set(options.values())) == 4, name
            assert options[letter] == q.answer, name


def test_tasks_are_deterministic_and_splits_disjoint(env, train):
    assert [t.to_dict() for t in env.tasks("train", 400, seed=0)] == [t.to_dict() for t in train]
    train_ids = {t.id for t in train} | {t.id for t in env.tasks("train", 400, seed=1)}
    validation = {t.id for s in (0, 1) for t in env.tasks("dev", 100, seed=s)}
    assert len({t.id for t in train}) == len(train) and not train_ids & validation


def test_task_mix_covers_topics_and_letters(train):
    topics = Counter(t.metadata["topic"] for t in train)
    assert set(topics) == {"physics", "chemistry", "units", "geometry", "biology"}
    letters = Counter(t.ground_truth for t in train)
    assert set(letters) == set("ABCD") and min(letters.values()) > 60  # shuffled, no position bias
    prompt = train[0].messages[0]["content"]
    assert "\nA) " in prompt and "\nD) " in prompt and '"Answer: X"' in prompt


# --------------------------------------------------------------------------- the science


def test_fmt_rounds_to_significant_figures():
    assert [fmt(12.0), fmt(0.004567), fmt(1234567), fmt(-2.5), fmt(0)] == ["12", "0.00457", "1230000", "-2.5", "0"]


def test_molar_mass_from_the_built_in_table():
    water = Compound("H2O", [([("H", 2), ("O", 1)], 1)])
    calcium_nitrate = Compound("Ca(NO3)2", [([("Ca", 1)], 1), ([("N", 1), ("O", 3)], 2)])
    assert water.molar_mass() == pytest.approx(18.015, abs=1e-3)
    assert calcium_nitrate.molar_mass() == pytest.approx(164.086, abs=1e-2)
    assert calcium_nitrate.counts() == {"Ca": 1, "N": 2, "O": 6}


def test_random_compounds_balance_charges():
    rng = random.Random(1)
    formulas = {random_compound(rng).formula for _ in range(300)}
    assert {"NaCl", "Al2O3", "CaCl2", "Ca(NO3)2", "CH4", "C2H5OH"} & formulas
    assert "NaCl2" not in formulas and "Al3O2" not in formulas


def test_kinetic_energy_question_values():
    q = GENERATORS["kinetic_energy"].make(random.Random(3))
    # recompute from the stem: "An object of mass M kg moves at V m/s."
    words = q.stem.split()
    m, v = float(words[4]), float(words[8])
    assert q.answer == f"{fmt(0.5 * m * v**2)} J"
    assert f"{fmt(m * v**2)} J" in q.distractors  # the forgotten ½


# Hand-worked crosses (genotypes with the gene letter written as A): % recessive, dominant, heterozygous.
CROSSES = {
    ("Aa", "Aa"): (25, 75, 50), ("AA", "aa"): (0, 100, 100), ("Aa", "aa"): (50, 50, 50),
    ("AA", "Aa"): (0, 100, 50), ("AA", "AA"): (0, 100, 0), ("aa", "aa"): (100, 0, 0),
}


def test_punnett_percentages_match_hand_worked_crosses():
    rng = random.Random(0)
    for _ in range(100):
        q = GENERATORS["punnett"].make(rng)
        m = re.search(r"\((\w)\) is dominant over the allele for (.+?) \(.*A (\w\w) .+ is crossed with a (\w\w) ", q.stem)
        gene, recessive_trait, g1, g2 = m.groups()
        pair = tuple(g.replace(gene, "A").replace(gene.lower(), "a") for g in (g1, g2))
        rec, dom, het = CROSSES[pair] if pair in CROSSES else CROSSES[pair[::-1]]
        if recessive_trait in q.stem.split("expected to")[1]:
            expected = rec
        elif "heterozygous" in q.stem:
            expected = het
        else:
            expected = dom
        assert q.answer == f"{expected}%", q.stem


def test_choose_options_fills_from_fillers_and_fails_loudly():
    q = Question("?", "1 J", ["1 J", "2 J"], ["2 J", "3 J", "4 J"])
    options, letter = choose_options(q, random.Random(0))
    assert sorted(options.values()) == ["1 J", "2 J", "3 J", "4 J"] and options[letter] == "1 J"
    with pytest.raises(ValueError, match="fewer than 4"):
        choose_options(Question("?", "1 J", ["1 J"], ["2 J"]), random.Random(0))


def test_a_constant_letter_policy_earns_chance_and_its_reasons_say_so(env):
    """The lazy policy of multiple choice: "Answer: C" whatever the question. Options are shuffled
    per question, so it earns about a quarter (no more), and every reason names the letter, which is
    how the pipeline's report spots it (eval.compare.modal_choice)."""
    from posttrain.eval.compare import modal_choice

    tasks = env.tasks("dev", 200, seed=0)
    results = [env.verify(t, reply("Answer: C")) for t in tasks]
    assert 0.15 < sum(r.reward for r in results) / len(results) < 0.35
    assert modal_choice([r.reason for r in results]) == ("C", 1.0, 200)
    assert {r.reason for r in results} == {"correct: chose C", "wrong_answer: chose C"}

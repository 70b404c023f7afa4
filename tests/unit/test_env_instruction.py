"""Instruction-following environments: every constraint on hand-made texts, the conflict table,
the scripted writer as a known-correct answer, splits, and the multi-turn judge wiring."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from posttrain.envs.base import make_env
from posttrain.envs.splits import split_of
from posttrain.envs.instruction.constraints import (
    CONSTRAINTS, FORBIDDEN_WORDS, AllLowercase, AllUppercase, BulletCount, CapitalWordFrequency,
    EndPhrase, Highlights, JsonFormat, KeywordsForbidden, KeywordsRequired, LetterFrequency,
    NoCommas, ParagraphCount, Placeholders, Postscript, Quotation, SectionCount, SentenceCount,
    StartPhrase, Title, WordCount, conflicting, constraint_from_dict, count_sentences, count_words,
    sample_constraints,
)
from posttrain.envs.instruction.multiturn import CHANGES, InstructionMultiTurnEnv, judge_prompt
from posttrain.envs.instruction.topics import TOPICS
from posttrain.envs.instruction.writer import _FILLERS, write_response
from posttrain.envs.judge import LLMJudge
from posttrain.engines.base import Completion

# (constraint, texts that satisfy it, texts that do not)
CASES = [
    (WordCount(low=3), ["one two three", "It's a fine day."], ["one two", ""]),
    (WordCount(high=3), ["one two three"], ["one two three four"]),
    (WordCount(low=2, high=3), ["one two"], ["one", "a b c d"]),
    (SentenceCount(low=2), ["Hi there. How are you?", "One.\n\nTwo"], ["Just one sentence here."]),
    (SentenceCount(high=2), ["One. Two!"], ["One. Two. Three?"]),
    (ParagraphCount(n=2, separator="***"), ["First part.\n***\nSecond part.", "A\n\n***\n\nB\n***"],
     ["Only one.", "A\n***\n***\nB", "A\n***\nB\n***\nC"]),
    (ParagraphCount(n=2, separator="blank_line"), ["First.\n\nSecond.", "A\nstill A\n\n  \nB"],
     ["A\nB", "A\n\nB\n\nC"]),
    (KeywordsRequired(keywords=("lamp", "coast")), ["The Lamp on the coast."], ["The lamp only.", "lamps and coasts"]),
    (KeywordsRequired(keywords=("lamp",), min_count=2), ["lamp, LAMP"], ["one lamp", "lamplight lamp"]),
    (KeywordsForbidden(keywords=("very", "nice")), ["A fine day.", "everything"], ["Very good.", "so nice!"]),
    (LetterFrequency(letter="e", min_count=3), ["EeE", "freeze"], ["tree", ""]),
    (CapitalWordFrequency(min_count=2), ["This is VERY IMPORTANT."], ["Only ONE here, I think.", "no caps"]),
    (Placeholders(min_count=2), ["Write to [name] at [address]."], ["Write to [name].", "[]"]),
    (Highlights(min_count=2), ["Some *key* and **bold** text.", "*a*\n*b*"],
     ["* bullet one\n* bullet two", "plain", "a * b * c"]),
    (BulletCount(n=2), ["Intro\n* one\n- two", "* a\n* b\n***"], ["* one", "* a\n* b\n* c", "*a*\n*b*"]),
    (SectionCount(n=2, marker="SECTION"), ["SECTION 1\nFirst.\nSECTION 2\nSecond.", "Intro\n## SECTION 1\nA\n**SECTION 2**\nB"],
     ["SECTION 1\nA\nSECTION 3\nB", "SECTION 1\nA", "SECTION 1\nA\nSECTION 2\n", "section 1\na\nsection 2\nb",
      "In SECTION 1 we ... SECTION 2"]),
    (JsonFormat(), ['{"a": 1}', '```json\n{"a": [1, 2]}\n```', ' {"x": "y"} '], ["[1, 2]", "{'a': 1}", "Sure! {\"a\": 1}", ""]),
    (AllLowercase(), ["all quiet here.", "ok 123"], ["Not lowercase", "123 !!", ""]),
    (AllUppercase(), ["ALL LOUD HERE.", "OK 123"], ["Not Upper", "123 !!"]),
    (NoCommas(), ["No commas here."], ["One, two."]),
    (Title(), ["<<My Title>>\nText", "text <<joy>>"], ["<My Title>", "<<>>", "<< >>"]),
    (StartPhrase(phrase="Dear reader"), ["Dear reader. Hi.", "  dear reader"], ["Hello. Dear reader"]),
    (EndPhrase(phrase="Any other questions?"), ["Done. Any other questions?  ", "ANY OTHER QUESTIONS?"],
     ["Any other questions? Thanks.", "Any other questions"]),
    (Quotation(), ['"Wrapped text."', '  "a b"  '], ['Not wrapped.', '"half', '""']),
    (Postscript(marker="P.S."), ["Body.\n\nP.S. See you.", "Body.\n**P.S.** later"], ["Body. P.S. inline",
                                                                                     "Body.\nP.P.S. more", "Body.\nP.S."]),
    (Postscript(marker="P.P.S."), ["Body.\nP.P.S. more"], ["Body.\nP.S. x"]),
]


def _kinds_covered() -> set[str]:
    return {c.kind for c, _, _ in CASES}


def test_registry_has_at_least_15_kinds_all_with_hand_made_cases():
    assert len(CONSTRAINTS.names()) >= 15
    assert _kinds_covered() == set(CONSTRAINTS.names())


@pytest.mark.parametrize("constraint,good,bad", CASES, ids=[f"{c.kind}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_constraint_positives_and_negatives(constraint, good, bad):
    for text in good:
        assert constraint.check(text), (text, constraint.evaluate(text).reason)
    for text in bad:
        result = constraint.evaluate(text)
        assert not result.ok and result.reason, text


def test_counting_helpers():
    assert count_words("Don't stop-now, 42 times.") == 5  # hyphens split, apostrophes join
    assert count_sentences("One. Two? Three!\n\nFour") == 4
    assert count_sentences("<<T>>\nNo end") == 1


def test_sampled_constraints_describe_and_round_trip_through_json():
    rng = random.Random(0)
    for kind in CONSTRAINTS.names():
        for _ in range(5):
            c = CONSTRAINTS.get(kind).sample(rng, TOPICS[0].keywords)
            assert c.describe().strip()
            assert constraint_from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_declared_conflicts_are_never_sampled_together():
    for kind_a, kind_b in [("all_lowercase", "all_uppercase"), ("json_format", "bullet_count"),
                           ("json_format", "no_commas"), ("quotation", "end_phrase")]:
        assert conflicting(kind_a, kind_b) and conflicting(kind_b, kind_a)
    rng = random.Random(1)
    for _ in range(2000):
        kinds = [c.kind for c in sample_constraints(rng, rng.randint(2, 4), TOPICS[0].keywords)]
        assert len(set(kinds)) == len(kinds)
        for a, b in itertools.combinations(kinds, 2):
            assert not conflicting(a, b), (a, b)


def test_conflict_table_is_nearly_complete():
    """Compatible-by-table sets the writer cannot satisfy are redrawn; this must stay rare, or the
    table misses a real conflict (only long-text x few-sentences bound pairs are expected)."""
    rng = random.Random(2)
    unsatisfiable = []
    for _ in range(500):
        topic = rng.choice(TOPICS)
        constraints = sample_constraints(rng, rng.randint(2, 4), topic.keywords)
        if write_response(topic, constraints) is None:
            unsatisfiable.append(sorted(c.kind for c in constraints))
    assert len(unsatisfiable) <= 5, unsatisfiable
    assert all({"word_count", "sentence_count"} <= set(kinds) for kinds in unsatisfiable), unsatisfiable


def test_scripted_writer_never_uses_forbidden_words_or_commas():
    text = " ".join(_FILLERS)
    assert "," not in text and KeywordsForbidden(keywords=FORBIDDEN_WORDS).check(text)
    # an impossible set makes the writer give up instead of returning a wrong text
    assert write_response(TOPICS[0], [WordCount(high=5), BulletCount(n=5)]) is None


# --------------------------------------------------------------------------- single-turn env


@pytest.fixture(scope="module")
def env():
    return make_env("instruction")


@pytest.fixture(scope="module")
def train_tasks(env):
    return env.tasks("train", n=300, seed=0)


def _reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_tasks_are_deterministic_and_splits_disjoint(env, train_tasks):
    again = env.tasks("train", n=300, seed=0)
    assert [t.to_dict() for t in again] == [t.to_dict() for t in train_tasks]
    assert [t.id for t in env.tasks("train", n=20, seed=1)] != [t.id for t in train_tasks[:20]]
    validation = env.tasks("dev", n=60, seed=0)
    assert not {t.id for t in validation} & {t.id for t in train_tasks}
    assert all(split_of(t.id) == "dev" for t in validation)
    assert len({t.id for t in train_tasks}) == 300


def test_tasks_have_2_to_4_constraints_and_readable_prompts(env, train_tasks):
    for task in train_tasks:
        n = len(task.ground_truth["constraints"])
        assert 2 <= n <= 4 and task.domain == "instruction_following"
        prompt = task.messages[0]["content"]
        assert prompt.startswith(("Write", "Give")) and "follow these rules" in prompt
        for c in task.ground_truth["constraints"]:
            assert constraint_from_dict(c).describe() in prompt


def test_reference_response_is_known_correct(env, train_tasks):
    for task in train_tasks:
        result = env.verify(task, _reply(task.metadata["reference_response"]))
        assert result.reward == 1.0, (task.ground_truth, result.reason)
        assert set(result.components) == set(task.metadata["kinds"]) | {"substance"}


def test_known_wrong_answer_names_the_failing_constraint(env):
    task = next(t for t in env.tasks("train", n=100, seed=3) if "word_count" in t.metadata["kinds"]
                and t.ground_truth["constraints"][t.metadata["kinds"].index("word_count")]["low"])
    result = env.verify(task, _reply("Too short."))
    assert result.reward == 0.0 and result.components["word_count"] == 0.0
    assert "word_count" in result.reason


def test_reasoning_is_not_graded(env, train_tasks):
    task = train_tasks[0]
    ref = task.metadata["reference_response"]
    assert env.verify(task, _reply(f"<think>\nplanning, with commas, VERY loud\n</think>\n{ref}")).reward == 1.0
    assert env.verify(task, _reply(f"<think>\n{ref}\n</think>\n")).reward == 0.0
    assert env.verify(task, _reply(f"<think>\n{ref}")).reward == 0.0  # cut inside reasoning


@pytest.mark.parametrize("garbage", ["", "   ", "\x00\x01", "{" * 5000, "[" * 100000, "<think>", "🙂" * 50, None])
def test_garbage_scores_zero_without_exception(env, train_tasks, garbage):
    for task in train_tasks[:40]:
        result = env.verify(task, _reply(garbage))
        assert 0.0 <= result.reward <= 1.0 and result.reason
        if not (garbage or "").strip() or garbage == "<think>":
            assert result.reward == 0.0 and result.reason == "empty answer"
    assert env.verify(train_tasks[0], []).reward == 0.0


# --------------------------------------------------------------------------- multi-turn env


class CannedGenerator:
    """A stand-in judge model: returns the same text for every prompt and records the prompts."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.prompts: list = []

    def generate(self, prompts, params, tools=None):
        self.prompts.extend(prompts)
        return [[Completion(text=self.text)] for _ in prompts]


@pytest.fixture(scope="module")
def mt_tasks():
    return InstructionMultiTurnEnv().tasks("train", n=150, seed=0)


def test_multiturn_conversations_are_well_formed(mt_tasks):
    ops = set()
    for task in mt_tasks:
        roles = [m["role"] for m in task.messages]
        assert roles[-1] == "user" and roles[0] == "user"
        assert roles.count("user") == task.metadata["user_turns"] in (2, 3)
        assert all(a != b for a, b in zip(roles, roles[1:]))  # strictly alternating
        kinds = [c["kind"] for c in task.ground_truth["constraints"]]
        assert len(set(kinds)) == len(kinds) and kinds
        for a, b in itertools.combinations(kinds, 2):
            assert not conflicting(a, b)
        ops.update(task.metadata["changes"])
    assert ops == set(CHANGES.names())


def test_multiturn_replace_swaps_in_a_conflicting_rule():
    rng = random.Random(0)
    rules = [AllLowercase(), NoCommas()]
    change = CHANGES.get("replace")(rng, rules, TOPICS[0])
    (old,) = change.dropped
    new = next(c for c in change.constraints if c not in rules)
    assert conflicting(old.kind, new.kind) and len(change.constraints) == 2


def test_multiturn_deterministic_and_disjoint(mt_tasks):
    env = InstructionMultiTurnEnv()
    assert [t.id for t in env.tasks("train", n=150, seed=0)] == [t.id for t in mt_tasks]
    assert not {t.id for t in env.tasks("dev", n=30, seed=0)} & {t.id for t in mt_tasks}


def test_multiturn_reward_is_judge_score_when_rules_hold(mt_tasks):
    gen = CannedGenerator("Right topic, tone and rules.\nSCORE: 8/10")
    env = InstructionMultiTurnEnv(judge=LLMJudge(gen))
    task = mt_tasks[0]
    result = env.verify(task, _reply(task.metadata["reference_response"]))
    assert result.reward == pytest.approx(0.8) and result.components["judge"] == pytest.approx(0.8)
    assert all(result.components[c["kind"]] == 1.0 for c in task.ground_truth["constraints"])
    (prompt,) = gen.prompts
    text = prompt[-1]["content"]
    for m in task.messages:  # the whole conversation, the final reply and the rules in force
        assert m["content"].strip().splitlines()[0] in text
    assert task.metadata["reference_response"].splitlines()[0] in text
    for c in task.ground_truth["constraints"]:
        assert constraint_from_dict(c).describe() in text


def test_multiturn_dropped_rules_are_shown_as_not_in_force(mt_tasks):
    task = next(t for t in mt_tasks if t.ground_truth["dropped"])
    text = judge_prompt(task, "reply")[-1]["content"]
    assert "no longer apply" in text
    assert constraint_from_dict(task.ground_truth["dropped"][0]).describe() in text


def test_multiturn_broken_rule_scores_zero_without_asking_the_judge(mt_tasks):
    gen = CannedGenerator("SCORE: 10/10")
    env = InstructionMultiTurnEnv(judge=LLMJudge(gen))
    for garbage in ["", "<think>unfinished", "x"]:
        result = env.verify(mt_tasks[1], _reply(garbage))
        assert result.reward == 0.0 and "judge not asked" in result.reason
    assert gen.prompts == []


def test_multiturn_unparseable_judge_scores_zero(mt_tasks):
    env = InstructionMultiTurnEnv(judge=LLMJudge(CannedGenerator("I think it is pretty good!")))
    task = mt_tasks[2]
    result = env.verify(task, _reply(task.metadata["reference_response"]))
    assert result.reward == 0.0 and "judge_unparseable" in result.reason


def test_multiturn_judge_spec_is_built_lazily_once(mt_tasks, monkeypatch):
    import posttrain.envs.judge as judge_module

    built = []

    def fake_make_judge(spec):
        built.append(spec)
        return LLMJudge(CannedGenerator("SCORE: 10/10"))

    monkeypatch.setattr(judge_module, "make_judge", fake_make_judge)
    env = make_env("instruction_multiturn", judge="http://judge:8000/v1")
    assert built == []  # listing tasks never builds the judge
    task = mt_tasks[0]
    for _ in range(2):
        assert env.verify(task, _reply(task.metadata["reference_response"])).reward == 1.0
    assert built == ["http://judge:8000/v1"]


def test_multiturn_without_judge_says_so(mt_tasks):
    task = mt_tasks[0]
    with pytest.raises(RuntimeError, match="judge"):
        InstructionMultiTurnEnv().verify(task, _reply(task.metadata["reference_response"]))


# --------------------------------------------------------------------------- substance (issue 12, item 5)


def test_ok_scores_zero_on_every_training_task(env):
    """"ok." used to score 1.0 on 24 of 2,000 training tasks (e.g. an all-lowercase email of at
    most 150 words): the constraints held, and nothing checked that the reply did the task."""
    tasks = env.tasks("train")
    assert len(tasks) == 2000
    for lazy in ("ok.", "ok", "sure thing", "done"):
        scored = [t.id for t in tasks if env.verify(t, _reply(lazy)).reward > 0]
        assert scored == [], (lazy, len(scored))


def test_substance_rule():
    from posttrain.envs.instruction.substance import MIN_WORDS, check_substance, min_words, topic_words

    words = topic_words("school lunches")
    assert words == ("school", "lunches")
    prompt = "Write an email about school lunches for your neighbours."
    good = ("dear neighbours, the school menu changes next month. the cafeteria will serve warm soup "
            "on mondays and fresh fruit every day, and parents can volunteer at the lunch counter.")
    assert check_substance(good, prompt, words).ok  # "lunch" matches "lunches"
    assert not check_substance("ok.", prompt, words).ok
    off_topic = ("the weather this week will be mild with light rain on tuesday and sunshine "
                 "returning by the weekend so bring an umbrella just in case it pours.")
    assert "topic" in check_substance(off_topic, prompt, words).reason
    echo = " ".join([prompt] * 5)
    assert "not taken from the prompt" in check_substance(echo, prompt, words).reason
    assert not check_substance("school lunches " * 20, prompt, words).ok
    assert check_substance(good.upper(), prompt, words).ok  # case-insensitive (all-caps rules)
    assert min_words([WordCount(high=10)]) == 10 and min_words([]) == MIN_WORDS
    assert topic_words("learning a new language") == ("language",)
    baking = ("my grandmother taught me to bake bread with a jar of bubbly starter that she fed "
              "every morning before work and kept warm beside the stove in winter")
    assert check_substance(baking, "Write a poem about sourdough baking.", topic_words("sourdough baking")).ok
    keyword_only = ("here are a few thoughts about lighthouses and the ticket deserves a closer look "
                    "while the balcony deserves a closer look too in every season")
    assert not check_substance(keyword_only, "Write about old movie theaters. Include ticket and balcony.",
                               topic_words("old movie theaters")).ok  # keywords alone are not the topic


def test_echo_of_the_prompt_scores_zero(env):
    """Echoes of the prompt scored on some tasks; with one sentence added, on 47 of 2,000."""
    for task in env.tasks("train"):
        prompt = task.messages[0]["content"]
        for text in (prompt, prompt + "\nWell honestly that sums up everything quite nicely friends"):
            assert env.verify(task, _reply(text)).reward == 0.0, prompt

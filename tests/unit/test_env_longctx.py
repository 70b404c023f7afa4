"""Long-context QA: ≥5 needed documents, answers recomputable from them, deterministic grading of
known-correct and known-wrong answers, splits, and the optional judge fallback."""

from __future__ import annotations

import pytest

from posttrain.envs.base import make_env
from posttrain.envs.longctx import (
    GROUPS, MEASURES, QUESTIONS, Company, LongContextEnv, extract_answer, grade_answer,
    names_in_order, parse_number, reference_text,
)
from posttrain.envs.judge import LLMJudge
from posttrain.engines.base import Completion


@pytest.fixture(scope="module")
def env():
    return make_env("longctx")


@pytest.fixture(scope="module")
def tasks(env):
    return env.tasks("train", n=200, seed=0)


def _reply(text):
    return [{"role": "assistant", "content": text}]


def test_every_question_needs_at_least_5_documents_and_they_suffice(tasks):
    for task in tasks:
        meta = task.metadata
        needed = meta["needed_docs"]
        assert len(needed) >= 5 and len(meta["facts"]) - len(needed) >= 2
        group = meta["group"]
        members = [i for i, f in enumerate(meta["facts"], 1) if f[group["attr"]] == group["value"]]
        assert members == needed  # the question's filter selects exactly the needed documents
        facts = [Company(**meta["facts"][i - 1]) for i in needed]
        kind, measure = QUESTIONS.get(meta["question_kind"]), MEASURES[meta["measure"]]
        assert kind.answer(facts, measure, meta["params"]) == task.ground_truth["answer"]
        for i in needed:  # each needed document is in the prompt and names its company
            assert f"[Document {i}]\n" in task.messages[0]["content"]


def test_values_are_unique_so_answers_are_deterministic(tasks):
    for task in tasks:
        for attr in ("employees", "revenue", "founded", "name"):
            values = [f[attr] for f in task.metadata["facts"]]
            assert len(set(values)) == len(values)


def test_all_question_kinds_and_groups_occur(tasks):
    assert {t.metadata["question_kind"] for t in tasks} == set(QUESTIONS.names())
    assert {t.metadata["group"]["attr"] for t in tasks} == set(GROUPS)


def test_prompt_is_modest_and_states_the_answer_format(tasks):
    for task in tasks:
        prompt = task.messages[0]["content"]
        assert len(prompt) < 6500  # ~1.2k tokens by default
        assert 'Answer: <your answer>' in prompt and task.ground_truth["question"] in prompt


def test_n_docs_controls_the_context(env):
    small = LongContextEnv(n_docs=7, filler_sentences=0).tasks("train", n=5)
    large = LongContextEnv(n_docs=20, filler_sentences=3).tasks("train", n=5)
    assert all(len(t.metadata["facts"]) == 7 for t in small)
    assert all(len(t.metadata["facts"]) == 20 for t in large)
    assert max(len(t.messages[0]["content"]) for t in small) < min(len(t.messages[0]["content"]) for t in large)
    with pytest.raises(ValueError, match="n_docs"):
        LongContextEnv(n_docs=6)


def test_deterministic_and_splits_disjoint(env, tasks):
    assert [t.to_dict() for t in env.tasks("train", n=200, seed=0)] == [t.to_dict() for t in tasks]
    validation = env.tasks("dev", n=40, seed=0)
    assert not {t.id for t in validation} & {t.id for t in tasks}
    assert len({t.id for t in tasks}) == len(tasks)


# --------------------------------------------------------------------------- grading


def test_extract_answer_and_parse_number():
    assert extract_answer("I think...\n**Answer:** 1,234.") == "1,234"
    assert extract_answer("Answer: 3\nfinal answer: 5") == "5"
    assert extract_answer("Answer:\n") is None and extract_answer("no label") is None
    assert parse_number("1,234 employees") == 1234 and parse_number("-7") == -7
    assert parse_number("twelve") is None


def test_names_in_order_uses_whole_names():
    names = ["Alder Group", "Pine Holdings", "Iris Works"]
    assert names_in_order("pine holdings > ALDER GROUP", names) == ["Pine Holdings", "Alder Group"]
    assert names_in_order("Alder Groups", names) == []
    assert names_in_order("Iris Works, then Iris Works again", names) == ["Iris Works"]


GT_NUMBER = {"answer": 4521, "answer_type": "number", "candidates": ["A Group"]}
GT_NAMES = {"answer": ["Pine Holdings", "Alder Group"], "answer_type": "names",
            "candidates": ["Alder Group", "Pine Holdings", "Iris Works"]}
GT_NAME = {"answer": ["Iris Works"], "answer_type": "names", "candidates": GT_NAMES["candidates"]}


@pytest.mark.parametrize("reply,gt", [
    ("Adding them up gives 4521.\nAnswer: 4521", GT_NUMBER),
    ("Answer: 4,521 employees", GT_NUMBER),
    ("**Answer: 4521.0**", GT_NUMBER),
    ("Answer: Pine Holdings, Alder Group", GT_NAMES),
    ("Answer: 1. Pine Holdings 2. Alder Group", GT_NAMES),
    ("Answer: iris works.", GT_NAME),
])
def test_known_correct_answers(reply, gt):
    ok, reason = grade_answer(reply, gt)
    assert ok, reason


@pytest.mark.parametrize("reply,gt", [
    ("Answer: 4520", GT_NUMBER),
    ("The total is 4521.", GT_NUMBER),  # no "Answer:" line
    ("Answer: 4521 or maybe 4000\nAnswer: 4000", GT_NUMBER),  # the last answer counts
    ("Answer: Alder Group, Pine Holdings", GT_NAMES),  # wrong order
    ("Answer: Pine Holdings", GT_NAMES),  # incomplete
    ("Answer: Iris Works, not Alder Group", GT_NAME),  # hedging across candidates
    ("Answer: Iris", GT_NAME),
])
def test_known_wrong_answers(reply, gt):
    ok, reason = grade_answer(reply, gt)
    assert not ok and reason


def test_env_verify_reference_and_wrong_answers(env, tasks):
    for task in tasks:
        truth = reference_text(task.ground_truth)
        good = env.verify(task, _reply(f"<think>\nAnswer: wrong\n</think>\nAfter reading.\nAnswer: {truth}"))
        assert good.reward == 1.0 and good.components == {"exact": 1.0}, good.reason
        gt = task.ground_truth
        wrong = (str(gt["answer"] + 1) if gt["answer_type"] == "number"
                 else ", ".join(n for n in gt["candidates"] if n not in gt["answer"][:1]))
        assert env.verify(task, _reply(f"Answer: {wrong}")).reward == 0.0


@pytest.mark.parametrize("garbage", ["", None, "Answer:", "Answer: ¯\\_(ツ)_/¯", "Answer: " + "9" * 5000,
                                     "Answer: ,,,", "<think>Answer: 5", "\x00" * 10])
def test_garbage_scores_zero_without_exception(env, tasks, garbage):
    for task in tasks[:30]:
        result = env.verify(task, _reply(garbage))
        assert result.reward == 0.0 and result.reason


# --------------------------------------------------------------------------- judge mode


class CannedGenerator:
    def __init__(self, text: str) -> None:
        self.text = text
        self.prompts: list = []

    def generate(self, prompts, params, tools=None):
        self.prompts.extend(prompts)
        return [[Completion(text=self.text)] for _ in prompts]


def test_judge_mode_is_a_fallback_for_free_form_answers(tasks):
    gen = CannedGenerator("The reply states the same value.\nSCORE: 10/10")
    env = LongContextEnv(judge=LLMJudge(gen))
    task = tasks[0]
    truth = reference_text(task.ground_truth)
    assert env.verify(task, _reply(f"Answer: {truth}")).reward == 1.0
    assert gen.prompts == []  # a parsable correct answer never reaches the judge
    free_form = env.verify(task, _reply(f"I believe it is {truth}, judging by the reports."))
    assert free_form.reward == 1.0 and free_form.components == {"exact": 0.0, "judge": 1.0}
    (prompt,) = gen.prompts
    assert truth in prompt[-1]["content"] and task.ground_truth["question"] in prompt[-1]["content"]
    assert "[Document 1]" not in prompt[-1]["content"]  # the judge does not get the documents


def test_judge_mode_off_by_default_and_unparseable_judge_scores_zero(env, tasks):
    task = tasks[0]
    assert env.verify(task, _reply("It is probably the first one.")).components == {"exact": 0.0}
    bad_judge = LongContextEnv(judge=LLMJudge(CannedGenerator("looks right to me")))
    result = bad_judge.verify(task, _reply("It is probably the first one."))
    assert result.reward == 0.0 and "judge_unparseable" in result.reason

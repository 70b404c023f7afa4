"""The ``arithmetic`` environment: the pipeline's own problems, split by hash, graded by the math verifier."""

from __future__ import annotations

import pytest

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec
from posttrain.data.synthetic import arithmetic_rows, arithmetic_tasks
from posttrain.envs.base import make_env
from posttrain.serving.build import build_envs


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_splits_are_disjoint_reproducible_and_the_pipelines_heldout_problems():
    env = make_env("arithmetic")
    train, val = env.tasks("train", 1500, seed=0), env.tasks("dev", 200, seed=0)
    assert not {t.id for t in train} & {t.id for t in val}
    assert [t.id for t in env.tasks("train", 50, seed=3)] == [t.id for t in env.tasks("train", 50, seed=3)]
    # the held-out tasks the pipeline measures are this environment's validation tasks
    assert [t.id for t in arithmetic_tasks(40, 2, "dev")] == [t.id for t in env.tasks("dev", 40, 2)]
    sft_prompts = {r["messages"][0]["content"] for r in arithmetic_rows(2000, 0, "train")}
    assert not sft_prompts & {t.messages[0]["content"] for t in val}
    assert {t.metadata["digits"] for t in train} == {1, 2} and {t.metadata["op"] for t in train} == {"+", "-", "*"}


def test_verify_grades_the_answer_line_with_the_math_verifier():
    env = make_env("arithmetic")
    t = next(t for t in env.tasks("dev", 20) if t.metadata["op"] == "-")
    gold = t.ground_truth
    assert env.verify(t, _reply(f"<think>\ncolumns...\n</think>\nAnswer: {gold}")).reward == 1.0
    assert env.verify(t, _reply(f"Answer: {int(gold) + 1}")).reward == 0.0
    res = env.verify(t, _reply("I do not know"))
    assert res.reward == 0.0 and res.components["format"] == 0.0


def test_bad_arguments_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"envs\[0\]\.args: arithmetic refuses.*max_digits"):
        build_envs([EnvSpec(name="arithmetic", args={"max_digits": 5})])
    with pytest.raises(ConfigError, match="ops must be"):
        build_envs([EnvSpec(name="arithmetic", args={"ops": ["/"]})])
    with pytest.raises(ConfigError, match="phrasings must be"):
        build_envs([EnvSpec(name="arithmetic", args={"phrasings": ["poem"]})])
    with pytest.raises(ConfigError, match="phrasings must be"):
        build_envs([EnvSpec(name="arithmetic", args={"phrasings": ["words", "words"]})])
    assert make_env("arithmetic", max_digits=1, ops=["+"]).tasks("train", 10)[0].metadata == {
        "digits": 1, "op": "+", "answer_form": "number", "phrasing": "plain"}


def _problem(task_id: str) -> str:
    return task_id.removeprefix("arith-").removeprefix("words-").removeprefix("story-")


def test_phrasings_reword_the_same_problems_with_the_same_answer_instruction():
    plain = make_env("arithmetic").tasks("dev", 120, seed=0)
    mixed = make_env("arithmetic", phrasings=["plain", "words", "story"]).tasks("dev", 120, seed=0)
    # the same problems and answers, each in one wording chosen by the problem alone
    assert [t.ground_truth for t in plain] == [t.ground_truth for t in mixed]
    kinds = [t.metadata["phrasing"] for t in mixed]
    assert set(kinds) == {"plain", "words", "story"}
    for p, m in zip(plain, mixed):
        text = m.messages[0]["content"]
        assert text.endswith("Think step by step, then give the result as 'Answer: <number>'.")
        if m.metadata["phrasing"] == "plain":  # the SFT data's prompt and id, unchanged
            assert (m.id, text) == (p.id, p.messages[0]["content"])
        else:
            assert m.id == p.id.replace("arith-", f"arith-{m.metadata['phrasing']}-")
            assert text != p.messages[0]["content"]
    # a problem's wording does not depend on the seed or how many tasks are drawn
    again = {t.id for t in make_env("arithmetic", phrasings=["plain", "words", "story"]).tasks("dev", 40, seed=5)}
    by_problem = {_problem(i): i for i in {t.id for t in mixed}}
    assert all(by_problem.get(_problem(i), i) == i for i in again)
    # no held-out problem is a training problem in any wording
    train = make_env("arithmetic", phrasings=["words", "story"]).tasks("train", 1500, seed=0)
    assert not {_problem(t.id) for t in train} & {_problem(t.id) for t in mixed}
    t = next(t for t in mixed if t.metadata["phrasing"] == "story")
    assert make_env("arithmetic").verify(t, _reply(f"Answer: {t.ground_truth}")).reward == 1.0


def test_min_digits_keeps_problems_with_a_long_operand_and_leaves_the_default_draw_alone():
    two = make_env("arithmetic", min_digits=2).tasks("train", 300, seed=0)
    assert {t.metadata["digits"] for t in two} == {2}
    # the default (min_digits=1) draws exactly the problems the SFT data and the pipeline's held-out set use
    assert [t.id for t in make_env("arithmetic", min_digits=1).tasks("dev", 50, 2)] == \
        [t.id for t in arithmetic_tasks(50, 2, "dev")]
    with pytest.raises(ConfigError, match="min_digits must be"):
        build_envs([EnvSpec(name="arithmetic", args={"min_digits": 3, "max_digits": 2})])

"""The ``arithmetic`` environment: the pipeline's own problems, split by hash, graded by the math verifier."""

from __future__ import annotations

import pytest

from posttrain.configs import ConfigError
from posttrain.configs.rl import EnvSpec
from posttrain.data.synthetic import arithmetic_rows, arithmetic_tasks
from posttrain.envs.base import make_env
from posttrain.envs.build import build_envs


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_splits_are_disjoint_reproducible_and_the_pipelines_heldout_problems():
    env = make_env("arithmetic")
    train, val = env.tasks("train", 1500, seed=0), env.tasks("validation", 200, seed=0)
    assert not {t.id for t in train} & {t.id for t in val}
    assert [t.id for t in env.tasks("train", 50, seed=3)] == [t.id for t in env.tasks("train", 50, seed=3)]
    # the held-out tasks the pipeline measures are this environment's validation tasks
    assert [t.id for t in arithmetic_tasks(40, 2, "validation")] == [t.id for t in env.tasks("validation", 40, 2)]
    sft_prompts = {r["messages"][0]["content"] for r in arithmetic_rows(2000, 0, "train")}
    assert not sft_prompts & {t.messages[0]["content"] for t in val}
    assert {t.metadata["digits"] for t in train} == {1, 2} and {t.metadata["op"] for t in train} == {"+", "-", "*"}


def test_verify_grades_the_answer_line_with_the_math_verifier():
    env = make_env("arithmetic")
    t = next(t for t in env.tasks("validation", 20) if t.metadata["op"] == "-")
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
    assert make_env("arithmetic", max_digits=1, ops=["+"]).tasks("train", 10)[0].metadata == {
        "digits": 1, "op": "+", "answer_form": "number"}

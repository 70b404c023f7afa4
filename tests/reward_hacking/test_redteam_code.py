"""Reward-hacking red team: `code` (issue 12, item 4). Besides the shared cases (constants, exit
tricks, forged result lines, always-equal objects, hard-coded examples...), the task families
themselves are checked: no constant function can pass a task, even one that knows the answers
to the examples the prompt shows."""

from __future__ import annotations

import pytest
from redteam_helpers import make_suite

from posttrain.envs.code import tasks as code_tasks
from posttrain.envs.base import make_env
from posttrain.envs.code.env import MIN_TESTS, N_EXAMPLES, CodeEnv, best_constant_reward, grade
from posttrain.sandbox import CallOutcome, CallsResult, ExecResult, Status

env_and_tasks, test_red_team_case = make_suite("code")


def test_best_constant_earns_nothing_on_40_validation_tasks():
    """Issue 12: under the old fraction reward the best constant per task averaged 0.23."""
    tasks = CodeEnv().tasks("dev", n=40)
    assert sum(best_constant_reward(t.ground_truth["expected"]) for t in tasks) == 0.0
    fraction = sum(best_constant_reward(t.ground_truth["expected"], "fraction") for t in tasks) / 40
    assert fraction <= 0.5  # balanced tests: even partial credit pays a constant at most half


def test_every_task_defeats_constants_and_hard_coded_examples():
    """No expected output answers more than half of a task's tests, and at least
    N_EXAMPLES + 2 tests disagree with any constant, so 'hard-code the shown examples, return a
    constant otherwise' still fails a hidden test — on every task of both splits."""
    for name in code_tasks.FAMILIES:
        for k in range(code_tasks.VARIANTS_PER_FAMILY):
            expected = code_tasks.make_problem(name, k).expected
            margin = code_tasks.distinct_output_margin(expected)
            assert margin >= N_EXAMPLES + 2, (name, k, margin)


def test_hidden_tests_are_graded():
    task = CodeEnv().tasks("dev", n=1)[0]
    truth = task.ground_truth
    assert len(truth["shown"]) == N_EXAMPLES
    assert len(truth["expected"]) - N_EXAMPLES >= MIN_TESTS - N_EXAMPLES
    for i in truth["shown"]:  # the shown examples are in the prompt, the rest are not
        assert repr(truth["expected"][i]) in task.messages[0]["content"]


def test_reward_is_all_or_nothing_by_default_and_fraction_on_request():
    ok = ExecResult(Status.OK, 0, "", "", 0.01)
    nine_of_ten = CallsResult(ok, [CallOutcome("ok", 1)] * 9 + [CallOutcome("ok", 2)])
    assert grade(nine_of_ten, [1] * 10).reward == 0.0
    assert grade(nine_of_ten, [1] * 10, reward="fraction").reward == 0.9
    assert make_env("code", reward="fraction").reward == "fraction"  # recipes: envs[].args
    assert make_env("code").reward == "all"
    with pytest.raises(ValueError, match="reward"):
        CodeEnv(reward="partial")
    with pytest.raises(ValueError, match="tests_per_task"):
        CodeEnv(tests_per_task=MIN_TESTS - 1)

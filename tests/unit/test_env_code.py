"""The ``code`` environment: task families, answer extraction, output comparison, grading, and
end-to-end verification through the sandbox."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest

from posttrain.envs.code import tasks as code_tasks
from posttrain.envs.base import Task, make_env
from posttrain.envs.code.env import (
    CodeEnv,
    extract_code,
    grade,
    lookup_table_solution,
    outputs_match,
    problem_to_task,
)
from posttrain.sandbox import (
    CallOutcome,
    CallsResult,
    ExecResult,
    Limits,
    Sandbox,
    SandboxUnavailable,
    Status,
)
from posttrain.errors import UserError

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def env():
    with Sandbox(limits=Limits(wall_s=5.0), workers=2, allow_unisolated=not ROOT) as sandbox:
        yield CodeEnv(sandbox=sandbox, limits=Limits(wall_s=3.0, cpu_s=3.0), call_timeout_s=0.5)


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# -- extraction and comparison (pure) ---------------------------------------------------------


def test_extract_code_picks_the_last_python_block():
    text = ("Draft:\n```python\ndef f(): return 1\n```\nFixed:\n```python\ndef f():\n"
            "    return 2\n```\nDone.")
    assert extract_code(text) == ("def f():\n    return 2\n", "")
    plain = "```\ndef g(x):\n    return x\n```"
    assert extract_code(plain)[0] == "def g(x):\n    return x\n"
    assert extract_code("def h():\n    return 3\n")[0] == "def h():\n    return 3\n"


def test_extract_code_rejects_non_code():
    assert extract_code("")[0] is None
    assert extract_code("The answer is to loop over the list.")[1].startswith("no ```python")
    assert extract_code("```python\ndef f(:\n```")[1].startswith("syntax error: line 1")
    assert extract_code("```python\n\n```")[1] == "empty code block"
    assert extract_code("```js\nlet x = 1;\n```")[1].startswith("no python code block")


def test_outputs_match():
    assert outputs_match([1, [2, 3]], (1, (2, 3)))
    assert outputs_match(0.3, 0.1 + 0.2) and outputs_match(2, 2.0)
    assert outputs_match({"a": [1]}, {"a": (1,)})
    assert outputs_match(None, None)
    assert not outputs_match(True, 1) and not outputs_match(1, True)
    assert not outputs_match([1, 2], [1, 2, 3]) and not outputs_match("1", 1)
    assert not outputs_match({"a": 1}, {"a": 1, "b": 2}) and not outputs_match(0.3, 0.31)


def test_grade_counts_matches_and_names_the_first_failure():
    ok = ExecResult(Status.OK, 0, "", "", 0.01)
    outcomes = [CallOutcome("ok", 1), CallOutcome("ok", 5), CallOutcome("timeout", detail="t"),
                CallOutcome("ok", [3])]
    result = grade(CallsResult(ok, outcomes), [1, 2, 3, [3]])
    assert result.reward == 0.0  # the default rule: every test must pass
    assert result.components == {"tests_passed": 2.0, "tests_total": 4.0}
    assert "first failure: test 1 wrong answer: 5" in result.reason
    assert grade(CallsResult(ok, outcomes), [1, 2, 3, [3]], reward="fraction").reward == 0.5
    assert grade(CallsResult(ok, outcomes[:1]), [1]).reward == 1.0
    with pytest.raises(ValueError):
        grade(CallsResult(ok, outcomes), [1, 2, 3, [3]], reward="partial")
    load_failed = grade(CallsResult(ok, [CallOutcome("missing")], load_error="NameError: x"), [1])
    assert load_failed.reward == 0.0 and "failed to load" in load_failed.reason
    broken = ExecResult(Status.SANDBOX_ERROR, None, "", "", 0.0, "zygote died")
    assert grade(CallsResult(broken, [CallOutcome("missing")]), [1]).reason.startswith("sandbox")


# -- tasks ------------------------------------------------------------------------------------


def test_tasks_are_deterministic_and_splits_disjoint(env):
    a = env.tasks("train", n=30, seed=1)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in env.tasks("train", n=30, seed=1)]
    assert [t.id for t in a] != [t.id for t in env.tasks("train", n=30, seed=2)]
    train = set(code_tasks.task_ids("train", None, 0))
    validation, test = set(code_tasks.task_ids("dev", None, 0)), set(code_tasks.task_ids("test", None, 0))
    assert train and validation and test and not train & validation and not (train | validation) & test
    assert len(train) + len(validation) + len(test) == len(code_tasks.FAMILIES) * code_tasks.VARIANTS_PER_FAMILY
    assert {t.id for t in env.tasks("dev", n=50)} <= validation
    assert len({t.metadata["family"] for t in a}) >= 20  # families are interleaved


def test_every_family_makes_sound_tasks():
    assert len(code_tasks.FAMILIES) >= 15
    assert {f.difficulty for f in code_tasks.FAMILIES.values()} == {1, 2, 3}
    for name in code_tasks.FAMILIES:
        for k in range(3):
            problem = code_tasks.make_problem(name, k, n_tests=code_tasks.MAX_TESTS)
            assert len(problem.inputs) <= code_tasks.MAX_TESTS
            assert len({json.dumps(i) for i in problem.inputs}) == len(problem.inputs)
            assert len(problem.inputs) >= 5, name  # enough distinct tests to mean something
            assert json.loads(json.dumps([problem.inputs, problem.expected])) == [
                problem.inputs, problem.expected]
            assert "{" not in problem.spec.replace("{}", ""), problem.spec  # all fields filled
    with pytest.raises(ValueError):
        code_tasks.make_problem("lcs", 0, n_tests=code_tasks.MAX_TESTS + 1)


def test_prompt_states_the_format_and_examples(env):
    task = env.tasks("train", n=1)[0]
    prompt = task.messages[0]["content"]
    entry = task.ground_truth["entry"]
    assert f"def {entry}(" in prompt and "```python" in prompt
    assert len(re.findall(rf"^    {entry}\(.*\) == ", prompt, re.M)) == 2
    assert task.domain == "code" and Task.from_dict(json.loads(json.dumps(task.to_dict())))


# -- end to end through the sandbox -----------------------------------------------------------


def test_reference_lookup_solves_one_task_of_every_family(env):
    for task in (problem_to_task(code_tasks.make_problem(name, 0)) for name in code_tasks.FAMILIES):
        result = env.verify(task, answer(f"```python\n{lookup_table_solution(task)}```"))
        assert result.reward == 1.0, (task.id, result.reason)


def test_all_or_nothing_and_failures(env):
    task = problem_to_task(code_tasks.make_problem("reverse_words", 0))
    right = "```python\ndef reverse_words(s):\n    return ' '.join(reversed(s.split()))\n```"
    assert env.verify(task, answer(right)).reward == 1.0
    with_reasoning = [{"role": "assistant",
                       "content": "<think>\n```python\nbroken(\n```\n</think>\n" + right}]
    assert env.verify(task, with_reasoning).reward == 1.0  # reasoning is not graded
    naive = "```python\ndef reverse_words(s):\n    return ' '.join(reversed(s.split(' ')))\n```"
    partial = env.verify(task, answer(naive))
    n = len(task.ground_truth["expected"])
    assert partial.reward == 0.0 and "wrong answer" in partial.reason  # all tests or nothing
    assert 0 < partial.components["tests_passed"] < n == partial.components["tests_total"]
    fraction = CodeEnv(sandbox=env.sandbox, limits=env.limits, call_timeout_s=0.5,
                       reward="fraction").verify(task, answer(naive))
    assert 0.0 < fraction.reward < 1.0  # partial credit only when asked for
    assert fraction.components["tests_passed"] == round(fraction.reward * n)
    for text, reason in [("no idea", "no ```python"), ("```python\ndef reverse_words(s:\n```",
                                                       "syntax error"),
                         ("```python\ndef other(s):\n    return s\n```", "failed to load")]:
        result = env.verify(task, answer(text))
        assert result.reward == 0.0 and reason in result.reason, result.reason
    hang = "```python\ndef reverse_words(s):\n    while True:\n        pass\n```"
    impatient = CodeEnv(sandbox=env.sandbox, limits=Limits(wall_s=1.0), call_timeout_s=0.2)
    hung = impatient.verify(task, answer(hang))
    assert hung.reward == 0.0 and "timeout" in hung.reason


def test_verify_from_many_threads(env):
    tasks = env.tasks("dev", n=8)
    results: dict[str, float] = {}

    def work(task: Task) -> None:
        solution = f"```python\n{lookup_table_solution(task)}```"
        results[task.id] = env.verify(task, answer(solution)).reward

    threads = [threading.Thread(target=work, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {t.id: 1.0 for t in tasks}


def test_registered_under_code(env):
    made = make_env("code", sandbox=env.sandbox)
    assert isinstance(made, CodeEnv) and made.domain == "code"


def test_an_environment_that_cannot_isolate_refuses_to_start():
    """Fail closed: one clear line at construction, not a silently weaker sandbox."""
    with Sandbox(workers=1, isolate=False) as unisolated:
        with pytest.raises(SandboxUnavailable, match=r"allow_unisolated") as failure:
            CodeEnv(sandbox=unisolated)
    assert isinstance(failure.value, UserError) and "\n" not in str(failure.value)


def test_an_allowed_unisolated_environment_says_so_in_every_result():
    with Sandbox(workers=1, isolate=False, allow_unisolated=True) as allowed:
        env = CodeEnv(sandbox=allowed, limits=Limits(wall_s=3.0, cpu_s=3.0))
        task = env.tasks("dev", n=1)[0]
        solved = env.verify(task, answer(f"```python\n{lookup_table_solution(task)}```"))
        assert solved.reward == 1.0
        for result in (solved, env.verify(task, answer("no idea"))):
            assert "[unisolated sandbox: netns/fs: disabled" in result.reason, result.reason


def test_recipe_args_reach_the_sandbox():
    """RL recipes pass ``envs[].args`` to ``make_env``: the opt-out must get through."""
    made = make_env("code", allow_unisolated=True)
    assert made.allow_unisolated and made.sandbox.allow_unisolated

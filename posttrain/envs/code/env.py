"""The ``code`` environment: write a Python function; reward 1 when it passes every unit test.

Tasks come from the offline task families in ``tasks.py`` (spec + signature + reference
implementation + input generator); the tests compare the candidate's output with the reference
output on generated inputs, at most 50 per task (docs/recipe.md §2.2).

Reward (``CodeEnv(reward=...)``, settable from a recipe's ``envs[].args``):

* ``"all"`` (default, the recipe's rule): 1 if the function passes *every* test, else 0. Partial
  credit is what a policy farms: under the fraction rule ``return False`` earned 0.85 on one task,
  and the best constant output per task averaged 0.23 over 40 validation tasks.
* ``"fraction"``: the fraction of tests passed (for analysis or shaping, at your own risk).

Hidden tests: the prompt shows ``N_EXAMPLES`` = 2 of a task's tests (``ground_truth["shown"]``
lists which); grading runs all of them, so at least ``tests_per_task - 2`` tests are never shown.
Tests are balanced (``code_tasks.max_same_output``): no expected output answers more than half
of them, so a constant function fails at least 4 of them (``tests_per_task >= MIN_TESTS`` = 8), and
so does one that hard-codes the shown examples and returns a constant otherwise. The best
constant output per task averages 0 under ``"all"`` (``tests/reward_hacking/test_redteam_code.py``,
``bench/code_constant_baseline.py``).

Grading a rollout:

1. ``extract_code``: the last ```python fenced block of the final answer (reasoning is never
   graded); failing that the last untagged fenced block; failing that the whole answer if it
   parses as Python. No code, or code that does not parse -> reward 0 with the reason.
2. The sandbox (``posttrain/sandbox/``) defines the code once in a contained process and calls the
   entry function on every test input, each call under its own timer; it returns the outputs.
3. ``grade`` compares each output with the expected one on the host (``outputs_match``: tuples
   and lists are the same sequence, floats are compared with a tolerance, bools are not ints), so
   expected outputs never enter the sandbox.

``verify`` is stateless and thread-safe: callers may verify from many threads at once; the shared
sandbox runs at most one process per core and queues the rest.

The environment fails closed: it starts a sandbox slot when it is built and raises
``SandboxUnavailable`` (one line: what is missing, how to proceed) if the sandbox cannot isolate
the code. ``allow_unisolated=True`` runs anyway, and every verify result's reason then says so.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from posttrain.envs.code import tasks as code_tasks
from posttrain.envs.base import ENVIRONMENTS, Environment, Message, Split, Task, VerifyResult
from posttrain.envs.base import final_answer_text
from posttrain.sandbox import CallsResult, Limits, Sandbox, Status, default_sandbox

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
PYTHON_TAGS = {"python", "py", "python3"}

INSTRUCTIONS = (
    "Reply with the complete function (with any imports it needs) in one ```python code block. "
    "Use only the Python standard library; the function must return its result, not print it."
)

N_EXAMPLES = 2  # tests shown in the prompt; the others are hidden
MIN_TESTS = 8  # fewer tests could let "examples + a constant" pass every hidden test
REWARD_MODES = ("all", "fraction")

# Per task: each call gets CALL_TIMEOUT_S; the whole process (all tests) gets the limits below.
CALL_TIMEOUT_S = 1.0
TASK_LIMITS = Limits(wall_s=6.0, cpu_s=6.0, memory_bytes=512 << 20)


def extract_code(text: str) -> tuple[str | None, str]:
    """The code to grade and, when there is none, why. Pure."""
    blocks = FENCE.findall(text or "")
    tagged = [body for tag, body in blocks if tag.lower() in PYTHON_TAGS]
    untagged = [body for tag, body in blocks if not tag]
    if tagged:
        code = tagged[-1]
    elif untagged:
        code = untagged[-1]
    elif blocks:
        return None, f"no python code block (only ```{blocks[-1][0]} blocks)"
    else:
        code = text or ""
        if not code.strip():
            return None, "no code in the answer"
        if _syntax_error(code):
            return None, "no ```python code block, and the answer is not Python code"
    if not code.strip():
        return None, "empty code block"
    error = _syntax_error(code)
    if error:
        return None, f"syntax error: {error}"
    return code, ""


def _syntax_error(code: str) -> str:
    try:
        ast.parse(code)
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        return f"{type(e).__name__}: {e}"
    return ""


def outputs_match(expected: Any, got: Any, rel_tol: float = 1e-6) -> bool:
    """Whether a candidate output equals the reference output (JSON form). Pure.

    Tuples equal lists (the reference's JSON form has no tuples); floats match within
    ``rel_tol`` (and ints match equal floats); bools match only bools, so ``1`` is not ``True``.
    """
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int) and isinstance(got, int):
            return expected == got
        return math.isclose(expected, got, rel_tol=rel_tol, abs_tol=rel_tol)
    if isinstance(expected, list) and isinstance(got, (list, tuple)):
        return len(expected) == len(got) and all(map(outputs_match, expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(
            outputs_match(expected[k], got[k]) for k in expected)
    return type(expected) is type(got) and expected == got


def grade(result: CallsResult, expected: list[Any], reward: str = "all") -> VerifyResult:
    """Reward 1 if every output matches (``reward="all"``), or the fraction of tests whose output
    matches (``reward="fraction"``); the reason names the first failure."""
    if reward not in REWARD_MODES:
        raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
    n = len(expected)
    components = {"tests_passed": 0.0, "tests_total": float(n)}
    if result.exec.status is Status.SANDBOX_ERROR:
        return VerifyResult(0.0, components, f"sandbox_error: {result.exec.reason}")
    if result.load_error:
        return VerifyResult(0.0, components, f"solution failed to load: {result.load_error}")
    passed, first_failure = 0, ""
    for i, (outcome, want) in enumerate(zip(result.outcomes, expected)):
        if outcome.kind == "ok" and outputs_match(want, outcome.value):
            passed += 1
        elif not first_failure:
            got = repr(outcome.value)[:60] if outcome.kind == "ok" else outcome.detail[:120]
            what = "wrong answer" if outcome.kind == "ok" else outcome.kind
            first_failure = f"; first failure: test {i} {what}: {got}"
    components["tests_passed"] = float(passed)
    reason = f"passed {passed}/{n} tests{first_failure}"
    if result.exec.status is not Status.OK:
        reason += f" ({result.exec.status.value}: {result.exec.reason})"
    if reward == "fraction":
        return VerifyResult(passed / n if n else 0.0, components, reason)
    return VerifyResult(1.0 if n and passed == n else 0.0, components, reason)


def best_constant_reward(expected: list[Any], reward: str = "all") -> float:
    """The reward of the best constant function on a task with these expected outputs: an upper
    bound on what returning one fixed value can earn (only an expected value can match, so the
    candidates are the expected outputs themselves). Pure; no sandbox."""
    if not expected:
        return 0.0
    best = max(sum(outputs_match(e, c) for e in expected) for c in expected)
    if reward == "fraction":
        return best / len(expected)
    return 1.0 if best == len(expected) else 0.0


def pick_examples(problem: code_tasks.CodeProblem, k: int) -> list[int]:
    """Indices of tests to show: the last edge case, then random tests, skipping any whose
    expected output repeats one already shown (two examples that both return [] teach little)."""
    n_edges = len(problem.family.edges(problem.params))
    order = [i for i in range(max(n_edges - 1, 0), len(problem.inputs))]
    picked: list[int] = []
    for i in order:
        if all(problem.expected[i] != problem.expected[j] for j in picked):
            picked.append(i)
        if len(picked) == k:
            break
    return picked


def render_prompt(problem: code_tasks.CodeProblem, n_examples: int = N_EXAMPLES) -> str:
    """The user message: signature, spec, two worked examples, and the answer format."""
    fam = problem.family
    picks = pick_examples(problem, n_examples)
    examples = "\n".join(
        f"    {fam.entry}({', '.join(map(repr, problem.inputs[i]))}) == {problem.expected[i]!r}"
        for i in picks)
    return (f"Write a Python function with this signature:\n\n    {fam.signature}\n\n"
            f"{problem.spec}\n\nExamples:\n{examples}\n\n{INSTRUCTIONS}")


def problem_to_task(problem: code_tasks.CodeProblem) -> Task:
    return Task(
        id=problem.task_id,
        domain="code",
        messages=[{"role": "user", "content": render_prompt(problem)}],
        ground_truth={"entry": problem.family.entry, "inputs": problem.inputs,
                      "expected": problem.expected, "shown": pick_examples(problem, N_EXAMPLES)},
        metadata={"family": problem.family.name, "difficulty": problem.family.difficulty,
                  "params": problem.params, "reference": problem.family.reference.__name__},
    )


def lookup_table_solution(task: Task) -> str:
    """Source that passes every test of ``task`` by looking the answers up: a stand-in for a
    correct solution in tests and benchmarks (the reference code lives in the repository, which
    the sandbox cannot see)."""
    truth = task.ground_truth
    table = {repr(args): out for args, out in zip(truth["inputs"], truth["expected"])}
    return (f"TABLE = {table!r}\n\n"
            f"def {truth['entry']}(*args):\n    return TABLE[repr(list(args))]\n")


@ENVIRONMENTS.register("code")
class CodeEnv(Environment):
    name = "code"
    domain = "code"

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        tests_per_task: int = code_tasks.DEFAULT_TESTS,
        call_timeout_s: float = CALL_TIMEOUT_S,
        limits: Limits = TASK_LIMITS,
        allow_unisolated: bool = False,
        reward: str = "all",
    ) -> None:
        """``sandbox``: defaults to the process-wide shared one (one slot per core), built with
        ``allow_unisolated``; a sandbox passed in follows its own ``allow_unisolated``.
        ``allow_unisolated``: grade even where the sandbox cannot isolate model code (not root,
        namespaces refused); without it such an environment refuses to start. ``reward``: "all"
        (1 only if every test passes) or "fraction" (share of tests passed)."""
        if not MIN_TESTS <= tests_per_task <= code_tasks.MAX_TESTS:
            raise ValueError(f"tests_per_task must be in [{MIN_TESTS}, {code_tasks.MAX_TESTS}]"
                             f", got {tests_per_task}")
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        self.reward = reward
        self._sandbox = sandbox
        self.allow_unisolated = allow_unisolated
        self.tests_per_task = tests_per_task
        self.call_timeout_s = call_timeout_s
        self.limits = limits
        missing = self.sandbox.check()  # fail closed now, not at the first verify
        self._unisolated_note = f" [unisolated sandbox: {'; '.join(missing)}]" if missing else ""

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox or default_sandbox(self.allow_unisolated)

    def tasks(self, split: Split = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return [problem_to_task(code_tasks.make_problem(*code_tasks.parse_task_id(tid),
                                                        n_tests=self.tests_per_task))
                for tid in code_tasks.task_ids(split, n, seed)]

    def verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        result = self._verify(task, messages)
        if self._unisolated_note:  # every result of an unisolated environment says so
            result.reason += self._unisolated_note
        return result

    def _verify(self, task: Task, messages: list[Message]) -> VerifyResult:
        truth = task.ground_truth
        components = {"tests_passed": 0.0, "tests_total": float(len(truth["expected"]))}
        code, why = extract_code(final_answer_text(messages))
        if code is None:
            return VerifyResult(0.0, components, why)
        result = self.sandbox.run_calls(code, truth["entry"], truth["inputs"],
                                        call_timeout_s=self.call_timeout_s, limits=self.limits)
        return grade(result, truth["expected"], self.reward)

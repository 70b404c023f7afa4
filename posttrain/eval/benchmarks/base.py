"""Shared types of the external benchmarks (see ``posttrain/eval/benchmarks/__init__.py``)."""

from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from posttrain.errors import UserError

INSTALL = "pip install -e '.[bench]' (make setup installs it)"


def require(module: str, package: str) -> Any:
    """Import ``module`` (from the PyPI package ``package``) or raise a ``UserError`` saying how to
    install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"benchmark needs the PyPI package {package!r} ({module} does not import: {e}); "
                        f"{INSTALL}") from e


@dataclass
class BenchmarkOptions:
    """What ``posttrain eval`` passes to a benchmark. ``n``: items per category (None = all);
    ``split``: the split of our own environments (ifeval/ifbench), a required choice of the caller."""

    split: str
    n: int | None = None
    k: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    reasoning: bool = True
    categories: tuple[str, ...] = ()
    progress: Any = None  # a tqdm bar (optional): advanced by one per generated completion


@dataclass
class BenchmarkResult:
    name: str
    summary: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Benchmark:
    name: str
    package: str
    what: str
    run: Callable[[Any, BenchmarkOptions], BenchmarkResult]
    result_line: Callable[[BenchmarkResult], str]
    """One line: ``<figure> <unit> (<what>)`` for ``RESULT <name>: ...``."""


def proportion_se(p: float, n: int) -> float:
    """Binomial standard error of a proportion over ``n`` independent items (0 for n < 2)."""
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0


def generate_texts(generator: Any, prompts: Sequence[list[dict[str, Any]]],
                   tools: Sequence[list[dict[str, Any]] | None] | None, options: BenchmarkOptions,
                   batch_size: int | None = None) -> list[list[Any]]:
    """``options.k`` completions per prompt (``engines.base.Completion``), in prompt order, generated
    in chunks of about one generator batch (so the progress bar moves)."""
    from posttrain.engines.base import SamplingParams

    params = SamplingParams(max_new_tokens=options.max_new_tokens, temperature=options.temperature,
                            top_p=options.top_p, n=options.k, seed=options.seed, reasoning=options.reasoning)
    chunk = max(1, (batch_size or getattr(generator, "batch_size", 16)) // options.k)
    out: list[list[Any]] = []
    for lo in range(0, len(prompts), chunk):
        part_tools = list(tools[lo:lo + chunk]) if tools is not None else None
        out.extend(generator.generate(list(prompts[lo:lo + chunk]), params, part_tools))
        if options.progress is not None:
            options.progress.update(min(chunk, len(prompts) - lo) * options.k)
    return out

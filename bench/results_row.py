"""How every bench records a result: one JSON line appended to ``bench/results/<name>.jsonl`` (and
the mean ± standard error the benches report repeated timings with)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def append_row(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line, in one write (a concurrent bench cannot interleave with it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def commit() -> str:
    """The checkout's short commit, or "unknown" outside a git checkout (every row names its code)."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine(load_before: float, load_after: float, **extra: Any) -> dict[str, Any]:
    """Where a figure was measured: cores, CPU, the 1-minute load average before and after, and
    whatever else the bench adds (threads, capability)."""
    return {"cores": os.cpu_count(), "cpu": cpu_facts(), "load_before": load_before, "load_after": load_after, **extra}


def cpu_facts(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model and the vector extensions that decide a run's speed (models/precision.py's
    ``VECTOR_FLAGS``): a wall time or a GFLOP/s means nothing without them; and whether MKL's vendor
    check was lifted on an AMD CPU (models/blas.py: 1.3-2.5x on fp32 matmuls there); and the CPU family and
    model numbers, because a masked model name ("AMD EPYC") hides whether it is Zen 4 (family 25) or Zen 5
    (family 26), whose fp32 matmuls differ 2.3x here."""
    from posttrain.models import blas
    from posttrain.models.cpuinfo import cpu_fields, cpu_info
    from posttrain.models.precision import VECTOR_FLAGS

    model, flags = cpu_info(cpuinfo)
    facts = {"model": model, "vector": [f for f in VECTOR_FLAGS if f in flags], "mkl_amd": blas.STATE}
    fields = cpu_fields(cpuinfo)
    if "cpu family" in fields:
        facts["family"] = f"{fields['cpu family']}/{fields.get('model', '?')}"
    return facts


SPEED_ENV = ("POSTTRAIN_", "MKL_", "ONEDNN_", "DNNL_", "OMP_", "KMP_", "GOMP_")


def speed_env(environ: Any = None) -> dict[str, str]:
    """The environment settings that change a run's speed or its floats (an injected precision probe,
    MKL's or oneDNN's instruction cap, OpenMP's threads and wait policy): a row measured under any of
    them is not the plain command's figure, and says so."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(SPEED_ENV) and k != "POSTTRAIN_CACHE"}


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of repeated measurements (nan se for a single one)."""
    import statistics

    return statistics.fmean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))

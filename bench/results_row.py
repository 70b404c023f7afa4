"""How every bench records a result: one JSON line appended to ``bench/results/<name>.jsonl`` (and
the mean ± standard error the benches report repeated timings with).

Provenance: every row says how to reproduce it and where it was measured, from ``provenance(split)``:

* ``command`` — the command line that produced it, ``python <script relative to the repository> <args>``;
* ``commit`` — the checkout's short commit;
* ``machine`` — cores, the CPU (``cpu_facts``: model, vector flags, MKL shim, family) and the load
  averages (1, 5, 15 min) when the row is written; benches that watch the load around their timing
  pass ``machine(load_before, load_after, ...)`` instead;
* ``split`` — the data split the row's figures were measured on: ``train``, ``dev`` or ``test``
  (envs/splits.py), or ``none`` for a speed bench that grades nothing (its inputs are made up or
  only timed);
* ``time`` — when (UTC, ISO 8601).

``append_row`` refuses a row without ``command``, ``commit``, ``split`` and ``machine`` (or the
pipeline rows' ``cpu``), so no bench can write an unprovenanced row. Rows written before this rule
are history: some lack these keys, and they stay as written (tests/unit/test_provenance.py counts them).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test", "none")  # what a row's "split" may be ("none": a speed bench, nothing graded)
DATA_SPLITS = SPLITS[:3]  # the data splits (envs/splits.py), for a bench's --split
PROVENANCE = ("command", "commit", "split")  # and "machine" (or "cpu"): every row has them


def append_row(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line, in one write (a concurrent bench cannot interleave with it).
    A row without its provenance (``provenance(split)``) is refused with a ValueError."""
    missing = [k for k in PROVENANCE if k not in record]
    if "machine" not in record and "cpu" not in record:
        missing.append("machine")
    if missing:
        raise ValueError(f"{Path(path).name}: row without {', '.join(missing)}; add **provenance(split) "
                         f"(bench/results_row.py) to it")
    if not isinstance(record["split"], str) or not record["split"]:
        raise ValueError(f"{Path(path).name}: row's split is {record['split']!r}; give one of {', '.join(SPLITS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def provenance(split: str, machine_facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keys every row carries (module docstring): ``command``, ``commit``, ``machine``, ``split``,
    ``time``. ``split`` is ``train``, ``dev``, ``test`` or ``none``; ``machine_facts`` replaces the
    machine read now (``machine(load_before, load_after, ...)`` from a bench that timed something)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: give one of {', '.join(SPLITS)} (none: a speed bench that grades nothing)")
    return {"command": command(), "commit": commit(), "split": split,
            "machine": machine_facts if machine_facts is not None else machine_now(),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def command(argv: list[str] | None = None) -> str:
    """The command line that reproduces a row: ``python bench/NAME.py ARGS`` (the script's path
    relative to the repository root when it lies inside it, each argument shell-quoted)."""
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv else ""
    if script and script != "-c":
        try:
            script = str(Path(script).resolve().relative_to(ROOT))
        except ValueError:
            pass
    return shlex.join(["python", script, *argv[1:]]) if script else "python"


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_now(**extra: Any) -> dict[str, Any]:
    """Where a row was written: cores, CPU (``cpu_facts``) and the load averages now."""
    return {"cores": os.cpu_count(), "cpu": cpu_facts(), "loadavg": loadavg(), **extra}


def commit() -> str:
    """The checkout's short commit, or "unknown" outside a git checkout (every row names its code)."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine(load_before: float, load_after: float, **extra: Any) -> dict[str, Any]:
    """Where a figure was measured: cores, CPU, the 1-minute load average before and after (and the
    1, 5, 15 minute ones at the end), and whatever else the bench adds (threads, capability)."""
    return {"cores": os.cpu_count(), "cpu": cpu_facts(), "load_before": load_before, "load_after": load_after,
            "loadavg": loadavg(), **extra}


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


def record_args(ap: Any, results: Path) -> None:
    """``--no-record`` and ``--results`` of a bench that appends to ``results`` (its jsonl)."""
    ap.add_argument("--no-record", action="store_true", help="print only; append no row")
    ap.add_argument("--results", default=str(results), help="the jsonl the row is appended to")


def refuse_smoke_record(ap: Any, args: Any, results: Path) -> None:
    """A ``--smoke`` run (random tiny model) may not append to the bench's own results file."""
    if args.smoke and not args.no_record and Path(args.results).resolve() == results:
        ap.error(f"--smoke figures are not evidence: add --no-record, or --results PATH outside {results.parent}")

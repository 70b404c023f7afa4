"""CPU threads that do not fight on a shared machine (measured: bench/threads.py, docs/benchmarks.md).

On a 2-core machine whose cores other processes also use, torch's default (one OpenMP thread per
core, threads spinning while they wait for each other) decoded ~10x *slower* than one thread:
each parallel region waits for the thread whose core is taken. Two settings, applied by the CLI
before torch starts (so ``OMP_*`` variables are still read), each only when the user has not set it:

* ``OMP_NUM_THREADS``: one thread per *idle* core at start — cores minus the 1-minute load average,
  rounded, at least 1 — so a busy machine gets 1 thread and an idle one all its cores;
* ``OMP_WAIT_POLICY=PASSIVE``: a thread that waits sleeps instead of spinning, giving its core back
  to whoever else needs it; if the machine gets busy after the start, the run degrades instead of
  collapsing (measured 4x better than the default policy with 2 threads on a loaded machine).

``train.threads`` / ``--threads`` still set an exact count.
"""

from __future__ import annotations

import os


def idle_cores() -> int:
    """Cores this process may use minus the 1-minute load average, rounded, at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(cores, round(cores - load)))


def set_thread_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` where unset; returns what was set."""
    env = os.environ if environ is None else environ
    chosen = {}
    if "OMP_NUM_THREADS" not in env:
        chosen["OMP_NUM_THREADS"] = str(idle_cores())
    if "OMP_WAIT_POLICY" not in env:
        chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    env.update(chosen)
    return chosen

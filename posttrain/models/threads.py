"""CPU threads that do not fight on a shared machine (measured: bench/threads.py, docs/benchmarks.md).

On a 2-core machine whose cores other processes also use, torch's default (one OpenMP thread per
core, threads spinning while they wait for each other) decoded ~10x *slower* than one thread:
each parallel region waits for the thread whose core is taken. Two settings, applied by the CLI
before torch starts (so ``OMP_*`` variables are still read), each only when the user has not set it:

* ``OMP_NUM_THREADS``: one thread per *idle* core at start — cores minus the cores busy over a
  tenth of a second (``/proc/stat``, the CPUs this process may run on; 10 clock ticks a CPU, enough
  to round to whole cores, and every command pays it at start), rounded, at least 1 — so
  a busy machine gets 1 thread and an idle one all its cores. Not the 1-minute load average: on
  this project's VMs it idles at 0.4–1.0 with the CPUs 99.6% idle (kernel threads such as
  ``kdamond`` count), which rounded a 2-core idle machine down to 1 thread whenever it read above
  0.5 (a ``--quick`` run started at load 0.66 got 1 thread: 5.5 min instead of 4.4); the load
  average is the fallback without /proc;
* ``OMP_WAIT_POLICY=PASSIVE``: a thread that waits sleeps instead of spinning, giving its core back
  to whoever else needs it; if the machine gets busy after the start, the run degrades instead of
  collapsing (measured 4x better than the default policy with 2 threads on a loaded machine).

``train.threads`` / ``--threads`` still set an exact count.
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_times(cpus: set[int], stat: str = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) jiffies summed over ``cpus`` from ``/proc/stat``; None where it cannot be read."""
    busy = total = 0.0
    try:
        lines = Path(stat).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        head, _, rest = line.partition(" ")
        if head.startswith("cpu") and head[3:].isdigit() and int(head[3:]) in cpus:
            # user nice system idle iowait irq softirq steal (guest is already in user)
            v = [float(x) for x in rest.split()[:8]]
            total += sum(v)
            busy += sum(v) - v[3] - v[4]
    return (busy, total) if total else None


def busy_cores(cpus: set[int], interval: float = 0.1, stat: str = "/proc/stat") -> float | None:
    """How many of ``cpus`` other work kept busy over ``interval`` seconds; None without /proc/stat."""
    import time

    first = cpu_times(cpus, stat)
    if first is None:
        return None
    time.sleep(interval)
    second = cpu_times(cpus, stat)
    if second is None or second[1] <= first[1]:
        return None
    return len(cpus) * (second[0] - first[0]) / (second[1] - first[1])


def idle_cores(interval: float = 0.1) -> int:
    """Cores this process may use minus the busy ones (``busy_cores``; the 1-minute load average
    where /proc/stat is missing), rounded, at least 1."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        cpus = set(range(os.cpu_count() or 1))
    busy = busy_cores(cpus, interval)
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except OSError:
            busy = 0.0
    return max(1, min(len(cpus), round(len(cpus) - busy)))


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

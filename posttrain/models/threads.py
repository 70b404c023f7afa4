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
* ``OMP_WAIT_POLICY``: ``PASSIVE`` (a thread that waits sleeps instead of spinning, giving its core
  back to whoever else needs it; measured 4x better than the default policy with 2 threads on a
  loaded machine) — except on a machine that is idle at start, where the policy stays libgomp's
  (spin a while, then sleep): on 2 idle cores that made the pipeline's SFT step 1.10-1.22x and its
  greedy decoding 1.22-1.27x faster than ``PASSIVE`` (``bench/threads.py --idle-policies``, two
  runs). Spinning is what collapses when other work takes a core (beside one matmul process: SFT
  step 19.9 s spinning, 11.3 passive), so such a run is *governed* (:class:`Governor`): every couple
  of seconds, at the micro-batches of the training loop and the steps of the decode loop
  (:func:`govern`), it measures how many cores other processes keep busy and gives torch the idle
  ones (one thread waits on nobody), raising the count again when they leave (11.4 s governed).

``train.threads`` / ``--threads`` still set an exact count (and end the governing).
"""

from __future__ import annotations

import os
import sys
import time
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


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def idle_cores(interval: float = 0.1) -> int:
    """Cores this process may use minus the busy ones (``busy_cores``; the 1-minute load average
    where /proc/stat is missing), rounded, at least 1."""
    cpus = allowed_cpus()
    busy = busy_cores(cpus, interval)
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except OSError:
            busy = 0.0
    return max(1, min(len(cpus), round(len(cpus) - busy)))


class Governor:
    """Keep torch's threads to the cores other processes leave idle, measured as the run goes.

    ``tick`` (cheap: a clock read unless ``every_s`` has passed) reads ``/proc/stat`` for this
    process's CPUs and the process's own CPU time; what other processes used over the window is the
    difference. Torch gets ``round(cores - others)`` threads, at least 1, at most ``max_threads``. A
    thread count set by anyone else (``torch.set_num_threads``: ``--threads``, a worker) ends it.
    """

    def __init__(self, max_threads: int, cpus: set[int] | None = None, every_s: float = 2.0,
                 stat: str = "/proc/stat") -> None:
        self.max_threads, self.every_s, self.stat = max_threads, every_s, stat
        self.cpus = cpus if cpus is not None else allowed_cpus()
        self.current = max_threads
        self.active = True
        self.changes = 0
        self._last: tuple[float, float, float, float] | None = None  # (clock, busy, total, own CPU s)

    def target(self, now: float, own_cpu_s: float) -> int | None:
        """The thread count for the window since the last reading (None: no full window yet)."""
        times = cpu_times(self.cpus, self.stat)
        if times is None:
            self.active = False  # nothing to measure with: leave the threads alone
            return None
        last, self._last = self._last, (now, times[0], times[1], own_cpu_s)
        if last is None or times[1] <= last[2] or now <= last[0]:
            return None
        busy = len(self.cpus) * (times[0] - last[1]) / (times[1] - last[2])
        others = max(0.0, busy - (own_cpu_s - last[3]) / (now - last[0]))
        return max(1, min(self.max_threads, round(len(self.cpus) - others)))

    def tick(self) -> None:
        now = time.monotonic()
        if not self.active or (self._last is not None and now - self._last[0] < self.every_s):
            return
        import torch

        if torch.get_num_threads() != self.current:  # someone set the threads on purpose
            self.active = False
            return
        want = self.target(now, time.process_time())
        if want is None or want == self.current:
            return
        if self.changes < 5:
            print(f"[threads] other processes are using the cores: torch threads {self.current} -> {want}"
                  if want < self.current else f"[threads] cores idle again: torch threads {self.current} -> {want}",
                  file=sys.stderr)
        torch.set_num_threads(want)
        self.current = want
        self.changes += 1


GOVERNOR: Governor | None = None
"""The process's governor, when ``set_thread_defaults`` chose spinning threads (an idle machine)."""


def govern() -> None:
    """A step boundary (training loop, decode loop): let the governor, if any, adjust the threads."""
    if GOVERNOR is not None:
        GOVERNOR.tick()


def stop_governing() -> None:
    """An exact thread count was asked for (``--threads``): no more adjusting."""
    global GOVERNOR
    GOVERNOR = None


def set_exact(n: int) -> None:
    """torch's (process-wide) thread count set to ``n``, and kept there (no governing)."""
    import torch

    torch.set_num_threads(n)
    stop_governing()


def set_thread_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` where unset; returns what was set. On a machine
    idle at start with more than one core, the wait policy stays libgomp's (spin, then sleep) and the
    process is governed (module docstring)."""
    global GOVERNOR
    env = os.environ if environ is None else environ
    chosen = {}
    n = None  # the thread count we chose; None: the user's
    if "OMP_NUM_THREADS" not in env:
        n = idle_cores()
        chosen["OMP_NUM_THREADS"] = str(n)
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        if n is not None and n > 1 and n == len(allowed_cpus()):  # the whole machine, idle
            GOVERNOR = Governor(n)
        else:
            chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    env.update(chosen)
    return chosen

"""Run untrusted Python (model-written code) in contained, short-lived processes.

The code environment grades a rollout by running the model's function on test inputs, and a
policy under RL may eventually try anything a program can do to a machine. Design:

* **One process per task, not per test.** ``run_calls`` sends the candidate source and *all* test
  inputs to one sandboxed process. A small harness in it defines the candidate once and calls it
  on each input under its own per-call timer, writing one line per call to a result descriptor.
* **The harness reports outputs; the host grades them.** Expected outputs never enter the sandbox:
  the harness writes ``repr(output)``, the host parses it with ``ast.literal_eval`` and compares.
  Code that forges lines on the result channel can only claim outputs, which is no easier than
  computing them, so the channel needs no integrity protection.
* **A zygote per worker slot.** Interpreter start-up (and importing ctypes for the namespace
  syscalls) costs far more than a test, so each slot keeps one pre-started interpreter
  (``python -I -S -B``: no site-packages, no user paths, no env-var influence, common stdlib
  modules pre-imported, garbage frozen so children do not copy the heap) that ``fork``s a fresh
  child per run. The child is a copy of a pristine interpreter, so nothing leaks between runs.
  The zygote enforces the wall-clock deadline (pidfd poll, then it kills the run's init; it does
  so at once if the host hangs up) and reports the exit status over a ``SOCK_SEQPACKET`` socket; the host passes the child's files (job, stdin, stdout,
  stderr, results) as descriptors over the same socket.
* **Namespaces once per zygote, confinement per child.** At start the zygote (root) enters a new
  network namespace (loopback down: nothing, not even the host's 127.0.0.1, is reachable) and a
  new mount namespace, where it builds a private root on a size-limited tmpfs holding read-only
  binds of only the system libraries, a few devices and the directories its own interpreter
  reads (its prefixes and ``sys.path``, at their real paths, with the symlinks on the way
  recreated), so it works wherever the interpreter lives, /tmp included. Neither the repository,
  which has the reference solutions, nor the rest of ``/root``, ``/etc``, ``/proc`` or ``/tmp``
  is visible. Creating and tearing down mounts per run would cost more than everything else a
  run does, and runs of one slot follow each other, so they share them. Each child then, before
  any untrusted code: starts a new session, ``chroot``s into the private root and enters its own
  fresh working directory (the only writable place; the zygote removes it after the run), sets
  resource limits (CPU, address space, file size, open files, processes), sets
  ``no_new_privs`` and switches to the slot's unprivileged uid.
* **A PID namespace per run.** The child is created in a fresh PID namespace (cheap, unlike
  mounts) whose init it is: it forks the program, waits for it and reports its status. When init
  exits (right after the program, at the deadline when the zygote kills it, or when the zygote
  dies: ``PR_SET_PDEATHSIG``) the kernel kills every process left in the namespace, so nothing a
  run started outlives it, ``setsid`` or not; and the program sees no process but its own run's.
* **Uids of its own per Sandbox.** Each slot of each ``Sandbox`` claims a uid (from
  ``UID_BASE`` up, skipping any a live process runs as) through a lock file in ``STATE_DIR``,
  held as long as the Sandbox lives and dropped by the kernel when its process dies, however.
  So independent processes never share a uid: ``RLIMIT_NPROC``, which counts per uid, caps a
  fork bomb per slot without starving anyone else, and the child cannot signal the host or
  another sandbox's runs. The slot's scratch directory sits next to its lock; the next Sandbox
  to start removes those whose lock nobody holds (their owner was killed).
* **Output goes to anonymous memory files** (memfd), not pipes: ``RLIMIT_FSIZE`` bounds them in the
  kernel, so a flood costs the host nothing and needs no reader thread; a file that reached the
  limit means ``output_limit``.
* **Fail closed.** The zygote reports what it could not set up; a slot without complete isolation
  (not root, namespaces or mounts refused, ``isolate=False``) raises ``SandboxUnavailable``
  unless the Sandbox was built with ``allow_unisolated=True``. Then children run with a new
  session, resource limits, an empty environment and a fresh working directory, but without
  whatever was missing; every result lists what the run had (``isolation``) and what it lacked
  and why (``fallbacks``). See docs/sandbox.md.

Threads: ``run_program`` / ``run_calls`` may be called from any number of threads; callers beyond
``workers`` wait for a free slot. ``submit_*`` use an internal pool of ``workers`` threads.
A ``Sandbox`` must not be shared across ``os.fork`` (its sockets would be shared too).

The package: ``results.py`` (limits, statuses, what a run returns, and the pure parsing of the
harness's result lines), ``zygote.py`` (the code that runs inside the zygote and its children, sent
as source, and the private root's plan), ``host.py`` (the ``Sandbox`` pool of slots: uids, locks,
scratch directories, zygote handles). It imports no environment: the ``code`` environment and the
HumanEval benchmark are its callers (an import-linter contract keeps it so).
"""

from posttrain.sandbox.host import (MAX_VALUE_REPR, SLOT_SPAN, STATE_DIR, UID_BASE, Sandbox, SandboxUnavailable,
                                    default_sandbox)
from posttrain.sandbox.results import (EXIT_MEMORY, EXIT_SETUP, CallOutcome, CallsResult, ExecResult, Limits, Status,
                                       classify, parse_call_lines)
from posttrain.sandbox.zygote import CHILD_ENV, DEVICES, PRELOAD, SYSTEM_PATHS, root_plan

__all__ = ["CHILD_ENV", "DEVICES", "EXIT_MEMORY", "EXIT_SETUP", "MAX_VALUE_REPR", "PRELOAD", "SLOT_SPAN", "STATE_DIR",
           "SYSTEM_PATHS", "UID_BASE", "CallOutcome", "CallsResult", "ExecResult", "Limits", "Sandbox",
           "SandboxUnavailable", "Status", "classify", "default_sandbox", "parse_call_lines", "root_plan"]

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
"""

from __future__ import annotations

import ast
import atexit
import fcntl
import inspect
import logging
import marshal
import os
import queue
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

from posttrain.errors import UserError

log = logging.getLogger(__name__)

# Exit codes the child uses for outcomes the host must tell apart from a program's own codes.
EXIT_MEMORY = 109
EXIT_SETUP = 110

# Environment of the zygote and its children: nothing inherited from the host (secrets live there).
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}

# Host paths bound read-only into the private root besides the interpreter's prefixes: the system
# libraries that stdlib extension modules link against. Symlinks (merged /usr) are recreated.
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

# Imported once by each zygote, so a candidate's `import re` costs nothing in the forked child.
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
           "typing", "operator", "copy")

# Slot uids are claimed from UID_BASE up, one per slot of every live Sandbox on the machine, through
# lock files in STATE_DIR (which also holds the slots' scratch directories). Earlier versions ran
# every sandbox as 2_000_000 + slot and killed all of that uid at each run start: a new range
# keeps such a process, running alongside, from killing these runs.
UID_BASE = 2_100_000
SLOT_SPAN = 65_536
STATE_DIR = "/run/posttrain-sandbox"

MAX_VALUE_REPR = 200_000  # longest repr of one call's output the harness reports
ZYGOTE_GRACE_S = 5.0  # how long past the deadline the host waits for the zygote's answer


class SandboxUnavailable(UserError, RuntimeError):
    """Isolation (or the sandbox's state directory) cannot be set up and unisolated runs were not
    allowed."""


class Status(str, Enum):
    OK = "ok"
    RUNTIME_ERROR = "runtime_error"  # non-zero exit / uncaught exception
    TIMEOUT = "timeout"  # wall-clock or CPU limit
    MEMORY = "memory"  # MemoryError under the address-space limit
    OUTPUT_LIMIT = "output_limit"  # stdout / stderr / the result channel reached the size limit
    KILLED = "killed"  # died of a signal that no limit explains
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed (setup, zygote)


@dataclass(frozen=True)
class Limits:
    """Per-execution resource limits. In ``run_calls`` each call also has its own timer."""

    wall_s: float = 10.0
    """Wall-clock limit for the whole process; the process group is killed at the deadline."""
    cpu_s: float = 10.0
    """CPU seconds (RLIMIT_CPU, per process): SIGXCPU at the limit, SIGKILL one second later."""
    memory_bytes: int = 512 << 20
    """Address space (RLIMIT_AS); allocations beyond it raise MemoryError."""
    processes: int = 16
    """Processes and threads of the slot's uid (RLIMIT_NPROC; only enforced with the uid switch;
    the run's PID-namespace init comes on top)."""
    file_bytes: int = 1 << 20
    """Largest file the process may write (RLIMIT_FSIZE); also caps captured stdout and stderr."""
    open_files: int = 64
    """RLIMIT_NOFILE."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_bytes", "processes", "file_bytes", "open_files"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")


@dataclass
class ExecResult:
    status: Status
    exit_code: int | None  # negative: killed by that signal (subprocess convention)
    stdout: str
    stderr: str
    wall_s: float
    reason: str = ""
    isolation: tuple[str, ...] = ()  # what the run had: netns, fs, pidns, rlimits, uid
    fallbacks: tuple[str, ...] = ()  # isolation that was unavailable, and why

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass
class CallOutcome:
    """One call of the candidate function; ``value`` is the parsed output when ``kind == "ok"``."""

    kind: str  # ok | error | timeout | memory | unparsed | missing
    value: Any = None
    detail: str = ""


@dataclass
class CallsResult:
    exec: ExecResult
    outcomes: list[CallOutcome]
    load_error: str = ""  # the source did not define the function (syntax, import, top level)


# --------------------------------------------------------------------------------------------
# Code that runs in the zygote and its children. The source of these two functions is sent with
# ``python -c``; they use only names they import themselves.
# --------------------------------------------------------------------------------------------


def _sandboxed_child(libc: Any, static: dict, req: dict, fds: list) -> None:  # pragma: no cover
    """Runs in the forked child: confine, limit, drop privileges, run the job, ``_exit``.

    With a PID namespace this process is the namespace's init (pid 1): it forks the program, waits
    for it and reports its status on descriptor 5. Its own exit (right after the program's, or at
    the deadline) makes the kernel kill every process left in the namespace, so nothing a run
    started outlives it, whatever it did with sessions and process groups.
    """
    import marshal
    import os
    import sys

    features: list = []
    try:
        os.setsid()  # without a PID namespace, the deadline kills this process group
        high = [os.dup2(fd, 100 + i) for i, fd in enumerate(fds)]  # no clash while moving down
        # 0 stdin, 1 stdout, 2 stderr, 3 results, 4 job, 5 status to the zygote, 6 zygote alive
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(7, 1 << 16)  # the zygote's socket, namespace handle and anything else
        job = b""
        while chunk := os.read(4, 1 << 20):
            job += chunk
        os.close(4)
        job = marshal.loads(job)
        if req["isolated"]:  # the zygote's namespaces are inherited; confine to the private root
            os.chdir(static["root"])
            os.chroot(".")
            features += ["netns", "fs"]
        os.chdir(req["workdir"])
        os.environ["TMPDIR"] = req["workdir"]  # tempfile: the only writable directory
        if libc is not None and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")  # setuid binaries stay inert
        import resource

        for res, soft, hard in req["rlimits"]:
            resource.setrlimit(res, (soft, hard))
        features.append("rlimits")
        uid = static["uid"]
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            features.append("uid")
            if libc is not None:
                libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the zygote (reset by setuid)
        import select

        # The zygote holds the only other write end of descriptor 6: readable (end of file) means
        # it died before PR_SET_PDEATHSIG was set, and nobody would enforce the deadline.
        if select.select([6], [], [], 0)[0]:
            os._exit(static["exit_setup"])
        if req["pidns"]:
            import _signal

            features.append("pidns")
            # As init, this process ignores every signal from inside the namespace that it has no
            # handler for: with SIGINT back to the default, the program cannot stop it.
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            program = os.fork()
            if program:
                while True:  # reap orphans too; stop at the program's own exit
                    pid, status = os.waitpid(-1, 0)
                    if pid == program:
                        break
                os.write(5, str(os.waitstatus_to_exitcode(status)).encode())
                os._exit(0)
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        os.close(5)
        os.close(6)
    except BaseException as e:  # the sandbox failed, not the candidate
        os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(static["exit_setup"])

    def line(text: str) -> None:
        os.write(3, (text.replace("\n", " ") + "\n").encode("utf-8", "backslashreplace"))

    def finish(code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)

    line("I " + ",".join(features))
    if job["mode"] == "program":
        sys.argv = ["main.py"]
        try:
            exec(compile(job["code"], "main.py", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                finish(e.code or 0)
            print(e.code, file=sys.stderr)
            finish(1)
        except MemoryError:
            os.write(2, b"MemoryError\n")
            finish(static["exit_memory"])
        except BaseException as e:
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # hide this frame
            finish(1)
        finish(0)

    # mode "calls": define the candidate once, then call it on every input under its own timer.
    import _signal

    class CallTimeout(BaseException):  # BaseException: `except Exception` in candidates misses it
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise CallTimeout

    _signal.signal(_signal.SIGALRM, on_alarm)

    def timed(seconds: float, fn: Any, *args: Any) -> Any:
        _signal.setitimer(_signal.ITIMER_REAL, seconds)
        try:
            return fn(*args)
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)

    namespace: dict = {"__name__": "__solution__"}  # not __main__: `if __name__ ...` demos skip
    try:
        timed(job["load_timeout"], exec, compile(job["code"], "solution.py", "exec"), namespace)
        fn = namespace.get(job["entry"])
        if not callable(fn):
            raise NameError(f"function {job['entry']!r} is not defined")
    except CallTimeout:
        line("L " + repr("defining the solution timed out"))
        finish(0)
    except MemoryError:
        line("L " + repr("MemoryError while defining the solution"))
        finish(0)
    except BaseException as e:
        line("L " + repr(f"{type(e).__name__}: {e}"[:500]))
        finish(0)
    for i, args in enumerate(job["inputs"]):
        try:
            text = timed(job["call_timeout"], lambda: repr(fn(*args)))
            if len(text) > job["max_value_repr"]:
                line(f"R {i} error " + repr("output too large"))
            else:
                line(f"R {i} ok {text}")
        except CallTimeout:
            line(f"R {i} timeout")
        except MemoryError:
            line(f"R {i} memory")
        except BaseException as e:
            line(f"R {i} error " + repr(f"{type(e).__name__}: {e}"[:300]))
    finish(0)


def _root_plan(needed: list, system_paths: tuple, devices: tuple) -> list:
    """What the private root holds: (``dir`` | ``link`` | ``dev``, host path, link target).

    ``needed`` are the paths the interpreter reads (its prefixes and ``sys.path``), wherever they
    are: each is bound at its real path, and every symlink on the way to it is recreated (pointing
    at the real path), so that the path the interpreter knows resolves inside the root as on the
    host. Directories come first, outermost only; links inside a bound directory are already there.
    """
    import os

    dirs, links, needed_real = [], {}, []
    for path in system_paths:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            dirs.append(path)
    for path in needed:
        if not os.path.exists(path):
            continue
        if not os.path.isdir(path):  # python311.zip and the like: its directory
            path = os.path.dirname(os.path.abspath(path))
        real = ""
        for part in os.path.abspath(path).strip("/").split("/"):
            step = f"{real}/{part}"
            if os.path.islink(step):
                real = os.path.realpath(step)
                links[step] = real
            else:
                real = step
        if real in ("", "/"):
            raise OSError(f"the interpreter reads {path}, which resolves to /: binding it would "
                          "expose the whole file system")
        dirs.append(real)
        needed_real.append(real)
    dirs = sorted(set(dirs))
    outer = [d for d in dirs if not any(d.startswith(o + "/") for o in dirs)]
    # Binds keep their modes: the unprivileged uid must be able to walk from the top of a bind
    # down to each directory it reads (directories above a bind are created world-readable).
    for real in needed_real:
        top = next(o for o in outer if real == o or real.startswith(o + "/"))
        step = top
        for part in [""] + real[len(top):].strip("/").split("/"):
            step = f"{step}/{part}" if part else step
            mode = os.stat(step).st_mode
            if mode & 0o005 != 0o005:
                raise OSError(f"{step} (the interpreter's files) is not readable by other users "
                              f"(mode {oct(mode & 0o777)}), so not by the sandbox's uid: chmod "
                              "o+rx it or use an interpreter installed elsewhere")
    plan = [("dir", d, "") for d in outer]
    plan += [("link", p, t) for p, t in sorted(links.items())
             if not any(p.startswith(o + "/") for o in outer)]
    plan += [("dev", d, "") for d in devices if os.path.exists(d)]
    return plan


def _isolate_zygote(libc: Any, static: dict) -> None:  # pragma: no cover - runs in the zygote
    """Enter new network and mount namespaces and build the private root the children chroot to.

    Done once per zygote: creating and tearing down namespaces and mounts per run would cost more
    than everything else a run does. Runs of one slot follow each other, so they may share them:
    each run gets its own fresh working directory, and nothing else in the root is writable.
    """
    import ctypes
    import os
    import sys

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    # This interpreter's own prefixes and module path, not the host's: the host may run another
    # interpreter (a venv) and see other paths.
    needed = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
    plan = _root_plan(needed, static["system_paths"], static["devices"])
    rdonly, nosuid, nodev, remount, bind, rec, private = 1, 2, 4, 32, 4096, 16384, 1 << 18
    check(libc.unshare(0x40000000 | 0x00020000), "unshare(CLONE_NEWNET|CLONE_NEWNS)")
    root = static["root"]
    check(libc.mount(b"none", b"/", None, rec | private, None), "make / private")
    opts = f"size={static['scratch_bytes']},nr_inodes=8192,mode=755".encode()
    check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", nosuid | nodev, opts), "tmpfs root")
    for kind, path, target in plan:
        dst = root + path
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if kind == "link":
            os.symlink(target, dst)
            continue
        if kind == "dir":
            os.makedirs(dst, exist_ok=True)
        else:  # a device: bind onto an empty file
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
        check(libc.mount(path.encode(), dst.encode(), None, bind | rec, None), f"bind {path}")
        if kind == "dir":
            flags = bind | remount | rdonly | nosuid | nodev
            check(libc.mount(None, dst.encode(), None, flags, None), f"read-only {path}")
    # Not writable itself (each run writes in its own subdirectory); it may already exist when
    # the interpreter lives under /tmp.
    os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)
    if os.path.ismount(root + "/tmp"):
        raise OSError(f"/tmp itself is bound read-only into the private root ({plan})")


def _zygote_main() -> None:  # pragma: no cover - runs in the zygote process
    """Start once per slot; then per request: fork a child, enforce its deadline, report."""
    import gc
    import marshal
    import os
    import select
    import shutil
    import socket
    import sys
    import time

    os.umask(0o022)  # directories of the private root must be traversable by the slot's uid
    sock = socket.socket(fileno=int(sys.argv[1]))
    static = marshal.loads(bytes.fromhex(sys.argv[2]))
    libc, fallbacks = None, []
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    except Exception as e:  # no libc to call: no namespaces either
        fallbacks.append(f"netns/fs/pidns: no libc via ctypes ({e!r})")
    isolated = False
    if static["isolate"] and libc is not None:
        try:
            _isolate_zygote(libc, static)
            isolated = True
        except OSError as e:
            fallbacks.append(f"netns/fs: {e.strerror or e}")
    # A new PID namespace per run: unshare(CLONE_NEWPID) puts the next child in a fresh one, and
    # setns back to our own right after the fork makes the following unshare possible again.
    clone_newpid, own_pidns = 0x20000000, None
    if libc is not None:
        try:
            own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            for call, what in ((lambda: libc.unshare(clone_newpid), "unshare(CLONE_NEWPID)"),
                               (lambda: libc.setns(own_pidns, clone_newpid), "setns(pid)")):
                if call() != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"{what}: {os.strerror(err)}")
        except OSError as e:
            fallbacks.append(f"pidns: {e.strerror or e}")
            if own_pidns is not None:
                os.close(own_pidns)
            own_pidns = None
    scratch = static["root"] + "/tmp" if isolated else static["scratch"]
    # Children check that the zygote is alive (see the child): alive_w stays open, unused, for as
    # long as the zygote lives.
    alive_r, alive_w = os.pipe()
    for name in ("_signal", "resource", "traceback", "select", *static["preload"]):
        __import__(name)  # once here, so that children do not pay for it
    # The first compile initialises the parser: done here once, not in every child. Children
    # would otherwise also run a garbage collection, which writes to every object's header and
    # so copies every page of the heap (copy-on-write); frozen objects are never collected.
    exec(compile("def warm(a):\n    return repr([a])\nwarm(1)\n", "warmup", "exec"), {})
    gc.collect()
    gc.freeze()
    sock.send(marshal.dumps({"isolated": isolated, "pidns": own_pidns is not None,
                             "fallbacks": fallbacks}))

    def wait_for(pid: int, seconds: float) -> str:
        """Block until the child exits (leaving it unreaped): ``exit``, ``deadline``, or
        ``hangup`` (the host closed the socket: it is gone, so the run is pointless)."""
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            deadline = time.monotonic() + seconds
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if time.monotonic() > deadline:
                    return "deadline"
                time.sleep(0.001)
            return "exit"
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.register(sock, 0)  # reports only hang-up and errors
            events = dict(poller.poll(seconds * 1000))
            if pidfd in events:
                return "exit"
            return "hangup" if events else "deadline"
        finally:
            os.close(pidfd)

    def sweep(uid: int) -> None:
        """Without a PID namespace: kill whatever the run left behind (a grandchild that left the
        process group with setsid). The slot's uid is this slot's alone, so all of it is ours."""
        pid = os.fork()
        if pid == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, 9)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    runs = 0
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
        except OSError:
            break
        if not msg:
            break  # the host closed the socket
        req = marshal.loads(msg)
        runs += 1
        name = f"run{runs}"
        workdir = f"{scratch}/{name}"  # fresh per run, owned by the slot's uid
        os.mkdir(workdir, 0o700)
        if static["uid"] is not None:
            os.chown(workdir, static["uid"], static["uid"])
        req["isolated"] = isolated
        req["pidns"] = own_pidns is not None
        req["workdir"] = f"/tmp/{name}" if isolated else workdir
        status_r, status_w = os.pipe()
        start = time.monotonic()
        if own_pidns is not None and libc.unshare(clone_newpid) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
        pid = os.fork()
        if pid == 0:
            try:
                _sandboxed_child(libc, static, req, [*fds, status_w, alive_r])
            finally:
                os._exit(static["exit_setup"])
        if own_pidns is not None and libc.setns(own_pidns, clone_newpid) != 0:
            raise OSError(ctypes.get_errno(), "setns(pid) failed")
        for fd in (*fds, status_w):
            os.close(fd)
        ended = wait_for(pid, req["wall_s"])
        # With a PID namespace, killing its init kills the whole run; without, the group.
        for kill in (os.killpg, os.kill):  # the group first, while the leader is still unreaped
            try:
                kill(pid, 9)
            except OSError:
                pass
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        wall = time.monotonic() - start
        reported = os.read(status_r, 64)
        os.close(status_r)
        if reported:  # init reports the program's status; otherwise init's own tells (setup, kill)
            try:
                code = int(reported)
            except ValueError:
                code = static["exit_setup"]
        if own_pidns is None and static["uid"] is not None:
            sweep(static["uid"])
        shutil.rmtree(workdir, ignore_errors=True)
        if ended == "hangup":
            break
        sock.send(f"{req['id']} {code} {int(ended == 'deadline')} {wall:.6f}".encode())


_ZYGOTE_SOURCE = "from __future__ import annotations\n" + "\n".join(
    textwrap.dedent(inspect.getsource(f))
    for f in (_sandboxed_child, _root_plan, _isolate_zygote, _zygote_main)
) + "\n_zygote_main()\n"


# --------------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------------


def root_plan(python: str = sys.executable) -> list[tuple[str, str, str]]:
    """What the private root of a zygote running ``python`` contains (see ``_root_plan``): asks
    that interpreter, started as the zygote is, for its prefixes and module path."""
    probe = ("import sys\nprint(repr([sys.prefix, sys.base_prefix, sys.exec_prefix, "
             "sys.base_exec_prefix, *sys.path]))")
    out = subprocess.run([python, "-I", "-S", "-B", "-c", probe], capture_output=True, text=True,
                         env=CHILD_ENV, cwd="/", check=True).stdout
    return [tuple(e) for e in _root_plan(ast.literal_eval(out), SYSTEM_PATHS, DEVICES)]


def _state_dir() -> str:
    """Where slot locks and scratch directories live: one place per machine for root, so that
    every process's sandboxes see each other's claims."""
    euid = os.geteuid()
    if euid == 0 and os.path.isdir("/run"):
        path = STATE_DIR
    else:
        path = os.path.join(tempfile.gettempdir(), f"posttrain-sandbox-{euid}")
    try:
        os.makedirs(path, 0o711, exist_ok=True)
    except OSError as e:
        raise SandboxUnavailable(f"cannot create the sandbox's state directory {path}: "
                                 f"{e.strerror}") from e
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != euid:
        raise SandboxUnavailable(f"{path} is not a directory owned by uid {euid}: remove it (the "
                                 "sandbox keeps its slot locks and scratch directories there)")
    os.chmod(path, 0o711)  # slot uids may enter their run directory, not list others
    return path


def _uids_in_use() -> set[int]:
    """Real uids of the live processes: a uid something else runs as is never a slot's."""
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    for text in f:
                        if text.startswith("Uid:"):
                            uids.add(int(text.split()[1]))
                            break
            except (OSError, ValueError, IndexError):
                continue
    return uids


def _try_lock(path: str) -> int | None:
    """An open descriptor holding an exclusive lock on ``path``, or None if another holds it. The
    kernel drops the lock when its holder dies, however it dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _claim_slots(state: str, n: int, first: int, check_uids: bool) -> list[tuple[int, int]]:
    """``n`` slot numbers no other live sandbox holds, lowest first, each with its lock's fd.

    As root a slot number is the uid its runs switch to: each Sandbox, in any process, gets uids
    of its own, so no run can signal, starve (``RLIMIT_NPROC``) or sweep another sandbox's runs.
    """
    busy = _uids_in_use() if check_uids else set()
    claims: list[tuple[int, int]] = []
    for number in range(first, first + SLOT_SPAN):
        if len(claims) == n:
            return claims
        if number in busy:
            continue
        fd = _try_lock(f"{state}/slot-{number}.lock")
        if fd is not None:
            claims.append((number, fd))
    for _, fd in claims:
        os.close(fd)
    raise SandboxUnavailable(f"no free sandbox slot among {first}..{first + SLOT_SPAN - 1} "
                             f"(locks in {state}): close other sandboxes or pass another uid_base")


def _remove_stale_scratch(state: str) -> None:
    """Remove scratch directories whose sandbox died without cleaning up (kill -9): a directory
    whose slot lock nobody holds has no owner."""
    for entry in os.listdir(state):
        if not entry.startswith("slot-") or entry.endswith(".lock"):
            continue
        fd = _try_lock(f"{state}/{entry}.lock")
        if fd is not None:
            try:
                shutil.rmtree(f"{state}/{entry}", ignore_errors=True)
            finally:
                os.close(fd)


def _anon_file(name: str) -> int:
    """A read/write file with no name on disk (memfd where available)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(f"sandbox-{name}", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as f:
        fd = os.dup(f.fileno())
    os.set_inheritable(fd, False)
    return fd


def _read_capped(fd: int, limit: int) -> tuple[bytes, bool]:
    """The content of an output file, and whether it reached the size limit."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, limit), 0), size >= limit


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def classify(
    exit_code: int | None, timed_out: bool, output_full: bool, limits: Limits
) -> tuple[Status, str]:
    """Map how the process ended to a Status and a reason (pure)."""
    if timed_out:
        return Status.TIMEOUT, f"wall time limit of {limits.wall_s:g}s exceeded"
    if exit_code == EXIT_SETUP or exit_code is None:
        return Status.SANDBOX_ERROR, "sandbox setup failed"
    if output_full:
        return Status.OUTPUT_LIMIT, f"output reached the {limits.file_bytes} byte limit"
    if exit_code == 0:
        return Status.OK, ""
    if exit_code == EXIT_MEMORY:
        return Status.MEMORY, f"memory limit of {limits.memory_bytes >> 20} MiB exceeded"
    if exit_code == -signal.SIGXCPU:
        return Status.TIMEOUT, f"CPU time limit of {limits.cpu_s:g}s exceeded"
    if exit_code == -signal.SIGKILL:  # not our deadline: RLIMIT_CPU's hard limit or the OOM killer
        return Status.KILLED, "killed by SIGKILL (CPU hard limit or out of memory)"
    if exit_code < 0:
        return Status.KILLED, f"killed by {_signal_name(-exit_code)}"
    return Status.RUNTIME_ERROR, f"exit code {exit_code}"


def parse_call_lines(text: str, n_calls: int) -> tuple[list[CallOutcome], str, tuple[str, ...]]:
    """Parse the harness's result lines into (outcomes, load error, isolation features).

    The text is untrusted (the candidate may write to the channel): malformed lines are ignored,
    the first line for a call wins, and calls without a line are ``missing``.
    """
    outcomes: list[CallOutcome | None] = [None] * n_calls
    load_error, features = "", ()
    for raw in text.splitlines():
        tag, _, rest = raw.partition(" ")
        if tag == "I" and not features:
            features = tuple(f for f in rest.split(",") if f)
        elif tag == "L" and not load_error:
            load_error = _literal_str(rest) or "could not define the solution"
        elif tag == "R":
            index, _, rest = rest.partition(" ")
            kind, _, payload = rest.partition(" ")
            if not index.isdigit() or int(index) >= n_calls or outcomes[int(index)] is not None:
                continue
            outcomes[int(index)] = _outcome(kind, payload)
    missing = CallOutcome("missing", detail="no result: the process ended first")
    return [o or missing for o in outcomes], load_error, features


def _literal_str(text: str) -> str:
    try:
        value = ast.literal_eval(text)
    except Exception:
        return ""
    return value if isinstance(value, str) else ""


def _outcome(kind: str, payload: str) -> CallOutcome:
    if kind == "ok":
        try:
            return CallOutcome("ok", ast.literal_eval(payload))
        except Exception:  # the repr of something that is not a plain value (or garbage)
            return CallOutcome("unparsed", detail=f"output is not a plain value: {payload[:80]}")
    if kind in ("timeout", "memory"):
        return CallOutcome(kind, detail=f"the call hit the {kind} limit")
    return CallOutcome("error", detail=_literal_str(payload) or "error")


class _Zygote:
    """The host's handle on one slot's zygote process."""

    def __init__(self, python: str, static: dict[str, Any]) -> None:
        host_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_fd = _anon_file("zygote-log")
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", _ZYGOTE_SOURCE, str(zygote_end.fileno()),
                 marshal.dumps(static).hex()],
                pass_fds=(zygote_end.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.log_fd, env=CHILD_ENV, cwd="/",
                start_new_session=True,
            )
        finally:
            zygote_end.close()
        self.sock = host_end
        self.requests = 0
        self.sock.settimeout(30.0)
        hello = self.sock.recv(1 << 16)
        if not hello:
            log = self.log()
            self.close()
            raise RuntimeError(f"sandbox zygote failed to start: {log}")
        info = marshal.loads(hello)
        self.isolated: bool = info["isolated"]
        self.pidns: bool = info["pidns"]
        self.fallbacks: tuple[str, ...] = tuple(info["fallbacks"])

    def log(self) -> str:
        text, _ = _read_capped(self.log_fd, 4000)
        return text.decode("utf-8", "replace").strip()[-500:] or "(no output)"

    def run(self, request: dict[str, Any], fds: list[int], timeout: float
            ) -> tuple[int, bool, float] | None:
        """Send one run; its (exit code, timed out, wall seconds), or None if the zygote died or
        did not answer within ``timeout``."""
        self.requests += 1
        deadline = time.monotonic() + timeout
        try:
            socket.send_fds(self.sock, [marshal.dumps({**request, "id": self.requests})], fds)
            while (remaining := deadline - time.monotonic()) > 0:
                self.sock.settimeout(remaining)
                reply = self.sock.recv(256)
                if not reply:
                    return None
                run_id, code, timed_out, wall = reply.decode().split()
                # An answer to an earlier request whose caller stopped waiting (interrupted).
                if int(run_id) == self.requests:
                    return int(code), timed_out == "1", float(wall)
        except OSError:  # includes socket.timeout
            return None
        return None

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.log_fd)


def _stop(zygotes: list[_Zygote | None], dirs: list[str], locks: list[int]) -> None:
    for slot, zygote in enumerate(zygotes):
        if zygote is not None:
            zygote.close()
            zygotes[slot] = None
    for path in dirs:  # before the locks go: a directory is always owned while it exists
        shutil.rmtree(path, ignore_errors=True)
    while locks:
        os.close(locks.pop())


class Sandbox:
    """A pool of sandbox slots, each served by its own zygote process (started on first use)."""

    def __init__(
        self,
        limits: Limits = Limits(),
        workers: int | None = None,
        uid_base: int = UID_BASE,
        isolate: bool = True,
        scratch_bytes: int = 64 << 20,
        python: str = sys.executable,
        allow_unisolated: bool = False,
    ) -> None:
        """``uid_base``: slots run as uids from ``uid_base`` up (when root), each claimed by this
        Sandbox alone through a lock file; pick a range no account uses. ``isolate=False`` skips
        the network and file-system namespaces even where they are available.
        ``allow_unisolated``: run even when isolation is incomplete (not root, namespaces refused,
        ``isolate=False``); every result lists what was missing in ``fallbacks``. Without it a
        slot that cannot be isolated raises ``SandboxUnavailable`` (fail closed).
        ``scratch_bytes``: size of each slot's private root file system, which holds the working
        directories (tmpfs; a full one makes writes fail with ENOSPC)."""
        self.limits = limits
        self.workers = workers or os.cpu_count() or 1
        self.python = python
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.uid_base = uid_base if is_root else None
        self.isolate = isolate and sys.platform.startswith("linux")
        self.allow_unisolated = allow_unisolated
        self.scratch_bytes = scratch_bytes
        state = _state_dir()
        claims = _claim_slots(state, self.workers, uid_base if is_root else 0, is_root)
        self._locks = [fd for _, fd in claims]
        self.uids: list[int] | None = [number for number, _ in claims] if is_root else None
        """The uid of each slot (None when not root: no uid switch)."""
        self.scratch_dirs = [f"{state}/slot-{number}" for number, _ in claims]
        """Each slot's scratch directory (the mount point of its private root)."""
        try:
            for path in self.scratch_dirs:  # what is there was left by a dead earlier holder
                shutil.rmtree(path, ignore_errors=True)
                os.mkdir(path, 0o711)
            _remove_stale_scratch(state)  # and those of dead holders of slots others hold now
        except BaseException:
            _stop([], self.scratch_dirs, self._locks)
            raise
        self._zygotes: list[_Zygote | None] = [None] * self.workers
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.workers):
            self._slots.put(slot)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._warned = False
        # Without close(): stop the zygotes, remove the scratch directories and release the slots
        # at garbage collection or interpreter exit (holds no reference to self). After kill -9,
        # the next Sandbox to start removes the directories (their locks died with the process).
        self._finalizer = weakref.finalize(self, _stop, self._zygotes, self.scratch_dirs,
                                           self._locks)

    # -- public API -------------------------------------------------------------------------

    def check(self) -> tuple[str, ...]:
        """Start a slot now and return what isolation its runs lack (empty: complete). Raises
        ``SandboxUnavailable`` when something lacks and ``allow_unisolated`` is False."""
        slot = self._slots.get()
        try:
            return self._fallbacks(self._zygote(slot))
        finally:
            self._slots.put(slot)

    def run_program(self, code: str, stdin: str | bytes = b"", limits: Limits | None = None
                    ) -> ExecResult:
        """Run ``code`` as ``__main__`` with ``stdin``; stdout/stderr captured up to the limit."""
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result, _ = self._execute({"mode": "program", "code": code}, limits or self.limits, data)
        return result

    def run_calls(
        self,
        code: str,
        entry: str,
        inputs: Sequence[Sequence[Any]],
        call_timeout_s: float = 1.0,
        limits: Limits | None = None,
    ) -> CallsResult:
        """Define ``code`` once, then call ``entry(*args)`` for each ``args`` in ``inputs``.

        Inputs must be plain values (None, bool, int, float, str, bytes, list, tuple, dict, set).
        Each call gets ``call_timeout_s``; the process as a whole gets ``limits``.
        """
        limits = limits or self.limits
        job = {
            "mode": "calls", "code": code, "entry": entry, "inputs": [tuple(a) for a in inputs],
            "call_timeout": float(call_timeout_s),
            "load_timeout": float(min(limits.wall_s, max(call_timeout_s, 2.0))),
            "max_value_repr": MAX_VALUE_REPR,
        }
        result, channel = self._execute(job, limits, b"")
        outcomes, load_error, _ = parse_call_lines(channel, len(inputs))
        if result.status not in (Status.OK, Status.RUNTIME_ERROR):  # say why calls are missing
            outcomes = [o if o.kind != "missing" else CallOutcome("missing", detail=result.reason)
                        for o in outcomes]
        return CallsResult(result, outcomes, load_error)

    def submit_program(self, code: str, stdin: str | bytes = b"", limits: Limits | None = None
                       ) -> Future[ExecResult]:
        return self._executor().submit(self.run_program, code, stdin, limits)

    def submit_calls(self, code: str, entry: str, inputs: Sequence[Sequence[Any]],
                     call_timeout_s: float = 1.0, limits: Limits | None = None
                     ) -> Future[CallsResult]:
        return self._executor().submit(self.run_calls, code, entry, inputs, call_timeout_s, limits)

    def close(self) -> None:
        """Stop the zygotes (each run's processes already died with it), remove the scratch
        directories, release the slots. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=True)
        for _ in range(self.workers):  # take every slot: waits for runs in flight
            self._slots.get()
        self._finalizer()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
            return self._pool

    def _rlimits(self, limits: Limits, zygote: _Zygote) -> list[tuple[int, int, int]]:
        cpu = max(1, int(limits.cpu_s + 0.999))
        out = [
            (resource.RLIMIT_CPU, cpu, cpu + 1),
            (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
            (resource.RLIMIT_CORE, 0, 0),
        ]
        if self.uids is not None:  # counted per uid: only meaningful with the uid switch
            nproc = limits.processes + zygote.pidns  # the namespace's init is one of them
            out.append((resource.RLIMIT_NPROC, nproc, nproc))
        return out

    def _zygote(self, slot: int) -> _Zygote:
        zygote = self._zygotes[slot]
        if zygote is None:
            static = {
                "uid": None if self.uids is None else self.uids[slot],
                "isolate": self.isolate, "system_paths": SYSTEM_PATHS, "devices": DEVICES,
                "root": self.scratch_dirs[slot], "scratch": self.scratch_dirs[slot],
                "scratch_bytes": self.scratch_bytes, "preload": PRELOAD,
                "exit_setup": EXIT_SETUP, "exit_memory": EXIT_MEMORY,
            }
            zygote = _Zygote(self.python, static)
            missing = self._fallbacks(zygote)
            if missing and not self.allow_unisolated:
                zygote.close()
                raise SandboxUnavailable(
                    f"sandbox isolation unavailable ({'; '.join(missing)}): run as root on Linux "
                    "(namespaces, mounts and the uid switch need it), or pass "
                    "allow_unisolated=True (RL recipes: envs[].args.allow_unisolated: true) to run "
                    "model-written code without it")
            if missing and not self._warned:
                self._warned = True
                log.warning("sandbox runs WITHOUT full isolation (allow_unisolated=True): %s",
                            "; ".join(missing))
            self._zygotes[slot] = zygote
        return zygote

    def _execute(self, job: dict[str, Any], limits: Limits, stdin: bytes) -> tuple[ExecResult, str]:
        if self._closed:
            raise RuntimeError("sandbox is closed")
        slot = self._slots.get()
        try:
            return self._execute_in_slot(slot, job, limits, stdin)
        finally:
            self._slots.put(slot)

    def _execute_in_slot(
        self, slot: int, job: dict[str, Any], limits: Limits, stdin: bytes
    ) -> tuple[ExecResult, str]:
        lost = ""
        for _ in range(2):  # a zygote that died (killed from outside, OOM) is restarted once
            zygote = self._zygote(slot)
            fds = [_anon_file(n) for n in ("job", "stdin", "out", "err", "res")]
            try:
                job_fd, stdin_fd, out_fd, err_fd, res_fd = fds
                for fd, data in ((job_fd, marshal.dumps(job)), (stdin_fd, stdin)):
                    os.write(fd, data)
                    os.lseek(fd, 0, os.SEEK_SET)
                request = {"wall_s": limits.wall_s, "rlimits": self._rlimits(limits, zygote)}
                reply = zygote.run(request, [stdin_fd, out_fd, err_fd, res_fd, job_fd],
                                   limits.wall_s + ZYGOTE_GRACE_S)
                if reply is None:
                    self._zygotes[slot] = None
                    lost = zygote.log()
                    zygote.close()
                    continue
                out, out_full = _read_capped(out_fd, limits.file_bytes)
                err, err_full = _read_capped(err_fd, limits.file_bytes)
                channel, channel_full = _read_capped(res_fd, limits.file_bytes)
            finally:
                for fd in fds:
                    os.close(fd)
            exit_code, timed_out, wall = reply
            status, reason = classify(exit_code, timed_out, out_full or err_full or channel_full,
                                      limits)
            channel_text = channel.decode("utf-8", "replace")
            _, _, features = parse_call_lines(channel_text, 0)
            stderr = err.decode("utf-8", "replace")
            last_err_line = stderr.strip().splitlines()[-1][:300] if stderr.strip() else ""
            if status in (Status.SANDBOX_ERROR, Status.RUNTIME_ERROR) and last_err_line:
                reason = last_err_line
            result = ExecResult(status, exit_code, out.decode("utf-8", "replace"), stderr, wall,
                                reason, features, self._fallbacks(zygote))
            return result, channel_text
        reason = f"sandbox zygote died twice: {lost}"
        return ExecResult(Status.SANDBOX_ERROR, None, "", "", 0.0, reason), ""

    def _fallbacks(self, zygote: _Zygote) -> tuple[str, ...]:
        out = list(zygote.fallbacks)
        if not self.isolate:
            out.append("netns/fs: disabled (isolate=False or not Linux)")
        if self.uids is None:
            out.append("uid: not root, cannot switch to an unprivileged uid")
        return tuple(out)


_defaults: dict[tuple[int, bool], Sandbox] = {}
_default_lock = threading.Lock()


def default_sandbox(allow_unisolated: bool = False) -> Sandbox:
    """The process-wide shared sandbox (one slot per core), closed at interpreter exit. A forked
    child gets its own: a Sandbox's sockets must not be shared across fork."""
    key = (os.getpid(), allow_unisolated)
    with _default_lock:
        if key not in _defaults:
            _defaults[key] = Sandbox(allow_unisolated=allow_unisolated)
            atexit.register(_defaults[key].close)
        return _defaults[key]

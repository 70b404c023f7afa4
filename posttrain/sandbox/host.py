"""The host side of the sandbox: ``Sandbox``, a pool of slots, each served by its own zygote
process (``zygote.py``) and running as a uid of its own (claimed through lock files in
``STATE_DIR``); ``default_sandbox`` is the process-wide shared one. The design is in the package
docstring (``posttrain/sandbox/__init__.py``) and docs/sandbox.md.
"""

from __future__ import annotations

import atexit
import fcntl
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
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from posttrain.errors import UserError
from posttrain.sandbox.results import (EXIT_MEMORY, EXIT_SETUP, CallOutcome, CallsResult, ExecResult, Limits, Status,
                                       classify, parse_call_lines)
from posttrain.sandbox.zygote import ZYGOTE_SOURCE, CHILD_ENV, DEVICES, PRELOAD, SYSTEM_PATHS

log = logging.getLogger(__name__)

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


class _Zygote:
    """The host's handle on one slot's zygote process."""

    def __init__(self, python: str, static: dict[str, Any]) -> None:
        host_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_fd = _anon_file("zygote-log")
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", ZYGOTE_SOURCE, str(zygote_end.fileno()),
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

"""What a sandboxed run is given and what it returns: limits, statuses, results, and the pure
parsing of how a run ended (``classify``) and of the harness's result lines (``parse_call_lines``).
"""

from __future__ import annotations

import ast
import signal
from dataclasses import dataclass
from enum import Enum
from typing import Any

# Exit codes the child uses for outcomes the host must tell apart from a program's own codes.
EXIT_MEMORY = 109
EXIT_SETUP = 110


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

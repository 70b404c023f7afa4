"""The sandbox against hostile programs, plus its pure helpers.

Every hostile program must end contained (a failed call or a non-ok status with a reason) and
leave the host untouched: the test process alive, no files outside the sandbox, no stray
processes of the slot's uid, the loopback listener never reached.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from posttrain.envs.sandbox import (
    EXIT_MEMORY,
    EXIT_SETUP,
    CallOutcome,
    Limits,
    Sandbox,
    Status,
    classify,
    parse_call_lines,
)

REPO = Path(__file__).resolve().parents[2]
FAST = Limits(wall_s=2.0, cpu_s=2.0)


@pytest.fixture(scope="module")
def sb():
    with Sandbox(limits=FAST, workers=2) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def isolated(sb):
    """Skip tests of namespace / uid isolation where the platform does not give it (not root)."""
    result = sb.run_program("pass")
    missing = {"netns", "fs", "uid"} - set(result.isolation)
    if missing:
        pytest.skip(f"isolation unavailable here ({', '.join(sorted(missing))}): "
                    f"{'; '.join(result.fallbacks)}")
    return result


def uid_processes(uid: int, settle_s: float = 2.0) -> list[int]:
    """Live (non-zombie) host pids whose real uid is ``uid``, after up to ``settle_s`` for killed
    ones to finish dying."""
    deadline = time.monotonic() + settle_s
    while True:
        pids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = dict(line.split(":", 1) for line in
                              Path(f"/proc/{entry}/status").read_text().splitlines())
            except (OSError, ValueError):
                continue
            if int(status["Uid"].split()[0]) == uid and not status["State"].strip().startswith("Z"):
                pids.append(int(entry))
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def call_one(sb: Sandbox, code: str, *args, limits: Limits = FAST) -> CallOutcome:
    result = sb.run_calls(code, "f", [args], call_timeout_s=1.0, limits=limits)
    assert not result.load_error, result.load_error
    return result.outcomes[0]


# -- pure helpers ---------------------------------------------------------------------------


def test_classify_maps_endings():
    lim = Limits(wall_s=3, cpu_s=2, memory_bytes=64 << 20, file_bytes=1000)
    assert classify(0, False, False, lim) == (Status.OK, "")
    assert classify(-9, True, False, lim)[0] is Status.TIMEOUT
    assert classify(0, False, True, lim)[0] is Status.OUTPUT_LIMIT
    assert classify(1, False, True, lim)[0] is Status.OUTPUT_LIMIT  # EFBIG surfaced as exit 1
    assert classify(1, False, False, lim)[0] is Status.RUNTIME_ERROR
    assert classify(EXIT_MEMORY, False, False, lim)[0] is Status.MEMORY
    assert classify(EXIT_SETUP, False, False, lim)[0] is Status.SANDBOX_ERROR
    assert classify(-signal.SIGXCPU, False, False, lim)[0] is Status.TIMEOUT
    assert classify(-signal.SIGSEGV, False, False, lim) == (Status.KILLED, "killed by SIGSEGV")


def test_parse_call_lines_is_defensive():
    text = "\n".join([
        "I netns,fs,rlimits,uid",
        "R 0 ok [1, 2]",
        "R 0 ok 'forged second line for call 0 is ignored'",
        "R 1 error 'ZeroDivisionError: division by zero'",
        "R 2 timeout",
        "R 3 ok <object at 0x1>",
        "R 9 ok 1",  # out of range
        "R x ok 1",  # malformed index
        "garbage line",
    ])
    outcomes, load_error, features = parse_call_lines(text, 5)
    assert features == ("netns", "fs", "rlimits", "uid")
    assert load_error == ""
    assert [o.kind for o in outcomes] == ["ok", "error", "timeout", "unparsed", "missing"]
    assert outcomes[0].value == [1, 2]
    assert "ZeroDivisionError" in outcomes[1].detail
    _, load_error, _ = parse_call_lines("L 'SyntaxError: invalid syntax'", 1)
    assert load_error == "SyntaxError: invalid syntax"


# -- normal operation -----------------------------------------------------------------------


def test_calls_report_values_and_errors(sb):
    code = "def f(a, b):\n    print('debug output is fine')\n    return a / b\n"
    result = sb.run_calls(code, "f", [(1, 2), (1, 0), ([1], 2)])
    assert result.exec.status is Status.OK
    assert [o.kind for o in result.outcomes] == ["ok", "error", "error"]
    assert result.outcomes[0].value == 0.5
    assert "ZeroDivisionError" in result.outcomes[1].detail


def test_load_errors_are_reported(sb):
    assert "SyntaxError" in sb.run_calls("def f(:\n", "f", [(1,)]).load_error
    assert "not defined" in sb.run_calls("def g(x):\n    return x\n", "f", [(1,)]).load_error
    raising = sb.run_calls("import no_such_module\n", "f", [(1,)])
    assert "ModuleNotFoundError" in raising.load_error
    assert raising.outcomes[0].kind == "missing"


def test_program_stdin_stdout_and_exit_codes(sb):
    ok = sb.run_program("import sys\nprint(sum(map(int, sys.stdin.read().split())))", "1 2 3")
    assert ok.status is Status.OK and ok.stdout == "6\n"
    failed = sb.run_program("raise ValueError('boom')")
    assert failed.status is Status.RUNTIME_ERROR and failed.exit_code == 1
    assert "ValueError: boom" in failed.reason
    assert sb.run_program("import sys\nsys.exit(3)").exit_code == 3
    assert sb.run_program("print(input())").status is Status.RUNTIME_ERROR  # stdin empty: EOF


def test_many_threads_share_the_slots(sb):
    code = "def f(x):\n    return x * x\n"
    results: list = [None] * 12

    def work(i: int) -> None:
        results[i] = sb.run_calls(code, "f", [(i,), (i + 1,)])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [[o.value for o in r.outcomes] for r in results] == [
        [i * i, (i + 1) ** 2] for i in range(12)]


# -- hostile programs -----------------------------------------------------------------------


def test_infinite_loop_times_out_per_call_and_per_process(sb):
    code = "def f(x):\n    while x:\n        pass\n    return 0\n"
    result = sb.run_calls(code, "f", [(1,), (0,)], call_timeout_s=0.3)
    assert [o.kind for o in result.outcomes] == ["timeout", "ok"]  # later calls still run
    stubborn = ("def f(x):\n"
                "    while True:\n"
                "        try:\n"
                "            while True:\n"
                "                pass\n"
                "        except BaseException:\n"  # swallows the per-call timer
                "            pass\n")
    limits = Limits(wall_s=1.0, cpu_s=5.0)
    result = sb.run_calls(stubborn, "f", [(1,)], call_timeout_s=0.2, limits=limits)
    assert result.exec.status is Status.TIMEOUT
    assert result.exec.wall_s < 2.0
    assert result.outcomes[0].kind in ("timeout", "missing")
    cpu_bound = sb.run_program("while True:\n    pass\n", limits=Limits(wall_s=5.0, cpu_s=1.0))
    assert cpu_bound.status is Status.TIMEOUT and "CPU" in cpu_bound.reason


def test_fork_bomb_is_capped_and_reaped(sb, isolated):
    bomb = ("import os\n"
            "def f(x):\n"
            "    while True:\n"
            "        try:\n"
            "            os.fork()\n"
            "        except OSError:\n"
            "            pass\n")
    result = sb.run_calls(bomb, "f", [(1,)], call_timeout_s=0.5,
                          limits=Limits(wall_s=1.0, cpu_s=2.0, processes=8))
    assert result.outcomes[0].kind != "ok"
    assert result.exec.status in (Status.TIMEOUT, Status.OK, Status.KILLED)
    assert not any(uid_processes(sb.uid_base + slot) for slot in range(sb.workers))
    assert os.getpid() and sb.run_program("print('still fine')").stdout == "still fine\n"


def test_memory_bomb(sb):
    outcome = call_one(sb, "def f(n):\n    return len(bytearray(n))\n", 10**11)
    assert outcome.kind == "memory"
    hoard = "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))\n"
    result = sb.run_program(hoard, limits=Limits(wall_s=5.0, memory_bytes=256 << 20))
    assert result.status is Status.MEMORY and "memory" in result.reason


def test_output_flood_is_truncated(sb):
    limits = Limits(wall_s=3.0, file_bytes=64 << 10)
    result = sb.run_program("while True:\n    print('x' * 1000)\n", limits=limits)
    assert result.status is Status.OUTPUT_LIMIT
    assert len(result.stdout) <= 64 << 10
    calls = sb.run_calls("def f(x):\n    while True:\n        print('y' * 1000)\n", "f", [(1,)],
                         limits=limits)
    assert calls.exec.status is Status.OUTPUT_LIMIT and calls.outcomes[0].kind != "ok"


def test_network_is_unreachable(sb, isolated):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=1.0):  # reachable from the host
        listener.accept()[0].close()
    code = ("import socket\n"
            "def f(host, port):\n"
            "    with socket.create_connection((host, port), timeout=1.0):\n"
            "        return 'connected'\n")
    try:
        result = sb.run_calls(code, "f", [("127.0.0.1", port), ("192.0.2.1", 80)])
        for outcome in result.outcomes:  # 192.0.2.1 is TEST-NET-1: never routed anywhere
            assert outcome.kind == "error", outcome
            assert "unreachable" in outcome.detail.lower(), outcome.detail
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing from the sandbox reached the host's loopback
    finally:
        listener.close()


def test_writes_outside_the_working_directory_do_not_land(sb, isolated):
    marker = f"posttrain-sandbox-escape-{uuid.uuid4().hex}"
    targets = [f"/tmp/{marker}", str(REPO / marker), f"/var/tmp/{marker}", f"/dev/shm/{marker}"]
    code = ("import os\n"
            "def f(path):\n"
            "    with open(path, 'w') as fh:\n"
            "        fh.write('escaped')\n"
            "    return os.path.abspath(path)\n")
    result = sb.run_calls(code, "f", [(t,) for t in targets] + [("local.txt",)])
    for target, outcome in zip(targets, result.outcomes):
        assert outcome.kind == "error", (target, outcome)
        assert not os.path.exists(target)
    cwd_file = result.outcomes[-1]
    assert cwd_file.kind == "ok"  # the working directory itself is writable...
    again = sb.run_calls("import os\ndef f(p):\n    return os.path.exists(p)\n", "f",
                         [(cwd_file.value,), (os.path.dirname(cwd_file.value),)])
    assert [o.value for o in again.outcomes] == [False, False]  # ...and gone after the run


def test_reference_solutions_are_not_readable(sb, isolated):
    code = "def f(path):\n    return open(path).read()[:10]\n"
    outcome = call_one(sb, code, str(REPO / "posttrain" / "envs" / "sandbox.py"))
    assert outcome.kind == "error" and "FileNotFoundError" in outcome.detail


def test_cannot_signal_the_parent_or_the_host(sb, isolated):
    code = ("import os, signal\n"
            "def f(host_pid):\n"
            "    for pid in (os.getppid(), host_pid):\n"
            "        try:\n"
            "            os.kill(pid, signal.SIGKILL)\n"
            "        except OSError as e:\n"
            "            continue\n"
            "        return 'killed ' + str(pid)\n"
            "    raise PermissionError('could not signal anyone')\n")
    outcome = call_one(sb, code, os.getpid())
    assert outcome.kind == "error" and "PermissionError" in outcome.detail
    program = sb.run_program("import os\nos.kill(os.getppid(), 9)\n")
    assert program.status is Status.RUNTIME_ERROR and "PermissionError" in program.reason
    assert sb.run_program("print(1)").stdout == "1\n"  # zygote and host both alive


def test_parent_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    with Sandbox(limits=FAST, workers=1) as fresh:  # started after the secret was set
        outcome = call_one(fresh, "import os\ndef f():\n    return dict(os.environ)\n")
    assert outcome.kind == "ok"
    assert "POSTTRAIN_TEST_SECRET" not in outcome.value
    assert "hunter2" not in repr(outcome.value)
    assert set(outcome.value) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


def test_escaped_grandchild_is_reaped_by_the_next_run(isolated):
    with Sandbox(limits=FAST, workers=1) as one_slot:
        daemon = ("import os, time\n"
                  "ready_r, ready_w = os.pipe()\n"
                  "if os.fork() == 0:\n"
                  "    os.setsid()\n"  # leaves the process group the zygote kills
                  "    os.write(ready_w, b'x')\n"
                  "    time.sleep(60)\n"
                  "    os._exit(0)\n"
                  "os.read(ready_r, 1)\n")
        assert one_slot.run_program(daemon).status is Status.OK
        assert uid_processes(one_slot.uid_base, settle_s=0)  # the escapee outlives the run...
        one_slot.run_program("pass")
        assert not uid_processes(one_slot.uid_base)  # ...and swept by the next one


def test_a_dead_zygote_is_restarted(sb):
    slot_zygotes = [z for z in sb._zygotes if z is not None]
    for zygote in slot_zygotes:
        os.killpg(zygote.proc.pid, signal.SIGKILL)
    results = [sb.run_program("print(2)") for _ in range(sb.workers)]
    assert all(r.status is Status.OK and r.stdout == "2\n" for r in results)

"""The sandbox against hostile programs, plus its pure helpers.

Every hostile program must end contained (a failed call or a non-ok status with a reason) and
leave the host untouched: the test process alive, no files outside the sandbox, no stray
processes of the slot's uid, the loopback listener never reached.

Isolation needs root. As root (CI) every isolation test runs and a missing protection fails it;
only a non-root run skips them, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from posttrain.sandbox import (
    EXIT_MEMORY,
    EXIT_SETUP,
    CallOutcome,
    Limits,
    Sandbox,
    SandboxUnavailable,
    Status,
    classify,
    parse_call_lines,
)

REPO = Path(__file__).resolve().parents[2]
FAST = Limits(wall_s=2.0, cpu_s=2.0)
ROOT = os.geteuid() == 0
FULL_ISOLATION = {"netns", "fs", "pidns", "rlimits", "uid"}
needs_root = pytest.mark.skipif(
    not ROOT, reason="isolation (namespaces, mounts, uid switch) needs root; CI runs as root")
STDLIB_PROGRAM = ("import json, random, fractions, hashlib, decimal, collections, itertools, re, "
                  "math\n"
                  "print(json.dumps([str(fractions.Fraction(1, 3)), hashlib.sha256(b'x').hexdigest()"
                  "[:8], str(decimal.Decimal('0.1') + decimal.Decimal('0.2')), "
                  "collections.Counter('aab')['a'], list(itertools.accumulate([1, 2])), "
                  "re.sub('a', 'b', 'aa'), math.isqrt(17), random.Random(0).randint(1, 9)]))\n")
STDLIB_OUTPUT = json.dumps(["1/3", "2d711642", "0.3", 2, [1, 3], "bb", 4,
                            __import__("random").Random(0).randint(1, 9)]) + "\n"


@pytest.fixture(scope="module")
def sb():
    with Sandbox(limits=FAST, workers=2, allow_unisolated=not ROOT) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def isolated(sb):
    """Tests of namespace / uid isolation: skipped only when not root; as root, a missing
    protection fails here instead of hiding behind a skip."""
    if not ROOT:
        pytest.skip("isolation (namespaces, mounts, uid switch) needs root; CI runs as root")
    result = sb.run_program("pass")
    assert set(result.isolation) == FULL_ISOLATION and not result.fallbacks, result
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
    assert not any(uid_processes(uid) for uid in sb.uids)
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
    outcome = call_one(sb, code, str(REPO / "posttrain" / "sandbox" / "host.py"))
    assert outcome.kind == "error" and "FileNotFoundError" in outcome.detail


def test_cannot_signal_the_parent_or_the_host(sb, isolated):
    # In its own PID namespace the program sees only its run: its parent is the namespace's init
    # (which ignores signals from inside), and the host's pid names nothing there.
    code = ("import os, signal\n"
            "def f(host_pid):\n"
            "    os.kill(os.getppid(), signal.SIGKILL)\n"
            "    try:\n"
            "        os.kill(host_pid, signal.SIGKILL)\n"
            "    except OSError as e:\n"
            "        return [os.getpid(), os.getppid(), type(e).__name__]\n"
            "    return 'signalled the host'\n")
    outcome = call_one(sb, code, os.getpid())
    assert outcome.kind == "ok" and outcome.value == [2, 1, "ProcessLookupError"], outcome
    program = sb.run_program("import os\nos.kill(os.getppid(), 9)\nprint('still running')\n")
    assert program.status is Status.OK and program.stdout == "still running\n"
    assert sb.run_program("print(1)").stdout == "1\n"  # zygote and host both alive


def test_parent_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    with Sandbox(limits=FAST, workers=1) as fresh:  # started after the secret was set
        outcome = call_one(fresh, "import os\ndef f():\n    return dict(os.environ)\n")
    assert outcome.kind == "ok"
    assert "POSTTRAIN_TEST_SECRET" not in outcome.value
    assert "hunter2" not in repr(outcome.value)
    assert set(outcome.value) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}


# A sleeper that leaves the run's session and process group (fork, setsid, fork) and then, if it
# is still alive, keeps writing a marker into the next run's working directory (same slot, same
# uid, predictable name) or into ``argv[1]``.
ESCAPEE = ("import os, sys, time\n"
           "ready_r, ready_w = os.pipe()\n"
           "if os.fork() == 0:\n"
           "    os.setsid()\n"
           "    if os.fork() == 0:\n"
           "        os.write(ready_w, b'x')\n"
           "        head = os.getcwd().rstrip('0123456789')\n"
           "        after = head + str(int(os.getcwd()[len(head):]) + 1)\n"
           "        for _ in range(300):\n"
           "            time.sleep(0.01)\n"
           "            for target in (after + '/marker', TARGET):\n"
           "                try:\n"
           "                    open(target, 'w').write('escaped')\n"
           "                except OSError:\n"
           "                    pass\n"
           "    os._exit(0)\n"
           "os.read(ready_r, 1)\n")


def test_setsid_grandchild_dies_with_the_run(isolated):
    with Sandbox(limits=FAST, workers=1) as one_slot:
        result = one_slot.run_program("TARGET = '/nowhere'\n" + ESCAPEE)
        assert result.status is Status.OK, result
        assert not uid_processes(one_slot.uids[0], settle_s=0)  # gone before the run returned
        later = one_slot.run_program("import os, time\ntime.sleep(0.5)\nprint(os.listdir('.'))")
        assert later.stdout == "[]\n"  # nothing wrote into the next run's directory


@needs_root
def test_setsid_grandchild_dies_with_the_run_without_fs_isolation():
    """Without network / file-system isolation (opted out) a run's processes still die with it:
    the escapee would otherwise write to a host directory."""
    shared = tempfile.mkdtemp(prefix="posttrain-sandbox-test-")
    os.chmod(shared, 0o777)  # writable by the slot's uid
    target = os.path.join(shared, "marker")
    try:
        with Sandbox(limits=FAST, workers=1, isolate=False, allow_unisolated=True) as plain:
            result = plain.run_program(f"TARGET = {target!r}\n" + ESCAPEE)
            assert result.status is Status.OK, result
            assert "pidns" in result.isolation and "fs" not in result.isolation
            assert not uid_processes(plain.uids[0], settle_s=0)
            time.sleep(0.5)
            assert not os.path.exists(target)
    finally:
        shutil.rmtree(shared)


def test_a_dead_zygote_is_restarted(sb):
    slot_zygotes = [z for z in sb._zygotes if z is not None]
    for zygote in slot_zygotes:
        os.killpg(zygote.proc.pid, signal.SIGKILL)
    results = [sb.run_program("print(2)") for _ in range(sb.workers)]
    assert all(r.status is Status.OK and r.stdout == "2\n" for r in results)


# -- independent sandboxes, kill -9, where the interpreter lives, fail closed ----------------


def host_process(script: str, python: str = sys.executable, **kwargs) -> subprocess.Popen:
    """A real, independent host process that uses the sandbox (its own Sandbox objects)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([python, "-c", script], env=env, cwd=str(REPO), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kwargs)


RUN_MANY = """
import sys
from posttrain.sandbox import Limits, Sandbox
with Sandbox(limits=Limits(wall_s=10.0), workers=2) as sb:
    sb.run_program("pass")
    print("ready", flush=True)
    sys.stdin.readline()  # both processes start their runs together
    program = "import time\\ntime.sleep(0.02)\\nprint('done')\\n"
    results = [f.result() for f in [sb.submit_program(program) for _ in range(60)]]
    bad = [r for r in results if not (r.ok and r.stdout == "done\\n")]
    print(len(bad), repr(bad[0].reason if bad else ""), getattr(sb, "uids", None), flush=True)
"""


def test_two_processes_using_the_sandbox_do_not_kill_each_others_runs(isolated):
    hosts = [host_process(RUN_MANY) for _ in range(2)]
    try:
        assert [h.stdout.readline() for h in hosts] == ["ready\n"] * 2
        for h in hosts:
            h.stdin.write("go\n")
            h.stdin.flush()
        reports = [h.communicate(timeout=120)[0].split(" ", 2) for h in hosts]
    finally:
        for h in hosts:
            h.kill()
    assert [r[0] for r in reports] == ["0", "0"], reports  # every run of both succeeded
    uids = [json.loads(r[2].replace("None", "null")) for r in reports]
    assert not set(uids[0]) & set(uids[1]), uids  # each sandbox runs as uids of its own


HOLD_AND_DIE = """
import json, sys
from posttrain.sandbox import Limits, Sandbox
sb = Sandbox(limits=Limits(wall_s=60.0, cpu_s=60.0), workers=1)
dirs = getattr(sb, "scratch_dirs", None) or [sb._scratch]
print(json.dumps({"uids": getattr(sb, "uids", None) or [sb.uid_base], "dirs": dirs}), flush=True)
sb.run_program(json.loads(sys.stdin.readline()) + "\\ntime.sleep(60)\\n")  # killed in the run
"""


def test_kill_9_of_the_host_kills_its_runs_and_leaks_no_scratch(isolated):
    host = host_process(HOLD_AND_DIE)
    try:
        held = json.loads(host.stdout.readline())
        host.stdin.write(json.dumps("TARGET = '/nowhere'\n" + ESCAPEE) + "\n")
        host.stdin.flush()
        uid = held["uids"][0]
        deadline = time.monotonic() + 10
        while len(uid_processes(uid, settle_s=0)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # init, the program and the escapee
        assert uid_processes(uid, settle_s=0)
        host.kill()
        host.wait()
        assert not uid_processes(uid, settle_s=3.0)  # the run (escapee included) died with it
        with Sandbox(workers=1, allow_unisolated=not ROOT) as after:
            left = [d for d in held["dirs"] if os.path.exists(d) and d not in after.scratch_dirs]
            assert not left  # the dead host's scratch is gone once the next sandbox started
            assert not any(os.listdir(d) for d in after.scratch_dirs)
    finally:
        host.kill()


def test_the_whole_standard_library_is_importable(sb, isolated):
    result = sb.run_program(STDLIB_PROGRAM)
    assert result.status is Status.OK and result.stdout == STDLIB_OUTPUT, result
    skip = {"antigravity", "this", "idlelib", "turtledemo", "tkinter", "turtle"}  # GUI, prints
    names = sorted(n for n in sys.stdlib_module_names if n[0] != "_" and n not in skip)
    absent_here = [n for n in names if importlib.util.find_spec(n) is None]  # msvcrt, winreg..
    code = ("import importlib\n"
            f"for name in {names!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError:\n"
            "        print(name)\n")
    limits = Limits(wall_s=20.0, cpu_s=20.0, memory_bytes=1 << 30, open_files=256)
    every = sb.run_program(code, limits=limits)
    assert every.status is Status.OK, every
    assert every.stdout.split() == absent_here


def host_package_dirs() -> list[str]:
    """Where the running interpreter finds its packages, however it was installed: a venv's
    site-packages (and the base's when the venv has system site-packages), the user site, the
    repo root and every other ``sys.path`` directory (a PYTHONPATH entry, the stdlib's own)."""
    dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else []),
            str(REPO), *sys.path]
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs if d and os.path.isdir(d)))


def see_host_packages(venv: str) -> None:
    """Make the venv at ``venv`` import what this interpreter imports. ``--system-site-packages``
    would give it the *base* interpreter's packages, which in a user's venv has no torch: instead
    a .pth file in its site-packages adds this interpreter's directories with ``site.addsitedir``
    (so their own .pth files, an editable install's among them, are processed too)."""
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    own = subprocess.run([f"{venv}/bin/python", "-c", probe], capture_output=True, text=True, check=True)
    # one line, run by site.py with exec: map, as a comprehension would not see ``site``
    line = f"import site; list(map(site.addsitedir, {host_package_dirs()!r}))\n"
    Path(own.stdout.strip(), "posttrain-host-packages.pth").write_text(line)


def test_isolation_holds_for_a_host_in_a_venv_under_tmp(isolated):
    """The host runs in a venv under /tmp (a clone with its own venv): the sandbox must isolate
    as fully as anywhere else, and the standard library must still import."""
    venv = tempfile.mkdtemp(prefix="posttrain-sandbox-venv-", dir="/tmp")
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        see_host_packages(venv)
        script = ("import json, sys\n"
                  "from posttrain.sandbox import Sandbox\n"
                  "with Sandbox(workers=1) as sb:\n"
                  f"    r = sb.run_program({STDLIB_PROGRAM!r})\n"
                  "    print(json.dumps([sys.prefix, r.status.value, r.stdout, list(r.isolation), "
                  "list(r.fallbacks)]))\n")
        host = host_process(script, python=f"{venv}/bin/python")
        out, _ = host.communicate(timeout=60)
        assert host.returncode == 0 and out, f"the host in {venv} failed (its stderr is above)"
        prefix, status, stdout, isolation, fallbacks = json.loads(out)
        assert os.path.realpath(prefix) == os.path.realpath(venv), out  # the host runs from the venv
        assert (status, stdout) == ("ok", STDLIB_OUTPUT), out
        assert set(isolation) == FULL_ISOLATION and not fallbacks, out
    finally:
        shutil.rmtree(venv)


def test_isolation_holds_for_an_interpreter_under_tmp(isolated):
    """The zygote's interpreter itself lives under /tmp, its module path through a symlink into
    /root (mode 0700): bound and linked in the private root, readable by the slot's uid."""
    base = Path(os.path.realpath(sys.executable))
    prefix = Path(tempfile.mkdtemp(prefix="posttrain-sandbox-python-", dir="/tmp"))
    prefix.chmod(0o755)  # as a clone or an unpacked interpreter would be
    try:
        (prefix / "bin").mkdir()
        shutil.copy2(base, prefix / "bin" / base.name)
        (prefix / "lib").symlink_to(Path(sys.base_prefix) / "lib")  # the stdlib: the base's, venv or not
        python = str(prefix / "bin" / base.name)
        probe = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.path[-1])"],
                               capture_output=True, text=True)
        if not probe.stdout.startswith(str(prefix)):
            pytest.skip(f"a copied interpreter does not find its library here: {probe}")
        with Sandbox(limits=FAST, workers=1, python=python) as moved:
            result = moved.run_program(STDLIB_PROGRAM)
            assert result.status is Status.OK and result.stdout == STDLIB_OUTPUT, result
            assert set(result.isolation) == FULL_ISOLATION and not result.fallbacks
            marker = f"/tmp/posttrain-sandbox-escape-{uuid.uuid4().hex}"
            code = ("import os\n"
                    "def f(path, write):\n"
                    "    if write:\n"
                    "        open(path, 'w').write('x')\n"
                    "    return os.listdir(path) if os.path.isdir(path) else open(path).read()\n")
            calls = moved.run_calls(code, "f", [(marker, True), (str(prefix / "bin"), True),
                                                ("/etc/passwd", False), ("/proc", False)])
            assert [o.kind for o in calls.outcomes] == ["error"] * 4, calls.outcomes
            assert not os.path.exists(marker)
    finally:
        shutil.rmtree(prefix)


def test_isolation_failure_refuses_to_run():
    """Fail closed: a sandbox that cannot isolate raises one clear line, unless allowed."""
    broken = dict(scratch_bytes=-1)  # the private root's tmpfs refuses the size: setup fails
    if not ROOT:
        broken = {}  # not root: nothing can be isolated in the first place
    with Sandbox(limits=FAST, workers=1, **broken) as sandbox:
        with pytest.raises(SandboxUnavailable) as failure:
            sandbox.run_program("print(1)")
    message = str(failure.value)
    assert "\n" not in message and "allow_unisolated" in message
    assert "netns/fs" in message if ROOT else "uid" in message
    with Sandbox(limits=FAST, workers=1, isolate=False) as opted_out_of_fs_only:
        with pytest.raises(SandboxUnavailable, match="isolate=False"):
            opted_out_of_fs_only.check()
    with Sandbox(limits=FAST, workers=1, allow_unisolated=True, **broken) as allowed:
        result = allowed.run_program("print(1)")
        assert result.stdout == "1\n" and result.fallbacks and "fs" not in result.isolation

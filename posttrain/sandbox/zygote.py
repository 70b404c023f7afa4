"""The code that runs inside a slot's zygote and its children (see the package docstring for the
design), and the plan of the zygote's private root. The zygote is started as ``python -I -S -B -c
ZYGOTE_SOURCE``: the functions below are sent as source, so they use only names they import
themselves.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from typing import Any

# Environment of the zygote and its children: nothing inherited from the host (secrets live there).
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}

# Host paths bound read-only into the private root besides the interpreter's prefixes: the system
# libraries that stdlib extension modules link against. Symlinks (merged /usr) are recreated.
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

# Imported once by each zygote, so a candidate's `import re` costs nothing in the forked child.
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string",
           "typing", "operator", "copy")


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


ZYGOTE_SOURCE = "from __future__ import annotations\n" + "\n".join(
    textwrap.dedent(inspect.getsource(f))
    for f in (_sandboxed_child, _root_plan, _isolate_zygote, _zygote_main)
) + "\n_zygote_main()\n"


def root_plan(python: str = sys.executable) -> list[tuple[str, str, str]]:
    """What the private root of a zygote running ``python`` contains (see ``_root_plan``): asks
    that interpreter, started as the zygote is, for its prefixes and module path."""
    probe = ("import sys\nprint(repr([sys.prefix, sys.base_prefix, sys.exec_prefix, "
             "sys.base_exec_prefix, *sys.path]))")
    out = subprocess.run([python, "-I", "-S", "-B", "-c", probe], capture_output=True, text=True,
                         env=CHILD_ENV, cwd="/", check=True).stdout
    return [tuple(e) for e in _root_plan(ast.literal_eval(out), SYSTEM_PATHS, DEVICES)]

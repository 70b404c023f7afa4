"""One process per run directory: ``with run_lock.hold(run_dir, "posttrain pipeline"): ...``.

Two processes writing the same run directory (the command started again in a second terminal, a
bench re-run while a killed parent's child still finishes a stage) interleave checkpoints, stage
results and metrics lines, and the run resumes from a mix of both. The lock is ``flock`` on
``<run_dir>/.lock``: the kernel drops it when the holder exits however it exits (kill -9
included), so a stale lock cannot block a resume, and the file names its holder for the message.
``clear`` empties a held directory for ``--fresh`` but keeps the lock file, whose inode is what
a second process would lock: deleting it would let that process lock a new file beside ours.
A lock file with other hard links (a run directory copied with ``cp -al`` to branch a run off its
finished stages) is unlinked here and made anew first: else the copy and the original share one
inode, and a run in either blocks the other (it happened, 2026-12-04: :func:`_own_lock_file`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posttrain.errors import UserError

LOCK_NAME = ".lock"


class RunDirBusy(UserError):
    pass


@contextmanager
def hold(run_dir: Path, what: str) -> Iterator[Path]:
    """Hold ``run_dir`` (created if missing) for this process until the block ends; a directory
    another process holds raises :class:`RunDirBusy` naming that process."""
    from posttrain.train.loop import RunDirError  # the trainer's own one-line error for this

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _own_lock_file(run_dir)
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"cannot write the run directory {run_dir} ({e.strerror}): set run_dir= to a "
                          "writable directory") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            raise RunDirBusy(f"{run_dir} is in use by {owner}: wait for it to finish or stop it, "
                             "or set run_dir= to another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()}, since {time.strftime('%H:%M:%S')})\n".encode(), 0)
        yield run_dir
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def _own_lock_file(run_dir: Path) -> None:
    """Give ``run_dir`` a lock file of its own when its one is hard-linked elsewhere. Done under a
    ``flock`` of the directory itself, so two processes starting here cannot each unlink the file the
    other just made (each would then lock its own inode and both would run)."""
    path = run_dir / LOCK_NAME
    try:
        if os.stat(path).st_nlink <= 1:
            return
    except FileNotFoundError:
        return
    dfd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_nlink > 1:  # again, under the directory's lock
                path.unlink()
        except FileNotFoundError:
            pass
    finally:
        os.close(dfd)  # releases the directory's lock


def clear(run_dir: Path) -> None:
    """Delete everything in a held ``run_dir`` but its lock file."""
    for p in run_dir.iterdir():
        if p.name == LOCK_NAME:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()

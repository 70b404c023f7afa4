"""One process per run directory (train/run_lock.py): a second process is refused with one line that
names the holder, a holder killed with SIGKILL leaves no stale lock, ``--fresh`` keeps the lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.train import run_lock

HOLDER = """
import sys, time
from pathlib import Path
from posttrain.train import run_lock
with run_lock.hold(Path(sys.argv[1]), "posttrain sft"):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_first_and_a_killed_holder_frees_the_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        with pytest.raises(run_lock.RunDirBusy, match=rf"{run_dir} is in use by posttrain sft \(pid {proc.pid}, since"):
            with run_lock.hold(run_dir, "posttrain pipeline"):
                pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with run_lock.hold(run_dir, "posttrain pipeline"):  # the kernel dropped the dead holder's lock
        assert "posttrain pipeline" in (run_dir / ".lock").read_text()


def test_the_lock_is_released_when_the_block_ends_even_by_an_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with run_lock.hold(tmp_path, "a"):
            raise RuntimeError
    with run_lock.hold(tmp_path, "b"):
        pass


def test_clear_empties_the_directory_and_keeps_it_locked(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "sft" / "checkpoints").mkdir(parents=True)
    (run_dir / "report.md").write_text("old")
    with run_lock.hold(run_dir, "posttrain pipeline"):
        run_lock.clear(run_dir)
        assert [p.name for p in run_dir.iterdir()] == [".lock"]
        probe = subprocess.run([sys.executable, "-c", HOLDER, str(run_dir)], capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and "is in use by posttrain pipeline" in probe.stderr


def test_the_cli_refuses_a_second_pipeline_on_the_same_run_dir_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = _holder(run_dir)
    try:
        out = subprocess.run([sys.executable, "-m", "posttrain.cli", "pipeline", "--quick", "--fresh", f"run_dir={run_dir}"],
                             capture_output=True, text=True, timeout=120)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert out.returncode != 0
    assert f"error: {run_dir} is in use by posttrain sft (pid {proc.pid}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (run_dir / "data").exists()  # --fresh deleted nothing: the lock comes first


def test_a_run_dir_copied_with_hard_links_does_not_share_the_original_lock(tmp_path):
    """`cp -al run branch` (branching a run off its finished stages) copies .lock as a hard link:
    a run in the original must not block one in the copy, and the copy still refuses a second process."""
    original, branch = tmp_path / "run", tmp_path / "branch"
    original.mkdir()
    (original / run_lock.LOCK_NAME).write_text("")
    subprocess.run(["cp", "-al", str(original), str(branch)], check=True)
    assert (branch / run_lock.LOCK_NAME).stat().st_ino == (original / run_lock.LOCK_NAME).stat().st_ino
    proc = _holder(original)
    try:
        with run_lock.hold(branch, "posttrain pipeline"):
            assert (branch / run_lock.LOCK_NAME).stat().st_ino != (original / run_lock.LOCK_NAME).stat().st_ino
            with pytest.raises(run_lock.RunDirBusy, match="is in use by posttrain pipeline"):
                with run_lock.hold(branch, "posttrain sft"):
                    pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

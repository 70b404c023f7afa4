"""Run metrics: one JSON line per step in ``metrics.jsonl``; TensorBoard / W&B when asked and installed.

A disk that fills up (or a kill) can leave the last line cut short. Every append is one ``write``
of one whole line on an ``O_APPEND`` descriptor, so lines never interleave or split in two writes;
readers drop a line that does not parse (with a warning) instead of failing, and the rewrite on
resume (:func:`truncate_metrics`) goes through a temporary file and ``os.replace``, so a crash in
the middle of it leaves the old file, not half of it.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(self, run_dir: str | Path, tensorboard: bool = False, wandb_project: str | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tb"))
            except ImportError:
                print("note: tensorboard is not installed; logging to metrics.jsonl only")
        if wandb_project:
            try:
                import wandb

                self._wandb = wandb.init(project=wandb_project, config=config or {}, dir=str(run_dir))
            except ImportError:
                print("note: wandb is not installed; logging to metrics.jsonl only")

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, "time": round(time.time(), 3), **values}
        line = (json.dumps(row) + "\n").encode()
        # one write(2) of the whole line: buffered text I/O may split a long line into several
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
        finally:
            os.close(fd)
        if written != len(line):  # only a full disk (or quota) cuts a regular-file write short
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)", str(self.path))
        for k, v in values.items():
            if isinstance(v, (int, float)):
                if self._tb is not None:
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _parse(p: Path) -> list[dict[str, Any]]:
    """The rows of a metrics file; a line that does not parse (cut short by a full disk or a kill)
    is dropped with a warning naming it, since one bad line must not block reading the rest."""
    rows, bad = [], []
    for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(n)
    if bad:
        print(f"[{p.parent.name}] warning: {p.name}: dropped {len(bad)} torn or corrupt line(s) "
              f"(line {', '.join(map(str, bad[:5]))}{', ...' if len(bad) > 5 else ''}; an interrupted write, e.g. disk full)")
    return rows


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return []
    return _parse(p)


def truncate_metrics(run_dir: str | Path, after_step: int | None) -> Path | None:
    """Make ``metrics.jsonl`` fit the run about to start; returns where old lines were moved, if anywhere.

    On resume (``after_step`` the checkpoint's step) drop the lines logged after it (they will be
    redone) and any torn line, rewritten atomically (temp file + rename). On a fresh start
    (``after_step=None``) lines already in the file belong to an earlier run in this directory whose
    checkpoints are gone: appending to them would count those steps twice (the pipeline's
    same-tokens control sums ``tokens`` over every line), so the whole file is moved aside to
    ``metrics.previous-N.jsonl``, kept rather than deleted."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return None
    if after_step is None:
        if not p.read_text(errors="replace").strip():
            return None
        n = 1
        while (aside := p.with_name(f"metrics.previous-{n}.jsonl")).exists():
            n += 1
        os.replace(p, aside)
        return aside
    rows = _parse(p)
    keep = [r for r in rows if r.get("step", 0) <= after_step]
    text = "".join(json.dumps(r) + "\n" for r in keep)
    if text == p.read_text(errors="replace"):
        return None
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return None

"""Run metrics: one JSON line per step in ``metrics.jsonl``; TensorBoard / W&B when asked and installed."""

from __future__ import annotations

import json
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
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
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


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def truncate_metrics(run_dir: str | Path, after_step: int) -> None:
    """On resume, drop lines logged after the checkpoint we resume from (they will be redone)."""
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return
    keep = [line for line in p.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= after_step]
    p.write_text("".join(line + "\n" for line in keep))

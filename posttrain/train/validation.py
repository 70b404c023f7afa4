"""Held-out validation of a policy on its RL run's environments, and the best checkpoint.

``validate`` is greedy, one sample per task; ``posttrain validate`` reuses it to score any model on
a run's held-out tasks, and ``eval.compare`` pairs two such records task by task.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def validate(generator: Any, envs: dict[str, Any], cfg: Any, records: Path | None = None,
             progress: bool = False, split: str = "dev", n_tasks: int | None = None) -> dict[str, float]:
    """Greedy mean reward per environment on its validation tasks, and their mean (``val_reward``).
    The RL run validates on ``dev`` (it keeps its best checkpoint by it: a choice); the pipeline's
    test table scores checkpoints the same way on another split, ``n_tasks`` each instead of ``val_tasks``.

    ``records``: also write one JSONL row per task (``env, task_id, reward, reason, response_tokens,
    finish_reason, reasoning_tokens, answer_tokens, answer``), so two checkpoints can be compared task by task (``eval.compare``)."""
    from tqdm.auto import tqdm

    from posttrain.eval.evaluate import evaluate

    out: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for spec in cfg.envs:
        n = n_tasks or spec.val_tasks
        if n:
            with tqdm(total=n, desc=f"validate {spec.name}", unit="task", disable=not progress) as bar:
                r = evaluate(generator, envs[spec.name], split, n, k=1, temperature=0.0,
                             max_new_tokens=cfg.rollout.max_new_tokens, seed=spec.task_seed,
                             reasoning=cfg.rollout.reasoning, max_turns=cfg.rollout.max_turns, progress=bar)
            out[f"val_reward/{spec.name}"] = r.mean_reward
            rows += [{"env": spec.name, "task_id": t.task_id, "reward": t.samples[0].reward,
                      "reason": t.samples[0].reason, "response_tokens": t.samples[0].response_tokens,
                      "finish_reason": t.samples[0].finish_reason, "reasoning_tokens": t.samples[0].reasoning_tokens,
                      "answer_tokens": t.samples[0].answer_tokens, "answer": t.samples[0].answer} for t in r.tasks]
    if out:
        out["val_reward"] = sum(out.values()) / len(out)
    if records is not None:
        records.parent.mkdir(parents=True, exist_ok=True)
        tmp = records.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, records)
    return out


class BestCheckpoint:
    """Keeps ``<run_dir>/best``: the weights with the highest mean validation reward so far."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.step: int | None = None
        self.val_reward: float | None = None

    def offer(self, step: int, val: dict[str, float], model: Any, tokenizer: Any) -> None:
        from posttrain.train.checkpoint import save_hf_model

        if "val_reward" not in val or (self.val_reward is not None and val["val_reward"] <= self.val_reward):
            return
        self.step, self.val_reward = step, val["val_reward"]
        tmp = self.run_dir / ".best.tmp"  # written aside, then renamed: a kill leaves the old best whole
        shutil.rmtree(tmp, ignore_errors=True)
        save_hf_model(model, tokenizer, tmp)
        shutil.rmtree(self.run_dir / "best", ignore_errors=True)
        os.replace(tmp, self.run_dir / "best")

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "val_reward": self.val_reward}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.val_reward = state["step"], state["val_reward"]

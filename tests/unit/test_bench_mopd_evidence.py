"""bench/mopd_evidence.py: the teacher pick (dev bar, registered fallback), the equal-time GRPO step
and the over-seed figures, on hand-made run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.script_module import script_module


@pytest.fixture
def b():
    with script_module("bench", "mopd_evidence") as bench:
        yield bench


def _records(path: Path, domain: str, rewards: list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"env": domain, "task_id": f"t{i}", "reward": r}) + "\n"
                            for i, r in enumerate(rewards)))


def _rl_run(run: Path, steps: dict[int, list[float]], step_s: float = 10.0, domain: str = "math") -> None:
    """An RL run folder: metrics with a step time each step and dev scores at ``steps``, its
    validation records and a checkpoint at each scored step but 0."""
    rows = []
    for s in range(0, max(steps) + 1):
        row = {"step": s}
        if s:
            row["step_s"] = step_s
        if s in steps:
            row[f"val_reward/{domain}"] = sum(steps[s]) / len(steps[s])
            _records(run / "validation" / f"step_{s:06d}.jsonl", domain, steps[s])
            if s:
                (run / "checkpoints" / f"step_{s:06d}").mkdir(parents=True)
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_equal_time_step_is_the_first_saved_step_that_reaches_the_mopd_time(b, tmp_path):
    run = tmp_path / "grpo"
    _rl_run(run, {0: [0.0], 5: [0.0], 10: [0.0], 15: [0.0], 20: [0.0]}, step_s=12.0)
    assert b.train_seconds(run)[10] == pytest.approx(120.0)
    assert b.equal_time_step(run, 121.0) == 15  # 10 steps (120 s) fall short; 15 (180 s) reach it
    assert b.equal_time_step(run, 120.0) == 10
    assert b.equal_time_step(run, 999.0) == 20  # never reached: the last saved step (the report says so)


def test_pick_teacher_takes_the_best_dev_step_and_falls_back_below_three_se(b, tmp_path):
    base = [0.0] * 20
    _records(tmp_path / "dev" / "base.jsonl", "math", base)
    # weak: step 10 gains 2 of 20 tasks (0.10 ± 0.069, under 3 se); its step 20 is worse, so step 10 is its best
    _rl_run(tmp_path / "weak", {0: base, 10: [1.0] * 2 + [0.0] * 18, 20: [1.0] + [0.0] * 19})
    # strong: 10 of 20 (0.50 ± 0.115, over 3 se)
    _rl_run(tmp_path / "strong", {0: base, 10: [1.0] * 10 + [0.0] * 10})
    assert b.best_dev_checkpoint(tmp_path / "weak", "math").name == "step_000010"
    assert b.pick_teacher(tmp_path, "math", ["weak", "strong"]) == tmp_path / "strong" / "checkpoints" / "step_000010"
    assert b.pick_teacher(tmp_path, "math", ["strong", "weak"]) == tmp_path / "strong" / "checkpoints" / "step_000010"
    # no candidate meets the bar: the first is kept (the report then says the bar is not met)
    assert b.pick_teacher(tmp_path, "math", ["weak"]) == tmp_path / "weak" / "checkpoints" / "step_000010"


def test_over_seeds_pools_paired_errors_and_the_spread_between_seeds(b):
    seeds = [{"pooled": {"gain": g, "se": se}} for g, se in ((0.10, 0.03), (0.20, 0.04), (0.00, 0.05))]
    m = b.over_seeds(seeds)["pooled"]
    assert m["gain"] == pytest.approx(0.10)
    assert m["se"] == pytest.approx(math.sqrt(0.03 ** 2 + 0.04 ** 2 + 0.05 ** 2) / 3)
    assert m["between"] == pytest.approx(0.10 / math.sqrt(3))  # sd of (0.1, 0.2, 0.0) is 0.1
    assert m["per_seed"] == [0.10, 0.20, 0.00]


def test_gains_are_paired_per_domain_pooled_and_by_ifeval(b, tmp_path):
    before, after = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows_a = [{"env": "math", "task_id": "m1", "reward": 0.0}, {"env": "math", "task_id": "m2", "reward": 1.0},
              {"env": "instruction", "task_id": "i1", "reward": 0.0}, {"env": "instruction", "task_id": "i2", "reward": 0.0}]
    rows_b = [{"env": "math", "task_id": "m1", "reward": 1.0}, {"env": "math", "task_id": "m2", "reward": 1.0},
              {"env": "instruction", "task_id": "i1", "reward": 1.0}, {"env": "instruction", "task_id": "i2", "reward": 0.0}]
    before.write_text("".join(json.dumps(r) + "\n" for r in rows_a))
    after.write_text("".join(json.dumps(r) + "\n" for r in rows_b))
    g = b.gains(before, after)
    assert g["math"]["gain"] == pytest.approx(0.5) and g["instruction"]["gain"] == pytest.approx(0.5)
    assert g["pooled"]["gain"] == pytest.approx(0.5) and g["pooled"]["n"] == 4
    assert "instruction (IFEval)" not in g  # no IFEval grades beside the records: no such column
    before.with_suffix(".ifeval.jsonl").write_text(json.dumps({"env": "instruction", "task_id": "i1", "reward": 0.0}) + "\n")
    after.with_suffix(".ifeval.jsonl").write_text(json.dumps({"env": "instruction", "task_id": "i1", "reward": 1.0}) + "\n")
    assert b.gains(before, after)["instruction (IFEval)"]["gain"] == pytest.approx(1.0)

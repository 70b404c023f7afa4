"""bench/dpo_tool_hallucination.py: the results table from measurement files, paired per prompt /
task, rates pooled and split by the tools offered; a missing file is a one-line error."""

from __future__ import annotations

import json

import pytest

from tests.script_module import script_module


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _measurements(tmp_path, after_calls=(0.25, 0.0)):
    for tag, calls in (("sft", [1.0, 0.5]), ("dpo", list(after_calls))):
        _write(tmp_path / f"rates_{tag}.jsonl", [
            {"env": "math/unfitting", "task_id": "a", "reward": calls[0]},
            {"env": "mcq/unfitting", "task_id": "b", "reward": calls[1]},
            {"env": "math/none", "task_id": "c", "reward": 0.0}])
        _write(tmp_path / f"decisions_{tag}.jsonl", [
            {"env": "banking@call", "task_id": "t1/turn04", "reward": 1.0},
            {"env": "banking@call", "task_id": "t1/turn06", "reward": 0.0 if tag == "dpo" else 1.0},
            {"env": "banking@call", "task_id": "t2/turn04", "reward": 1.0}])
        _write(tmp_path / f"heldout_{tag}.jsonl", [{"env": "math", "task_id": "m", "reward": 1.0}])


def test_table_pairs_prompts_and_tasks(tmp_path, capsys):
    _measurements(tmp_path)
    with script_module("bench", "dpo_tool_hallucination") as bench:
        text, figures = bench.table(tmp_path, "sft", "dpo")
        by = {f["measure"]: f for f in figures}
        # unfitting: before (1 + 0.5)/2, after (0.25 + 0)/2; differences -0.75, -0.5: se = sd/sqrt(2) = 0.125
        assert by["rates/unfitting"]["before"] == 0.75 and by["rates/unfitting"]["after"] == 0.125
        assert by["rates/unfitting"]["se"] == pytest.approx(0.125) and by["rates/all"]["n"] == 3
        assert by["decisions/banking@call"]["n"] == 2 and by["decisions/banking@call"]["after"] == 0.75  # per task
        assert "| math held-out accuracy (greedy) | 1 | 100.0% | 100.0% |" in text
        assert bench.main(["--dir", str(tmp_path), "--no-save"]) == 0
        assert "RESULT dpo_tool_hallucination: 75.0% -> 12.5% tool-call rate" in capsys.readouterr().out
        (tmp_path / "heldout_dpo.jsonl").unlink()
        with pytest.raises(SystemExit, match="heldout_dpo.jsonl is missing"):
            bench.main(["--dir", str(tmp_path), "--no-save"])


def test_seeds_pool_to_the_mean_change_with_both_errors(tmp_path, capsys):
    a, b = tmp_path / "s0", tmp_path / "s1"
    a.mkdir(), b.mkdir()
    _measurements(a)                     # unfitting: −0.625 ± 0.125
    _measurements(b, after_calls=(0.5, 0.5))  # unfitting: 0.75 → 0.5, changes −0.5, 0: −0.25 ± 0.25
    with script_module("bench", "dpo_tool_hallucination") as bench:
        assert bench.main(["--dir", str(a), "--dir", str(b), "--no-save"]) == 0
        out = capsys.readouterr().out
        # mean (−0.625 − 0.25)/2 = −0.4375; se sqrt(0.125² + 0.25²)/2 = 0.1398; half the range 0.1875
        assert "rates/unfitting" in out and "-43.8 ± 14.0 points (per seed -62.5, -25.0; half the range 18.8)" in out
        assert "RESULT dpo_tool_hallucination: 75.0% -> 31.2% tool-call rate (-43.8 ± 14.0 points, mean of 2 seeds" in out

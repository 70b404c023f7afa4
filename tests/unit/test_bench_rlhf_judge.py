"""bench/rlhf_judge.py: per-task figures from graded replies, and the between-seed error."""

from __future__ import annotations

import pytest

from tests.script_module import script_module


def test_per_task_grades_every_constraint_and_the_mapped_ones_apart():
    doc = {"items": [
        {"task_id": "a", "tokens": 10, "constraints": [{"ours": True, "reference": True},
                                                       {"ours": False, "reference": None}]},
        {"task_id": "b", "tokens": 4, "constraints": [{"ours": True, "reference": None}]},
    ]}
    with script_module("bench", "rlhf_judge") as bench:
        t = bench.per_task(doc)
    # a: ours fails one of two; the reference grades only the mapped one, which it passes
    assert t["a"] == {"ours": 0.0, "ours_inst": 0.5, "ref_mapped": 1.0, "ref_inst": 1.0, "tokens": 10.0}
    # b: no mapped constraint, so no reference figure (left out of the reference columns, not a zero)
    assert t["b"]["ref_mapped"] is None and t["b"]["ours"] == 1.0
    assert bench.column(t, "ref_inst") == {"a": 1.0}


def test_between_seeds_is_the_standard_error_of_the_seed_mean():
    with script_module("bench", "rlhf_judge") as bench:
        # gains −35.0, −27.3, −8.1 points: sd 13.84, / sqrt(3) = 7.99
        assert bench.between_seeds([-0.35, -0.273, -0.081]) == pytest.approx(0.0799, abs=1e-4)
        assert bench.between_seeds([0.1]) is None

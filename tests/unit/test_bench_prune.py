"""bench/prune.py's recovery: student / teacher over the same tasks, ± the paired ratio's se, by hand."""

import math

import pytest

from tests.script_module import script_module


def test_recovery_is_the_ratio_of_paired_means_with_its_delta_se():
    with script_module("bench", "prune") as m:
        teacher = {"arithmetic/a": 1.0, "arithmetic/b": 1.0, "arithmetic/c": 1.0, "arithmetic/d": 1.0,
                   "mcq/x": 0.0, "mcq/y": 0.0}
        student = {"arithmetic/a": 1.0, "arithmetic/b": 0.0, "arithmetic/c": 1.0, "arithmetic/d": 1.0,
                   "mcq/x": 1.0, "mcq/y": 0.0}
        # arithmetic: 3/4 of the teacher's 4/4; the teacher's scores do not vary, so the se is the
        # student's: sd 0.5 / sqrt(4) = 0.25
        assert m.recovery(student, teacher, "arithmetic/") == pytest.approx((75.0, 25.0))
        assert all(math.isnan(x) for x in m.recovery(student, teacher, "mcq/"))  # teacher 0: nothing to recover
        pooled, _ = m.recovery(student, teacher)
        assert pooled == pytest.approx(100 * 4 / 4)  # mcq's x counts in the student's sum, not the teacher's


def test_a_work_folder_of_other_training_settings_is_refused(tmp_path):
    import argparse

    with script_module("bench", "prune") as m:
        args = argparse.Namespace(teacher="t", distill_steps=60, search_steps=10, batch=16, lr=1e-4, topk=64,
                                  data=["a.jsonl"], n_data=1000)
        m.same_work(args, tmp_path)
        m.same_work(args, tmp_path)  # the same settings: resumes
        args.distill_steps = 30
        with pytest.raises(SystemExit, match="distill_steps=60"):
            m.same_work(args, tmp_path)


def test_paired_gain_is_the_mean_task_difference_with_its_se():
    with script_module("bench", "prune") as m:
        a = {"x": 1.0, "y": 1.0, "z": 0.0, "w": 1.0}
        b = {"x": 0.0, "y": 1.0, "z": 0.0, "w": 0.0}
        # differences 1, 0, 0, 1: mean 0.5, sd 0.577, se 0.289
        mean, se = m.paired_gain(a, b)
        assert mean == pytest.approx(50.0) and se == pytest.approx(100 * 0.57735 / 2, rel=1e-4)

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

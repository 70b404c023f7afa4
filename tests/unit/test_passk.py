"""pass@k / avg@k estimators against hand-computed values, and the evaluation aggregates."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from posttrain.eval.evaluate import SampleResult, TaskResult, reason_label, summarize
from posttrain.eval.passk import avg_at_k, n_correct, pass_at_k
from posttrain.engines.base import SamplingParams


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 2 / 5),          # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 2, 7 / 10),         # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 9 / 10),         # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 4, 1.0),            # n - c = 3 < 4: every draw of 4 holds a correct sample
    (10, 0, 5, 0.0),
    (4, 4, 1, 1.0),
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
    (1000, 1, 1, 0.001),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_are_huge():
    n, c, k = 2000, 37, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_rises_with_k_and_c():
    assert pass_at_k(20, 3, 1) < pass_at_k(20, 3, 5) < pass_at_k(20, 3, 10)
    assert pass_at_k(20, 3, 5) < pass_at_k(20, 6, 5)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k_and_correct_counts():
    assert avg_at_k([1.0, 0.0, 0.5, 0.5]) == 0.5
    assert n_correct([1.0, 0.0, 0.5, 1.0]) == 2
    assert n_correct([1.0, 0.0, 0.5, 1.0], success_threshold=0.5) == 3
    with pytest.raises(ValueError):
        avg_at_k([])


def sample(reward, reason="ok", tokens=10, finish="done", **components):
    return SampleResult(reward, reason, components, tokens, finish, 1)


def test_summarize_aggregates_by_hand():
    tasks = [
        TaskResult("a", [sample(1.0, tokens=10, correct=1.0), sample(0.0, "wrong: got 3", 30, "length", correct=0.0)]),
        TaskResult("b", [sample(0.5, "partial; 1 of 2", 20), sample(0.5, "partial; 1 of 2", 20)]),
    ]
    r = summarize("toy", "validation", SamplingParams(temperature=0.7, max_new_tokens=64), 3, tasks, 1.5)
    assert (r.n_tasks, r.k, r.temperature, r.max_new_tokens, r.seed) == (2, 2, 0.7, 64, 3)
    assert r.mean_reward == pytest.approx((0.5 + 0.5) / 2)   # avg@2 per task, then the mean
    assert r.pass_at_1 == pytest.approx((0.5 + 0.0) / 2)     # partial credit is not a pass
    assert r.pass_at_k == pytest.approx((1.0 + 0.0) / 2)
    assert r.mean_response_tokens == pytest.approx(20.0)
    assert r.finish_reasons == {"done": 3, "length": 1}
    assert r.reasons == {"partial": 2, "ok": 1, "wrong": 1}
    assert r.components == {"correct": 0.5}                  # averaged where reported


def test_reason_label_keeps_the_stable_head():
    assert reason_label("schema_violation: 'x' is a required property") == "schema_violation"
    assert reason_label("rules hold; judge: judge_scored 0.7") == "rules hold"
    assert reason_label("valid") == "valid"
    assert reason_label("") == "(none)"

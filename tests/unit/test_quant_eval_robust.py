"""Robustness measures of `posttrain eval` (eval/robust.py) on hand-made results."""

from __future__ import annotations

import argparse
import math

import pytest

from posttrain.envs.base import Task
from posttrain.eval.evaluate import EvalResult
from posttrain.eval.robust import (
    format_recovery,
    format_sensitivity,
    plot_report,
    prompt_sensitivity,
    recovery,
    reword,
)


def R(env, score, wording=0, seed=0, temperature=0.0, k=1, pass_k=None):
    return EvalResult(env=env, split="validation", n_tasks=10, k=k, temperature=temperature, max_new_tokens=8,
                      seed=seed, mean_reward=score, pass_at_1=score, pass_at_k=score if pass_k is None else pass_k,
                      mean_response_tokens=3.0, seconds=0.0, wording=wording, task_seed=0 if seed else None)


def test_prompt_sensitivity_std_by_hand():
    # 3 wordings × 2 seeds; per-wording means 0.5, 0.7, 0.6 → population std = sqrt(((.1)²+(.1)²+0)/3)
    res = [R("math", s, w, seed, 0.7, 4) for w, (a, b) in enumerate([(0.4, 0.6), (0.7, 0.7), (0.5, 0.7)])
           for seed, s in ((0, a), (1, b))]
    (row,) = prompt_sensitivity(res)
    assert row["mode"] == "sampled@4" and row["wordings"] == 3 and row["runs"] == 6
    assert row["per_wording"] == pytest.approx({0: 0.5, 1: 0.7, 2: 0.6})
    assert row["mean"] == pytest.approx(0.6)
    assert row["std_points"] == pytest.approx(100 * math.sqrt(0.02 / 3))
    assert "8.16" in format_sensitivity([row])
    # the same wording everywhere: std 0 (seeds' noise is averaged within a wording, not counted)
    (flat,) = prompt_sensitivity([R("math", s, 0, seed, 0.7, 4) for seed, s in enumerate((0.2, 0.9))])
    assert flat["std_points"] == 0.0 and flat["mean"] == pytest.approx(0.55)


def test_recovery_median_and_zero_base():
    base = [R("math", 0.8), R("mcq", 0.5), R("code", 0.0), R("ifeval", 0.4), R("math", 0.6, temperature=0.7, k=4)]
    fp8 = [R("math", 0.76), R("mcq", 0.5), R("code", 0.1), R("ifeval", 0.3), R("math", 0.6, temperature=0.7, k=4)]
    rec = recovery(base, fp8)
    by = {(r["env"], r["mode"]): r["recovery"] for r in rec["rows"]}
    assert by[("math", "greedy")] == pytest.approx(0.95) and by[("mcq", "greedy")] == 1.0
    assert by[("code", "greedy")] is None  # base 0: no ratio, left out of the median
    assert rec["median"]["greedy"] == pytest.approx(0.95)  # median of 0.95, 1.0, 0.75
    assert rec["median"]["sampled@4"] == 1.0
    text = format_recovery(rec, "bf16", "fp8")
    assert "95.0%" in text and "n/a (base 0)" in text


def test_reword_frames_only_the_last_user_message():
    t = Task(id="1", domain="math", messages=[{"role": "system", "content": "sys"},
                                                {"role": "user", "content": "What is 2+2?"}])
    assert reword(t, 0) is t
    t1 = reword(t, 1)
    assert t1.messages[0] == {"role": "system", "content": "sys"}
    assert t1.messages[1]["content"].endswith("What is 2+2?") and t1.messages[1]["content"] != "What is 2+2?"
    assert t.messages[1]["content"] == "What is 2+2?"  # the original is untouched


def test_passes_greedy_and_sampled_in_one_command():
    from posttrain.commands.eval import passes

    args = argparse.Namespace(k=1, temperature=0.0, sampled_k=4, sample_temperature=0.7, wordings=2, seeds=3, seed=5)
    p = passes(args)
    greedy = [x for x in p if x["temperature"] == 0]
    sampled = [x for x in p if x["temperature"] > 0]
    assert len(greedy) == 2 and {x["seed"] for x in greedy} == {5}  # seeds change nothing when greedy
    assert len(sampled) == 6 and {x["seed"] for x in sampled} == {5, 6, 7} and all(x["k"] == 4 for x in sampled)
    assert all(x["task_seed"] == 5 for x in p)


def test_report_plot(tmp_path):
    res = [R("math", 0.5), R("math", 0.4, wording=1), R("math", 0.6, temperature=0.7, k=4, pass_k=0.9)]
    rec = recovery(res, res)
    path = plot_report(res, tmp_path / "r.png", prompt_sensitivity(res), rec)
    assert path.stat().st_size > 1000

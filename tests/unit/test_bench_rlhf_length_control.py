"""bench/rlhf_length_control.py: the per-run summary and the on − off comparison, on hand-made runs."""

from __future__ import annotations

import json

import pytest

from tests.script_module import script_module


@pytest.fixture(scope="module")
def lc():
    with script_module("bench", "rlhf_length_control") as m:
        yield m


def _run(root, name, think, answer, start, end, val_think_end):
    run = root / name
    (run / "validation").mkdir(parents=True)
    rows = [{"step": 0, "val_reward": 0.5}]
    rows += [{"step": i + 1, "think_len_mean": t, "answer_len_mean": a, "genrm_fallback_frac": 0.0,
              "reward_base_group_std": 1.0, "reward_base_flat_frac": 0.0, "step_s": 10.0, "time_judge_s": 5.0}
             for i, (t, a) in enumerate(zip(think, answer))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, rewards, vt in ((0, start, [10, 10, 10, 10]), (len(think), end, val_think_end)):
        (run / "validation" / f"step_{step:06d}.jsonl").write_text("".join(
            json.dumps({"env": "arithmetic", "task_id": f"t{i}", "reward": r, "reasoning_tokens": vt[i],
                        "answer_tokens": 4, "finish_reason": "length" if vt[i] == 8 else "stop"}) + "\n"
            for i, r in enumerate(rewards)))
    return run


def test_summary_and_paired_on_minus_off(lc, tmp_path):
    on = _run(tmp_path, "on_0", [30, 20, 10, 10], [5, 5, 4, 4], [1, 0, 1, 0], [1, 0, 0, 0], [6, 6, 8, 8])
    off = _run(tmp_path, "off_0", [30, 30, 30, 30], [5, 5, 5, 5], [1, 0, 1, 0], [1, 1, 1, 0], [10, 10, 10, 10])
    s = lc.summarize(on)
    assert s["roll_think_first"] == 30 and s["roll_think_last"] == 10
    assert s["roll_think_last3"] == pytest.approx(40 / 3)
    assert s["val"]["arithmetic"]["gain"] == pytest.approx(-0.25) and s["val"]["arithmetic"]["lost"] == 1
    assert s["val_reasoning_tokens_change"][0] == pytest.approx(-3.0)  # 7 − 10
    assert s["val_truncated_start"] == 0.0 and s["val_truncated_end"] == 0.5
    # on − off at the end, paired over the same tasks: rewards 0 − 1 on t1, t2 → −0.5; reasoning −3
    table = lc.seed_table(s, lc.summarize(off), on, off)
    assert "| **on − off at the end, arithmetic reward** | -0.500 ± 0.289 (paired, 0 / 2 tasks) | |" in table
    assert "held-out reasoning tokens** | -3.0 ± 0.6 (paired)" in table

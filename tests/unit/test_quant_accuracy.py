"""bench/quant_accuracy.py: the paired FP8-vs-BF16 table, on hand-made per-problem scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posttrain.eval.evaluate import EvalResult, SampleResult, TaskResult
from posttrain.eval.report import write_json
from tests.script_module import script_module


@pytest.fixture(scope="module")
def qa():
    with script_module("bench", "quant_accuracy") as m:
        yield m


def test_ratio_delta_se_by_hand(qa):
    a, b = [1, 0, 1, 1], [1, 1, 1, 0]  # means 0.75 / 0.75: ratio 1
    # var a = var b = 0.25, cov = -0.25 / 3; var(R) ≈ (0.25 + 2/12 + 0.25) / 4 / 0.75²
    assert qa.ratio_delta_se(a, b) == pytest.approx(math.sqrt((0.5 + 2 / 12) / 4) / 0.75)
    lo, hi = qa.ratio_bootstrap(a * 25, b * 25, reps=2000)
    assert lo < 1.0 < hi


def test_by_digits_reads_the_task_ids(qa):
    got = qa.by_digits({"arith-1+5": 1.0, "arith-32-77": 0.0, "arith-9*10": 1.0, "arith-3-4": 0.0})
    assert got == {"1": 0.5, "2": 0.5}


def eval_json(path: Path, rewards: dict[str, list[float]], temperature: float = 0.0) -> None:
    k = len(next(iter(rewards.values())))
    tasks = [TaskResult(i, [SampleResult(r, "", {}, 10, "done", 1) for r in rs]) for i, rs in rewards.items()]
    res = EvalResult(env="arithmetic", split="validation", n_tasks=len(tasks), k=k, temperature=temperature,
                     max_new_tokens=80, seed=2, mean_reward=0.0, pass_at_1=0.0, pass_at_k=0.0,
                     mean_response_tokens=10.0, seconds=1.5, tasks=tasks)
    write_json(path, {"argv": []}, [res])


def test_compare_pairs_greedy_and_sampled_runs(qa, tmp_path):
    ids = ["arith-1+1", "arith-2+2", "arith-10+3", "arith-11*2"]
    eval_json(tmp_path / "bf16.json", {i: [x] for i, x in zip(ids, [1, 1, 0, 1])})
    eval_json(tmp_path / "fp8.json", {i: [x] for i, x in zip(ids, [1, 0, 1, 0])})
    eval_json(tmp_path / "bf16_s.json", {i: [1, 0] for i in ids}, temperature=0.7)
    eval_json(tmp_path / "fp8_s.json", {i: [0, 0] for i in ids[:2]} | {i: [1, 1] for i in ids[2:]}, temperature=0.7)
    (tmp_path / "fp8.load").write_text("2.5 3.0\n")
    measure = tmp_path / "measure.json"  # the pipeline's stage JSON
    measure.write_text(json.dumps({"result": {"per_task": [{"id": i, "correct": 1.0} for i in ids], "seconds": 9}}))
    rows = qa.compare(f"{tmp_path}/bf16.json,{tmp_path}/bf16_s.json",
                      [("fp8", f"{tmp_path}/fp8.json,{tmp_path}/fp8_s.json"), ("fp32", str(measure))])
    greedy = {r["model"]: r for r in rows if r["mode"] == "greedy"}
    assert greedy["bf16"]["accuracy"] == 0.75 and greedy["bf16"]["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    g = greedy["fp8"]
    assert (g["accuracy"], g["diff"], g["gained"], g["lost"]) == (0.5, -0.25, 1, 2)
    assert g["recovery"] == pytest.approx(0.5 / 0.75) and g["load"] == [2.5, 3.0]
    assert greedy["fp32"]["recovery"] == pytest.approx(1 / 0.75)
    s = next(r for r in rows if r["mode"] == "avg@2 t=0.7" and r["model"] == "fp8")
    assert (s["accuracy"], s["diff"], s["recovery"]) == (0.5, 0.0, 1.0)  # fp32 has no sampled run: no row
    assert {r["model"] for r in rows if r["mode"] == "avg@2 t=0.7"} == {"bf16", "fp8"}
    assert "| fp8 | 50.0% ± 25.0 | -25.0 ±" in qa.markdown(rows)


def test_the_row_names_the_split_the_eval_files_scored(qa, tmp_path):
    """--bench-row's split is the one the ``posttrain eval`` files record (a pipeline stage JSON records none)."""
    eval_json(tmp_path / "bf16.json", {"arith-1+1": [1.0]})
    measure = tmp_path / "measure.json"
    measure.write_text(json.dumps({"result": {"per_task": [{"id": "arith-1+1", "correct": 1.0}]}}))
    assert qa.eval_split([str(tmp_path / "bf16.json"), str(measure)]) == "validation"  # as the file says
    doc = json.loads((tmp_path / "bf16.json").read_text())
    doc["results"][0]["split"] = "dev"
    (tmp_path / "dev.json").write_text(json.dumps(doc))
    assert qa.eval_split([str(tmp_path / "dev.json")]) == "dev"
    assert qa.eval_split([f"{tmp_path}/bf16.json,{tmp_path}/dev.json"]) is None  # two splits: the caller must say

"""bench/prune_seeds.py: bench/prune.py's rows of several seeds → per-seed and over-seed figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("prune_seeds", ROOT / "bench" / "prune_seeds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TEACHER = {"a/1": 1.0, "a/2": 1.0, "a/3": 1.0, "a/4": 0.0}


def _row(seed: int | None, searched: dict[str, float], control: dict[str, float], teacher=TEACHER) -> dict:
    def s(tasks):
        return {"tasks": tasks, "nll": 0.1, "recovery": {"pooled": [100 * sum(tasks.values()) / sum(teacher.values()), 5.0]}}

    target = {"params_target": 1.0e8, "searched": "mlp_hidden", "scores": {"searched": s(searched), "sft_control": s(control)}}
    if seed is not None:
        target["seed"] = seed
    args = {"distill_steps": 60, "search_steps": 10, "batch": 16, "lr": 1e-4, "topk": 64, "n_eval": 4,
            "max_new_tokens": 96, "envs": ["a"]}
    return {"args": args, "teacher": {"tasks": teacher, "nll": 0.02}, "targets": [target]}


def test_gains_per_seed_and_over_seeds_by_hand():
    b = _bench()
    rows = [_row(None, {"a/1": 1, "a/2": 1, "a/3": 0, "a/4": 0}, {"a/1": 1, "a/2": 0, "a/3": 0, "a/4": 0}),
            _row(1, {"a/1": 1, "a/2": 1, "a/3": 1, "a/4": 0}, {"a/1": 1, "a/2": 1, "a/3": 0, "a/4": 0})]
    seeds = b.per_seed(rows, 1.0e8)
    assert [s["seed"] for s in seeds] == [0, 1]  # a row without a seed is seed 0
    out = b.summarise(seeds)
    d = out["comparisons"]["distilled − SFT control"]
    # each seed: one task of four gained → +25 points; differences (0, 1, 0, 0): se = sqrt(0.25*0.75*4/3/4)
    se = 100 * (0.25 / 4) ** 0.5
    assert d["per_seed"] == [pytest.approx((25.0, se)), pytest.approx((25.0, se))]
    assert d["mean"] == pytest.approx(25.0) and d["se"] == pytest.approx(se / 2 ** 0.5) and d["between_se"] == 0
    t = out["comparisons"]["distilled − teacher"]["per_seed"]
    assert [g for g, _ in t] == pytest.approx([-25.0, 0.0])
    assert "width − depth" not in out["comparisons"]  # those variants were not trained
    rec = out["recovery"]["searched"]
    assert rec["mean"] == pytest.approx(100 * (2 / 3 + 3 / 3) / 2)
    assert rec["between_se"] == pytest.approx(100 * (1 / 3) / 2)  # two values 1/3 apart: sd/√2


def test_rows_of_another_teacher_settings_or_a_repeated_seed_are_refused():
    b = _bench()
    ok = _row(0, dict(TEACHER), dict(TEACHER))
    other = _row(1, dict(TEACHER), dict(TEACHER), teacher={**TEACHER, "a/4": 1.0})
    with pytest.raises(SystemExit, match="another teacher"):
        b.per_seed([ok, other], 1.0e8)
    slow = json.loads(json.dumps(_row(1, dict(TEACHER), dict(TEACHER))))
    slow["args"]["distill_steps"] = 120
    with pytest.raises(SystemExit, match="distill_steps"):
        b.per_seed([ok, slow], 1.0e8)
    with pytest.raises(SystemExit, match="twice"):
        b.per_seed([ok, _row(0, dict(TEACHER), dict(TEACHER))], 1.0e8)
    with pytest.raises(SystemExit, match="no ≤ 7e\\+07 target"):
        b.per_seed([ok], 7.0e7)


def test_searched_minus_width_only_when_the_search_picked_another_cut():
    b = _bench()

    def with_width(row, width):
        row["targets"][0]["scores"]["width"] = {"tasks": width, "nll": 0.1, "recovery": {"pooled": [50.0, 5.0]}}
        return row

    same = {"a/1": 1, "a/2": 1, "a/3": 0, "a/4": 0}
    picked_width = [with_width(_row(0, dict(same), dict(same)), dict(same))]
    assert "searched − width" not in b.summarise(b.per_seed(picked_width, 1.0e8))["comparisons"]
    other = [with_width(_row(0, dict(same), dict(same)), {"a/1": 1, "a/2": 0, "a/3": 0, "a/4": 0})]
    got = b.summarise(b.per_seed(other, 1.0e8))["comparisons"]["searched − width"]
    assert got["per_seed"][0][0] == pytest.approx(25.0)

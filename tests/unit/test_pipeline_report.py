"""The pipeline's noise arithmetic and resume command, on hand-made measurements."""

from __future__ import annotations

import argparse
import math

import pytest

from posttrain.experiments.pipeline import resume_command, stage_gains
from posttrain.experiments.pipeline_report import binomial_se


def _measured(correct: list[int], fmt: list[int]) -> dict:
    return {"per_task": [{"id": f"t{i}", "correct": c, "format": f} for i, (c, f) in enumerate(zip(correct, fmt))]}


def test_binomial_se():
    assert binomial_se(0.5, 100) == pytest.approx(0.05)
    assert binomial_se(0.0, 50) == 0.0 and binomial_se(1.0, 1) == 0.0


def test_stage_gains_are_paired_per_problem():
    before = _measured([0, 0, 1, 0], [0, 1, 1, 0])
    after = _measured([1, 0, 1, 1], [1, 1, 1, 1])
    after_rl = _measured([1, 1, 1, 0], [1, 1, 1, 1])
    g = stage_gains(before, after, after_rl)
    sft = g["SFT (after SFT − before)"]["accuracy"]
    # differences 1, 0, 0, 1: mean 0.5, sample sd sqrt(1/3), se sqrt(1/3)/2
    assert (sft["gain"], sft["gained"], sft["lost"], sft["n"]) == (0.5, 2, 0, 4)
    assert sft["se"] == pytest.approx(math.sqrt(1 / 3) / 2)
    rl = g["RL (after RL − after SFT)"]["accuracy"]  # differences 0, 1, 0, -1
    assert (rl["gain"], rl["gained"], rl["lost"]) == (0.0, 1, 1)
    assert g["RL (after RL − after SFT)"]["format"]["gain"] == 0.0
    assert "RL − longer SFT" not in g
    # a measurement cached before per-problem results existed has no paired gain (not a zero)
    assert stage_gains({"accuracy": 0.1}, after) == {}


def test_resume_command_repeats_the_run_without_fresh():
    args = argparse.Namespace(quick=True, fresh=True, no_rlvr=False, sft_arm=True, distill=False, rlhf=False,
                              curation=False, config="my recipe.yaml", overrides=["seed=2", "rl_overrides=[a=1, b=2]"])
    assert resume_command(args) == ("posttrain pipeline --quick --sft-arm --config 'my recipe.yaml' seed=2 "
                                    "'rl_overrides=[a=1, b=2]'")

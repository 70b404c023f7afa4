"""The pipeline's noise arithmetic and resume command, on hand-made measurements."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from posttrain.commands.pipeline import resume_command
from posttrain.experiments.pipeline import stage_gains
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
    # the anchor-alone control: its gain over SFT, and RL against it (what the reward adds)
    ctrl = _measured([1, 1, 1, 1], [1, 1, 1, 1])
    g = stage_gains(before, after, after_rl, after_ctrl=ctrl)
    assert g["anchor alone − after SFT"]["accuracy"]["gain"] == 0.25
    assert (g["RL − anchor alone"]["accuracy"]["gain"], g["RL − anchor alone"]["accuracy"]["lost"]) == (-0.25, 1)
    assert "RL − longer SFT" not in g
    # a measurement cached before per-problem results existed has no paired gain (not a zero)
    assert stage_gains({"accuracy": 0.1}, after) == {}


def test_anchor_control_needs_the_rlvr_stage_and_its_anchor():
    from pydantic import ValidationError

    from posttrain.configs.pipeline import PipelineConfig

    assert PipelineConfig(anchor_control=True).anchor_control
    for bad in ({"rlvr": False}, {"rl_sft_anchor": 0.0}):
        with pytest.raises(ValidationError, match="anchor_control: the control is the RLVR stage's SFT anchor alone"):
            PipelineConfig(anchor_control=True, **bad)


def test_the_rft_control_is_on_by_default_only_where_there_is_an_rlvr_stage():
    from pydantic import ValidationError

    from posttrain.configs.pipeline import QUICK, PipelineConfig

    assert PipelineConfig().rft_arm and not PipelineConfig(**QUICK).rft_arm
    assert not PipelineConfig(rlvr=False).rft_arm  # the default yields; nothing to repeat
    with pytest.raises(ValidationError, match="rft_arm=false too, or use --no-rlvr"):
        PipelineConfig(rlvr=False, rft_arm=True)  # asked for explicitly: refused before any work


@pytest.mark.parametrize("flag, off", [("no_rlvr", {"rlvr", "rft_arm"}),
                                       ("no_controls", {"sft_arm", "tokens_arm", "rft_arm"})])
def test_no_rlvr_and_no_controls_turn_the_rft_control_off(flag, off, monkeypatch, tmp_path):
    from posttrain.commands import pipeline as command

    seen = {}
    monkeypatch.setattr(command, "_run_or_say_where", lambda cfg, run_dir, args: seen.setdefault("cfg", cfg) and 0)
    args = argparse.Namespace(quick=False, config=None, fresh=False, curation=False, distill=False, no_rlvr=False,
                              rlhf=False, no_controls=False, anchor_control=False, overrides=[f"run_dir={tmp_path / 'r'}"])
    setattr(args, flag, True)
    command.run(args)
    cfg = seen["cfg"]
    assert {k for k in ("rlvr", "sft_arm", "tokens_arm", "rft_arm") if not getattr(cfg, k)} == off


def test_resume_command_repeats_the_run_without_fresh():
    args = argparse.Namespace(quick=True, fresh=True, no_rlvr=False, no_controls=True, distill=False, rlhf=False,
                              anchor_control=True, curation=False, config="my recipe.yaml",
                              overrides=["seed=2", "rl_overrides=[a=1, b=2]"])
    assert resume_command(args) == ("posttrain pipeline --quick --no-controls --anchor-control --config 'my recipe.yaml' seed=2 "
                                    "'rl_overrides=[a=1, b=2]'")


def _records(path, rows: dict[str, list[float]]) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"env": env, "task_id": f"t{i}", "reward": r}) + "\n"
                            for env, rs in rows.items() for i, r in enumerate(rs)))


def test_validation_gains_per_domain_and_pooled_over_every_task(tmp_path):
    from posttrain.experiments.pipeline_report import validation_gains

    # two domains whose task ids collide ("t0", "t1"): pooling must keep them apart
    _records(tmp_path / "validation" / "step_000000.jsonl", {"arithmetic": [0, 1], "mcq": [0, 0]})
    _records(tmp_path / "validation" / "step_000004.jsonl", {"arithmetic": [1, 1], "mcq": [1, 0]})
    g = validation_gains(tmp_path, 4)
    assert (g["arithmetic"]["gain"], g["mcq"]["gain"]) == (0.5, 0.5)
    # pooled differences 1, 0, 1, 0: mean 0.5, sample sd sqrt(1/3), se sqrt(1/3)/2
    assert (g["all"]["n"], g["all"]["gain"], g["all"]["gained"]) == (4, 0.5, 2)
    assert g["all"]["se"] == pytest.approx(math.sqrt(1 / 3) / 2)
    # against another model's records on the same tasks (the longer-SFT arm): RL − arm
    _records(tmp_path / "arm.jsonl", {"arithmetic": [1, 1], "mcq": [0, 0]})
    vs = validation_gains(tmp_path, 4, against=tmp_path / "arm.jsonl")
    assert (vs["arithmetic"]["gain"], vs["mcq"]["gain"], vs["all"]["gain"]) == (0.0, 0.5, 0.25)
    assert validation_gains(tmp_path, 0) == {} and validation_gains(tmp_path, 8) == {}  # nothing to pair
    assert "flagged" not in g["all"] and "all without flagged" not in g  # nothing flagged: one pooled figure


def test_a_multiple_choice_domain_answered_with_one_letter_is_flagged_and_stays_in_the_pool(tmp_path):
    """The RLVR stage taught mcq to answer "C" to every question (chance on shuffled options): its
    gain is flagged, and the pooled gain still counts it (no silent exclusion); the pool without it
    is given beside, never instead."""
    from posttrain.experiments.pipeline_report import _star, validation_gains

    def write(path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(tmp_path / "validation" / "step_000000.jsonl",
          [{"env": "arithmetic", "task_id": f"a{i}", "reward": 0.0, "reason": "wrong_answer"} for i in range(4)]
          + [{"env": "mcq", "task_id": f"m{i}", "reward": 0.0, "reason": "no_answer"} for i in range(10)])
    write(tmp_path / "validation" / "step_000002.jsonl",
          [{"env": "arithmetic", "task_id": f"a{i}", "reward": float(i < 2), "reason": "correct"} for i in range(4)]
          + [{"env": "mcq", "task_id": f"m{i}", "reward": float(i < 3),
              "reason": ("correct" if i < 3 else "wrong_answer") + ": chose C"} for i in range(10)])
    g = validation_gains(tmp_path, 2)
    assert g["mcq"]["gain"] == pytest.approx(0.3) and g["mcq"]["one_letter"] == ["C", 1.0]
    assert "one_letter" not in g["arithmetic"]
    assert g["all"]["n"] == 14 and g["all"]["domains"] == ["arithmetic", "mcq"] and g["all"]["flagged"] == ["mcq"]
    assert g["all"]["gain"] == pytest.approx(0.5 / 14 * 4 + 0.3 / 14 * 10)
    without = g["all without flagged"]
    assert without["n"] == 4 and without["domains"] == ["arithmetic"] and without["gain"] == 0.5
    assert "\\*" not in _star(g["mcq"]) and "100% of answers C" in _star(g["mcq"])


def test_rl_mix_is_validated_before_any_work():
    from posttrain.configs.pipeline import PipelineConfig

    assert PipelineConfig(rl_mix={"arithmetic": 2, "mcq": 1}).rl_mix == {"arithmetic": 2.0, "mcq": 1.0}
    with pytest.raises(ValueError, match="no domain with a ratio > 0"):
        PipelineConfig(rl_mix={"mcq": 0.0})
    assert PipelineConfig(rl_mix={"mcq": 0.0}, rlvr=False).rlvr is False  # no RLVR stage: nothing to train
    with pytest.raises(ValueError, match="ratios must be >= 0"):
        PipelineConfig(rl_mix={"arithmetic": 1.0, "mcq": -1.0})
    with pytest.raises(ValueError, match="code"):
        PipelineConfig(rl_mix={"code": 1.0})  # not one of the pipeline's RLVR domains
    with pytest.raises(ValueError, match="rl_min_digits=3 is above max_digits=2"):
        PipelineConfig(rl_min_digits=3)
    with pytest.raises(ValueError, match="rl_phrasings"):
        PipelineConfig(rl_phrasings=["poem"])


def test_the_math_domain_trains_the_families_the_config_names():
    import typing

    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.envs.math_env import FAMILIES
    from posttrain.experiments.pipeline import RL_DOMAINS, rlvr_envs

    field = PipelineConfig.model_fields["rl_math_families"].annotation
    listed = typing.get_args(typing.get_args(typing.get_args(field)[0])[0])
    assert sorted(listed) == sorted(FAMILIES)  # the config's names are the environment's, no more, no fewer
    cfg = PipelineConfig(rl_mix={"arithmetic": 1.0, "math": 1.0}, rl_math_families=["gcd", "lcm"])
    math_env = next(e for e in rlvr_envs(cfg) if e["name"] == "math")
    assert math_env["args"]["families"] == ["gcd", "lcm"]
    default = next(e for e in rlvr_envs(PipelineConfig(rl_mix={"math": 1.0})) if e["name"] == "math")
    assert default["args"] == RL_DOMAINS["math"]
    with pytest.raises(ValueError, match="rl_math_families"):
        PipelineConfig(rl_math_families=["gcd"])  # no math domain in rl_mix to train them
    with pytest.raises(ValueError, match="rl_math_families"):
        PipelineConfig(rl_mix={"math": 1.0}, rl_math_families=[])
    with pytest.raises(ValueError, match="rl_math_families"):
        PipelineConfig(rl_mix={"math": 1.0}, rl_math_families=["calculus"])


def test_arithmetic_asked_in_several_wordings_gets_a_gain_per_wording(tmp_path):
    from posttrain.experiments.pipeline_report import subsets, validation_gains

    ids = ["arith-1+2", "arith-3*4", "arith-words-5-6", "arith-story-7+8", "arith-story-9-1"]
    for step, rewards in ((0, [1, 1, 0, 0, 0]), (4, [1, 0, 1, 1, 1])):
        path = tmp_path / "validation" / f"step_{step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"env": "arithmetic", "task_id": i, "reward": r}) + "\n"
                                for i, r in zip(ids, rewards)))
    g = validation_gains(tmp_path, 4)
    parts = subsets(g)
    assert set(parts) == {"arithmetic · plain", "arithmetic · words", "arithmetic · story"}
    assert (parts["arithmetic · plain"]["n"], parts["arithmetic · plain"]["gain"]) == (2, -0.5)
    assert (parts["arithmetic · story"]["before"], parts["arithmetic · story"]["after"]) == (0.0, 1.0)
    assert g["arithmetic"]["n"] == 5 and "all" not in g  # one domain: nothing to pool
    # one wording only (the SFT data's): no per-wording rows
    _records(tmp_path / "validation" / "step_000008.jsonl", {"arithmetic": [0, 1]})
    _records(tmp_path / "validation" / "step_000000.jsonl", {"arithmetic": [1, 1]})
    assert subsets(validation_gains(tmp_path, 8)) == {}


def test_rlhf_section_rounds_reply_lengths_and_says_when_there_were_none(tmp_path):
    from posttrain.experiments.pipeline import rlhf_report

    rlhf = {"steps": 2, "judge": "runs/x/genrm", "val_tasks": 8, "val_start": {"math": 0.125}, "val_end": {"math": 0.25},
            "reply_tokens_first": 17.444444444444443, "reply_tokens_last": 10.777777777777779}
    text = rlhf_report(tmp_path, {"rlhf": rlhf, "genrm": None})
    assert "first step 17.4, last 10.8" in text and "0.125 →  0.250" in text
    text = rlhf_report(tmp_path, {"rlhf": {**rlhf, "reply_tokens_first": None, "reply_tokens_last": None}, "genrm": None})
    assert "first step nan, last nan" in text
    assert (tmp_path / "rlhf.json").exists()


def test_curation_section_has_paired_gains_with_their_noise():
    from posttrain.experiments.pipeline import curation_gains

    base = _measured([0, 0, 1, 0], [1, 1, 1, 1])
    unfiltered = _measured([0, 1, 1, 0], [1, 1, 1, 1])
    curated = _measured([1, 1, 1, 0], [1, 1, 1, 1])
    lines = curation_gains({"base": base, "unfiltered": unfiltered, "curated": curated})
    assert lines[0].split()[:3] == ["curated", "−", "unfiltered"] and "+25.0% ± 25.0%" in lines[0] and "(+1/-0)" in lines[0]
    assert "+50.0% ± 28.9%" in lines[1] and "(+2/-0)" in lines[1]
    assert curation_gains({"base": {}, "unfiltered": {}, "curated": {}}) == []  # cached before per-problem results


def test_distill_and_rlhf_sections_show_paired_gains_over_their_start(tmp_path):
    from posttrain.experiments.pipeline import paired_lines

    _records(tmp_path / "validation" / "step_000000.jsonl", {"math": [0, 1], "instruction": [0, 0]})
    _records(tmp_path / "validation" / "step_000002.jsonl", {"math": [1, 1], "instruction": [0, 0]})
    lines = paired_lines("step 2 − step 0", tmp_path, 2)
    assert lines[0] == "  step 2 − step 0:"
    assert lines[1].split()[0] == "math" and "+50.0% ± 50.0%" in lines[1] and "(+1/-0)" in lines[1]
    assert lines[3].split()[0] == "all" and "+25.0% ± 25.0%" in lines[3]
    assert paired_lines("step 4 − step 0", tmp_path, 4) == []  # no records at that step: no line


def test_the_rejection_sampling_control_is_the_rlvr_stage_with_the_rft_advantage(tmp_path):
    from posttrain.configs import load_config
    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.configs.rl import RLConfig
    from posttrain.experiments.pipeline import RFT, rl_overrides, rlvr_envs

    with pytest.raises(ValueError, match="rft_arm"):
        PipelineConfig(rft_arm=True, rlvr=False)
    cfg = PipelineConfig(rft_arm=True, rl_overrides=["algo.overlong_filter=false"])
    over = rl_overrides(cfg, tmp_path / "rft", "embedded", cfg.rl_steps, rlvr_envs(cfg), rlvr_stage=True)
    rft_over = rl_overrides(cfg, tmp_path / "rft", "embedded", cfg.rl_steps, rlvr_envs(cfg), rlvr_stage=True, extra=RFT)
    assert rft_over[-1] == "algo.overlong_filter=false"  # the user's overrides still have the last word
    rft = load_config(RLConfig, None, rft_over)
    grpo = load_config(RLConfig, None, over)
    assert (rft.algo.advantage.type, rft.algo.dynamic_filter) == ("rft", False)
    assert grpo.algo.advantage.type == "grpo" and grpo.algo.dynamic_filter
    # everything else is the RLVR stage's: prompts, samples, steps, anchor, lr, the user's overrides
    assert rft.model_dump(exclude={"algo", "run_dir"}) == grpo.model_dump(exclude={"algo", "run_dir"})
    assert rft.algo.sft_anchor == grpo.algo.sft_anchor and not rft.algo.overlong_filter

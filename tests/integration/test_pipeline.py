"""``posttrain pipeline`` end to end on tiny-llama with tiny sizes, ``--distill`` and
``--anchor-control`` included: every stage writes its JSON, the report has the after-RL and
anchor-alone columns, the paired gains, the RL run's (dev) validation and the test table of RL
against its two equal-compute SFT controls, ``report.md`` and the TensorBoard events appear, the distill
table and plot appear, a re-run reuses every stage, the checkpoints load; a Ctrl-C says where it
stopped and how to resume, and the resumed run finishes.

Like tests/integration/test_rl.py, the tiny random model almost never writes ``<|im_end|>``, so
every rollout hits the length limit: ``rl_overrides`` switches the overlong filter off and keeps
the RL batches and replies tiny. Its rewards are all 0, so GRPO drops every group (no update);
MOPD trains anyway (no dynamic filter, dense teacher signal), which is what the last check uses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

from posttrain.commands import pipeline as pipeline_command
from posttrain.experiments import pipeline
from posttrain.configs import load_config

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {
    "model": "tiny-llama", "n_train": 16, "n_eval": 4, "n_val_rows": 4, "sft_steps": 2, "sft_batch_size": 4,
    "max_new_tokens": 8, "eval_batch_size": 4, "eval_samples": 2, "rl_steps": 2, "rl_val_tasks": 2, "rl_test_tasks": 2, "rl_mix_val_tasks": 2, "rl_train_tasks": 4,
    "specialist_steps": 1, "distill_steps": 1, "rl_mix": "{arithmetic: 1.0, mcq: 1.0, instruction: 1.0}", "rl_mix_train_tasks": 4,
    "sft_instruction_rows": 4, "rft_arm": False,  # on by default; the --quick switches test turns it on
    "rl_overrides": "[rollout.prompts_per_step=3, rollout.group_size=2, rollout.max_new_tokens=6, "
                    "algo.overlong_filter=false, optim.lr=1e-3]",
}
STAGES = ["data", "before", "sft", "after", "rlvr", "after_rl", "sft_arm", "after_sft_arm", "tokens_arm", "anchor_control",
          "after_anchor_control", "test_base", "test_sft", "test_rl", "test_sft_arm", "test_tokens_arm",
          "specialist_math", "specialist_instruction", "mopd"]


def _args(run_dir, **flags) -> argparse.Namespace:
    over = [f"{k}={v}" for k, v in {**TINY, "run_dir": run_dir}.items()]
    defaults = {"quick": False, "config": None, "fresh": False, "curation": False, "distill": False, "no_rlvr": False,
                "rlhf": False, "no_controls": False, "anchor_control": False}
    return argparse.Namespace(overrides=over, **{**defaults, **flags})


def test_pipeline_with_rlvr_and_distill_reports_resumes_and_writes_loadable_checkpoints(tmp_path, capsys):
    run_dir = tmp_path / "pipe"
    assert pipeline_command.run(_args(run_dir, distill=True, anchor_control=True)) == 0
    out = capsys.readouterr().out
    assert sorted(p.stem for p in (run_dir / "stages").glob("*.json")) == sorted(STAGES)
    assert "after RL    longer SFT  anchor alone" in out and "RLVR held-out validation reward" in out
    for dom in ("arithmetic", "mcq", "mean"):
        assert f"    {dom}" in out
    assert "RL (after RL − after SFT)" in out and "RL − SFT same time (paired" in out and "± " in out
    assert "RL − SFT same tokens (paired" in out and "test split (greedy, 2 tasks per environment" in out
    assert "instruction graded by IFEval (if-verifiable)" in out  # the second grader on the same answers
    assert json.loads((run_dir / "stages" / "data.json").read_text())["n_instruction"] == 4
    assert "base (SFT)" in out and "MOPD student" in out
    for name in ("report.png", "distill.png", "rl/rewards.png", "mopd/rewards.png", "report.md", "pipeline.yaml"):
        assert (run_dir / name).exists(), name

    rep = json.loads((run_dir / "report.json").read_text())
    rl = rep["rl"]
    assert rep["after_rl"]["model"] == rl["checkpoint"] == str(run_dir / "rl" / "checkpoints" / "step_000002")
    assert set(rl["val_start"]) == set(rl["val_end"]) == {"arithmetic", "mcq", "instruction", "mean"}
    assert rl["trained_domains"] == ["arithmetic", "instruction", "mcq"]
    # "all": every validated task pooled; "arithmetic · <wording>": the arithmetic tasks of each wording
    assert {k for k in rl["val_gains"] if " · " not in k} == {"arithmetic", "mcq", "instruction", "all"}
    assert rl["val_gains"]["all"]["n"] == 3 * TINY["rl_val_tasks"]
    assert len(rep["after"]["per_task"]) == TINY["n_eval"]
    # the same-time control on the headline problems too (the SFT data's own wording): "longer SFT"
    assert set(rep["gains"]) == {"SFT (after SFT − before)", "RL (after RL − after SFT)", "anchor alone − after SFT",
                                 "RL − anchor alone", "longer SFT − after SFT", "RL − longer SFT"}
    assert rep["after_sft_arm"]["model"] == rep["sft_arm"]["checkpoint"]
    assert rep["gains"]["SFT (after SFT − before)"]["accuracy"]["n"] == TINY["n_eval"]
    # sampled accuracy (pass@1 of eval_samples answers) for the checkpoints RL is compared with only
    assert "sampled_accuracy" not in rep["before"] and rep["after"]["sampled_k"] == 2
    assert all(t["sampled"] in (0.0, 0.5, 1.0) for t in rep["after_rl"]["per_task"])
    assert "sampled" not in rep["gains"]["SFT (after SFT − before)"]
    assert rep["gains"]["RL (after RL − after SFT)"]["sampled"]["n"] == TINY["n_eval"]
    arm = rep["sft_arm"]  # continued from the SFT checkpoint for about the RL stage's wall time
    sft_stage = json.loads((run_dir / "stages" / "sft.json").read_text())
    clock = arm["budget_clock"]  # CPU time when both stages recorded it: a shared machine's wall time is not the stage's
    assert clock == "cpu_seconds" and arm["model"] == sft_stage["checkpoint"] and arm["target_seconds"] == rl[clock]
    assert (clock, arm["steps"]) == pipeline.arm_budget(sft_stage, rl)[::2]
    # the same-tokens control: as many SFT target tokens as the RL stage trained (rollouts + anchor rows)
    tok = json.loads((run_dir / "stages" / "tokens_arm.json").read_text())
    from posttrain.experiments import evidence

    assert tok["target_tokens"] == evidence.rl_trained_tokens(run_dir / "rl") > 0
    assert tok["steps"] == evidence.tokens_budget(sft_stage, tok["target_tokens"]) and tok["model"] == sft_stage["checkpoint"]
    # every checkpoint on the test split of the RL stage's environments, paired task by task
    test = rep["test"]
    assert set(test["scores"]) == {"base", "sft", "rl", "sft_arm", "tokens_arm"}
    assert {k for k in test["comparisons"]["RL − SFT same time"] if " · " not in k} == {"arithmetic", "mcq", "instruction", "all"}
    assert test["comparisons"]["RL − SFT same tokens"]["all"]["n"] == 3 * TINY["rl_val_tasks"]
    from posttrain.eval.compare import read_task_rewards
    from posttrain.envs.splits import split_of

    tested = read_task_rewards(run_dir / "test" / "rl.jsonl")
    assert set(tested) == {"arithmetic", "mcq", "instruction"}
    ext = test["external"]  # the instruction answers again, by IFEval's checkers (tasks with a mapped constraint)
    assert set(ext["scores"]) == set(test["scores"]) and all(a["n"] <= 2 for a in ext["agreement"].values())
    num = test["math_verify"]  # the arithmetic answers again, by Math-Verify's own extraction
    assert set(num["scores"]) == set(test["scores"]) and all(a["n"] == 2 for a in num["agreement"].values())
    assert "graded by Math-Verify (math-verify)" in out
    assert all(split_of(i) == "test" for i in tested["mcq"])  # mcq ids are content hashes: their split is the rule's
    # the anchor alone: the RLVR stage's SFT rows without the reward, from the SFT checkpoint
    ctrl = rep["anchor_control"]
    ctrl_cfg = yaml.safe_load((run_dir / "anchor_control" / "config.yaml").read_text())
    assert ctrl["model"] == sft_stage["checkpoint"] and ctrl["steps"] == TINY["rl_steps"] == ctrl_cfg["train"]["steps"]
    assert ctrl_cfg["train"]["batch_size"] == pipeline.PipelineConfig().rl_anchor_rows == ctrl["rows"]
    assert ctrl_cfg["optim"]["lr"] == pipeline.PipelineConfig().rl_lr and ctrl_cfg["train"]["precision"] == "fp32"
    assert ctrl_cfg["optim"]["warmup_steps"] == 0 and ctrl_cfg["optim"]["decay_frac"] == 0
    assert ctrl_cfg["data"]["train"][0]["path"] == str(run_dir / "data" / "train.jsonl")
    assert rep["after_anchor_control"]["model"] == ctrl["checkpoint"] and "sampled" in rep["gains"]["RL − anchor alone"]
    assert "anchor alone: 2 SFT steps of 8 rows" in out
    dist = json.loads((run_dir / "distill.json").read_text())
    assert list(dist["validation"]) == ["base (SFT)", "math_rl", "instruction_rl", "MOPD student"]

    md = (run_dir / "report.md").read_text()
    for text in ("| answer accuracy |", "paired", "## RLVR", "## RL against equal-compute SFT, on test", "## distill",
                 "| RL − SFT same time |", "*SFT same tokens* continues it", "## The reward's share: RL against its anchor alone",
                 "The section *The reward's share* below", "This validation reads the dev split",
                 "[anchor_control/](anchor_control/)", "pools every validated task", "| sampled accuracy (2 samples",
                 "| comparison | sampled accuracy gain ± paired se |",
                 "![report](report.png)", "posttrain rl --config", "posttrain sft --config", "[rl/](rl/)",
                 "tensorboard --logdir", "load avg"):
        assert text in md, text
    for sub in ("sft", "rlvr", "sft_arm", "tokens_arm", "anchor_control", "mopd", "pipeline"):
        assert list((run_dir / "tb" / sub).glob("events.out.tfevents.*")), sub
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb" / "pipeline"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("heldout/accuracy")] == [0, 1, 2, 3, 4]  # before, SFT, RL, longer SFT, anchor alone
    sft_tb = EventAccumulator(str(run_dir / "tb" / "sft"))
    sft_tb.Reload()
    assert "loss" in sft_tb.Tags()["scalars"]

    # each RL run got the pipeline's settings: ratios, the SFT checkpoint as start, the overrides
    sft_ckpt = json.loads((run_dir / "stages" / "sft.json").read_text())["checkpoint"]
    saved = {name: yaml.safe_load((run_dir / name / "config.yaml").read_text())
             for name in ("rl", "specialist_math", "specialist_instruction", "mopd")}
    ratios = {name: {e["name"]: e["ratio"] for e in c["envs"]} for name, c in saved.items()}
    assert ratios["rl"] == {"arithmetic": 1.0, "mcq": 1.0, "instruction": 1.0}
    assert saved["rl"]["rollout"]["reasoning"] and saved["rl"]["optim"]["lr"] == 1e-3  # rl_overrides win
    # the RLVR stage keeps the SFT data in its steps (the SFT anchor): its rows train even though the
    # tiny model's rewards are all equal (every group dropped)
    anchor = saved["rl"]["algo"]["sft_anchor"]
    assert anchor["data"] == str(run_dir / "data" / "train.jsonl") and anchor["coef"] == pipeline.PipelineConfig().rl_sft_anchor
    rl_metrics = [json.loads(x) for x in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert rl_metrics and all(m["anchor_tokens"] > 0 and m["anchor_nll"] > 0 for m in rl_metrics)
    assert rl["anchor"] == {"coef": anchor["coef"], "rows": anchor["rows_per_step"]}
    assert "SFT rows at weight" in md and "part of the stage's gain" in md
    assert all("sft_anchor" not in c["algo"] or not c["algo"]["sft_anchor"]["data"]
               for name, c in saved.items() if name != "rl")  # the distill runs train on their rollouts only
    assert ratios["specialist_math"] == {"math": 1.0, "mcq": 0.0, "instruction": 0.0}
    assert ratios["specialist_instruction"] == {"math": 0.0, "mcq": 0.0, "instruction": 1.0}
    assert ratios["mopd"] == {"math": 1.0, "mcq": 0.0, "instruction": 1.0}
    for name, c in saved.items():
        assert c["model"] == sft_ckpt
        if name != "rl":  # the three-domain runs keep recipes/rlvr_cpu.yaml's sampling
            assert c["rollout"]["temperature"] == 0.7 and not c["rollout"]["reasoning"]
        assert c["rollout"]["group_size"] == 2 and c["algo"]["overlong_filter"] is False  # rl_overrides win
    teachers = {t["name"]: t for t in saved["mopd"]["teachers"]["models"]}
    assert teachers["math_rl"]["model"] == str(run_dir / "specialist_math" / "checkpoints" / "step_000001")
    assert teachers["instruction_rl"]["domains"] == ["instruction"] and saved["mopd"]["algo"]["advantage"]["type"] == "mopd"

    # a re-run reuses every stage and prints the same report
    stamps = {p.name: p.stat().st_mtime_ns for p in (run_dir / "stages").glob("*.json")}
    assert pipeline_command.run(_args(run_dir, distill=True, anchor_control=True)) == 0
    again = capsys.readouterr().out
    assert all(f"{s}: done earlier" in again for s in STAGES)
    assert "after RL" in again and "MOPD student" in again
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (run_dir / "stages").glob("*.json")}

    from transformers import AutoModelForCausalLM

    sft = AutoModelForCausalLM.from_pretrained(sft_ckpt).state_dict()
    AutoModelForCausalLM.from_pretrained(rl["checkpoint"])
    student = AutoModelForCausalLM.from_pretrained(json.loads((run_dir / "stages" / "mopd.json").read_text())
                                                   ["checkpoint"]).state_dict()
    assert any(not torch.equal(sft[k], student[k]) for k in student)  # MOPD moved the SFT model


def test_ctrl_c_says_where_it_stopped_and_the_next_run_resumes(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "pipe"
    real = pipeline.measure
    rl_ckpt = str(run_dir / "rl" / "checkpoints" / "step_000002")

    def interrupted(cfg, model, data, **kw):
        if model == rl_ckpt:
            raise KeyboardInterrupt
        return real(cfg, model, data, **kw)

    monkeypatch.setattr(pipeline, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline_command.run(_args(run_dir, fresh=True))
    err = capsys.readouterr().err
    assert "interrupted during stage after_rl" in err and "data, " in err and "rlvr" in err
    resume = err.split("resume with: ", 1)[1].strip()
    assert resume.startswith("posttrain pipeline ") and "--fresh" not in resume and "sft_steps=2" in resume

    monkeypatch.setattr(pipeline, "measure", real)
    assert pipeline_command.run(_args(run_dir)) == 0  # what the printed command runs
    out = capsys.readouterr().out
    assert all(f"{s}: done earlier" in out for s in ("data", "before", "sft", "after", "rlvr"))
    assert (run_dir / "stages" / "after_rl.json").exists() and "after RL" in out


def test_pipeline_without_rlvr_keeps_the_two_column_report(tmp_path, capsys):
    assert pipeline_command.run(_args(tmp_path / "pipe", no_rlvr=True)) == 0
    out = capsys.readouterr().out
    assert "after SFT" in out and "after RL" not in out and "RLVR" not in out
    assert not (tmp_path / "pipe" / "stages" / "rlvr.json").exists()
    assert json.loads((tmp_path / "pipe" / "report.json").read_text())["rl"] is None


def test_quick_style_run_skips_rl_validation_and_decodes_the_test_table_in_bf16(tmp_path, capsys, monkeypatch):
    """``--quick``'s two switches: ``rl_val_tasks=0`` (the RLVR stage does not validate itself; the
    report says so and the test table still compares it) and ``eval_precision=auto``, which decodes
    the test table greedily in bf16 where the probe says bf16 is faster, and says so."""
    monkeypatch.setenv("POSTTRAIN_PRECISION_PROBE", "fp32=100,bf16=250")
    run_dir = tmp_path / "pipe"
    args = _args(run_dir)
    args.overrides += ["rl_val_tasks=0", "eval_precision=auto", "rl_mix={arithmetic: 1.0}", "rft_arm=true"]
    assert pipeline_command.run(args) == 0
    out = capsys.readouterr().out
    assert "RLVR's own validation: off" in out and "RLVR held-out validation reward" not in out
    assert "held-out problems in fp32, test table in bf16" in out
    assert not (run_dir / "rl" / "validation").exists()
    rep = json.loads((run_dir / "report.json").read_text())
    # the headline stays fp32 (bf16 moved the base model's accuracy); the test table is bf16, every row alike
    assert rep["rl"]["val_start"] == {} and rep["before"]["eval_precision"] == rep["after"]["eval_precision"] == "fp32"
    assert rep["test"]["precision"] == "bf16"
    assert {s["precision"] for s in (json.loads((run_dir / "stages" / f"test_{m}.json").read_text())
                                     for m in ("sft", "rl", "sft_arm", "tokens_arm", "rft_arm"))} == {"bf16"}
    assert rep["test"]["comparisons"]["RL − SFT same time"]["arithmetic"]["n"] == TINY["rl_test_tasks"]
    # the rejection-sampling control: the RLVR stage again, with the rft advantage and no dynamic filter
    rft = yaml.safe_load((run_dir / "rft" / "config.yaml").read_text())
    assert rft["algo"]["advantage"]["type"] == "rft" and rft["algo"]["dynamic_filter"] is False
    assert rft["envs"] == yaml.safe_load((run_dir / "rl" / "config.yaml").read_text())["envs"]
    assert rep["test"]["comparisons"]["RL − RFT same rollouts"]["arithmetic"]["n"] == TINY["rl_test_tasks"]
    # what one constant answer would earn on the arithmetic test tasks, beside each checkpoint's score
    const = rep["test"]["constant_answer"]["arithmetic"]
    assert 0 < const["constant"]["score"] <= 1 and const["constant"]["n"] == TINY["rl_test_tasks"]
    assert {"sft", "rl", "sft_arm", "tokens_arm", "rft_arm"} <= set(const["models"])
    assert "one constant answer" in (run_dir / "report.md").read_text()
    assert "did not validate itself" in (run_dir / "report.md").read_text()


def test_pipeline_recipe_states_the_defaults():
    recipe = Path(__file__).parents[2] / "recipes" / "pipeline.yaml"
    assert load_config(pipeline.PipelineConfig, recipe) == pipeline.PipelineConfig()


def test_pipeline_rlhf_stage_on_the_tiny_model(tmp_path, capsys):
    """``--rlhf`` (off by default): a GenRM run on math pairs, then RLHF with it as the judge from the
    RLVR checkpoint; both checkpoints load. (The tiny judge fails the format: every comparison falls
    back to neutral, which the stage reports.)"""
    run_dir = tmp_path / "pipe"
    args = _args(run_dir, rlhf=True)
    args.overrides += ["genrm_steps=1", "genrm_pairs=4", "rlhf_steps=1",
                       "rlhf_overrides=[judge.max_new_tokens=4, judge.retries=0, rollout.max_new_tokens=6]"]
    assert pipeline_command.run(args) == 0
    out = capsys.readouterr().out
    assert "rlhf: 1 GRPO steps with the GenRM" in out and "GenRM: 1 GRPO steps" in out
    rep = json.loads((run_dir / "rlhf.json").read_text())
    genrm_ckpt = json.loads((run_dir / "stages" / "genrm.json").read_text())["checkpoint"]
    assert rep["rlhf"]["judge"] == genrm_ckpt and rep["rlhf"]["judge_fallback_frac"] == [1.0]
    saved = yaml.safe_load((run_dir / "rlhf" / "config.yaml").read_text())
    assert saved["model"] == json.loads((run_dir / "stages" / "rlvr.json").read_text())["checkpoint"]
    assert saved["judge"]["model"] == genrm_ckpt and saved["length_control"]["enabled"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(genrm_ckpt)
    AutoModelForCausalLM.from_pretrained(rep["rlhf"]["checkpoint"])
    assert not pipeline.PipelineConfig().rlhf  # opt-in


def test_pipeline_pass_rate_curriculum_profiles_inside_the_rl_stage(tmp_path, capsys):
    """``rl_curriculum=gaussian``: the RLVR stage first profiles the SFT checkpoint on the first
    ``rl_profile_tasks`` tasks of each trained pool, the RL run samples through the Gaussian
    curriculum from that file, and the profile's CPU time is inside the stage's, so the same-time
    control's budget holds it."""
    run_dir = tmp_path / "pipe"
    args = _args(run_dir)
    args.overrides += ["rl_curriculum=gaussian", "rl_profile_tasks=2", "rl_profile_k=2"]
    assert pipeline_command.run(args) == 0
    out = capsys.readouterr().out
    assert "pass-rate curriculum over a profile of 2 samples a task" in out
    rl = json.loads((run_dir / "stages" / "rlvr.json").read_text())
    prof = rl["profile"]
    assert prof["k"] == 2 and set(prof["domains"]) == {"arithmetic", "mcq", "instruction"}
    assert all(d["tasks"] == 2 for d in prof["domains"].values())
    assert 0 < prof["cpu_seconds"] <= rl["cpu_seconds"]
    saved = yaml.safe_load((run_dir / "rl" / "config.yaml").read_text())
    assert saved["curriculum"]["kind"] == "gaussian" and saved["curriculum"]["profile"] == prof["path"]
    rows = [json.loads(line) for line in Path(prof["path"]).read_text().splitlines()]
    from posttrain.configs.rl import RLConfig
    from posttrain.serving.build import build_envs

    rl_cfg = load_config(RLConfig, run_dir / "rl" / "config.yaml", [])
    envs = build_envs(rl_cfg.envs)
    for spec in rl_cfg.envs:  # the first tasks of the very pool the run samples from
        pool = [t.id for t in envs[spec.name].tasks("train", spec.train_tasks, spec.task_seed)]
        assert [r["task_id"] for r in rows if r["domain"] == spec.name] == pool[:2]
    arm = json.loads((run_dir / "stages" / "sft_arm.json").read_text())
    assert arm["target_seconds"] == rl["cpu_seconds"]
    assert "Tasks came from the pass-rate curriculum" in (run_dir / "report.md").read_text()


def test_pipeline_refuses_a_profile_larger_than_a_pool():
    with pytest.raises(ValueError, match="rl_profile_tasks=300 is more than the training pool of instruction"):
        pipeline.PipelineConfig(rl_curriculum="gaussian", rl_profile_tasks=300,
                                rl_mix={"arithmetic": 1.0, "instruction": 1.0}, rl_mix_train_tasks=200)

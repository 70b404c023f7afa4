from __future__ import annotations

import pytest

from posttrain.configs import ConfigError, load_config, save_config
from posttrain.configs.sft import SFTConfig


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: tiny-llama\noptim:\n  lr: 0.001\ntrain:\n  steps: 5\n")
    cfg = load_config(SFTConfig, p, ["optim.lr=2e-4", "train.batch_size=3", "data.train=[{path: a.jsonl, weight: 2}]"])
    assert cfg.model == "tiny-llama" and cfg.optim.lr == 2e-4 and cfg.train.steps == 5
    assert cfg.train.batch_size == 3 and cfg.data.train[0].weight == 2
    out = save_config(cfg, tmp_path / "run")
    assert load_config(SFTConfig, out).model_dump() == cfg.model_dump()


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="optim.lrr"):
        load_config(SFTConfig, None, ["optim.lrr=1"])


def test_bad_value_is_named():
    with pytest.raises(ConfigError, match="train.steps"):
        load_config(SFTConfig, None, ["train.steps=-3"])


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(SFTConfig, None, ["novalue"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(SFTConfig, tmp_path / "nope.yaml")


def test_misspelt_plugin_argument_fails_at_load_with_one_line_naming_the_field(tmp_path):
    """A typo inside a plug-in's settings is caught when the config loads, before a run directory
    exists, as one line that names the field (issue: plug-in args were untyped dicts)."""
    from posttrain.configs.distill import DistillConfig
    from posttrain.configs.rl import RLConfig

    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, None, [f"run_dir={run_dir}", "algo.loss={type: pg, clip_hihg: 0.3}"])
    assert "\n" not in str(e.value) and "algo.loss.pg.clip_hihg: unknown field" in str(e.value)
    with pytest.raises(ConfigError, match=r"algo\.advantage\.grpo\.scale_std: unknown field"):
        load_config(RLConfig, None, ["algo.advantage={type: grpo, scale_std: false}"])
    with pytest.raises(ConfigError, match=r"rollout\.engine\.vllm\.gpu_memory_utilization"):
        load_config(RLConfig, None, ["rollout.engine={type: vllm, gpu_memory_utilization: 3}"])
    with pytest.raises(ConfigError, match=r"algo\.loss_terms\.0\.coef"):
        load_config(DistillConfig, None, ["envs=[{name: math}]", "teachers.models=[{name: a, model: m}]",
                                          "teachers.default=a", "teachers.topk=4",
                                          "algo.loss_terms=[{type: topk_kl, coef: -1}]"])
    with pytest.raises(ConfigError, match="'grpo', 'mopd'"):  # an unknown type lists the known ones
        load_config(RLConfig, None, ["algo.advantage=ppo"])
    with pytest.raises(ConfigError, match=r"algo\.loss\.pg\.clip_hihg: unknown field"):  # dotted, as typed on a CLI
        load_config(RLConfig, None, ["algo.loss.clip_hihg=0.3"])
    assert not run_dir.exists()
    cfg = load_config(RLConfig, None, ["algo.loss={type: pg, clip_high: 0.3}", "algo.advantage=grpo"])
    assert cfg.algo.loss.clip_high == 0.3 and cfg.algo.advantage.scale_by_std is True
    # a plug-in's settings without ``type`` keep the field's default plug-in (the stage's own default)
    cfg = load_config(RLConfig, None, ["algo.loss.clip_high=0.3", "rollout.engine.max_prefill_tokens=64"])
    assert cfg.algo.loss.type == "pg" and cfg.algo.loss.clip_high == 0.3 and cfg.rollout.engine.max_prefill_tokens == 64
    d = load_config(DistillConfig, None, ["envs=[{name: math}]", "teachers.models=[{name: a, model: m}]",
                                          "teachers.default=a", "algo.advantage.reward_coef=0.1"])
    assert d.algo.advantage.type == "mopd" and d.algo.advantage.reward_coef == 0.1


def test_retired_spellings_say_the_new_one():
    from posttrain.configs.rl import RLConfig

    with pytest.raises(ConfigError, match=r"algo\.loss_args was folded into algo\.loss; write algo\.loss: \{type: pg"):
        load_config(RLConfig, None, ["algo.loss_args={clip_high: 0.3}"])
    with pytest.raises(ConfigError, match=r"write algo\.advantage: \{type: grpo"):
        load_config(RLConfig, None, ["algo.advantage_args={scale_by_std: false}"])
    with pytest.raises(ConfigError, match=r"write rollout\.engine: \{type: vllm"):
        load_config(RLConfig, None, ["rollout.engine_args={gpu_memory_utilization: 0.3}"])


def test_non_finite_learning_rate_is_rejected():
    with pytest.raises(ConfigError, match="optim.lr: must be a finite number"):
        load_config(SFTConfig, None, ["optim.lr=.inf"])

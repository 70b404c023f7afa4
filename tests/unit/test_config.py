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

"""Config YAML that used to be read silently wrong (issue 12, item 18): keys given twice, and
YAML 1.1 booleans (``on``/``off``/``yes``/``no``) reaching a choice field as ``True``/``False``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posttrain.configs import ConfigError, load_config, save_config
from posttrain.configs.rl import RLConfig
from posttrain.configs.sft import SFTConfig


def test_a_key_given_twice_is_an_error_naming_the_key_and_its_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: tiny-llama\noptim:\n  lr: 0.001\n  warmup_steps: 2\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:5: duplicate key 'lr' \(first given on line 3\)"):
        load_config(SFTConfig, p)
    p.write_text("model: tiny-llama\ntrain:\n  steps: 5\ntrain:\n  steps: 6\n")  # a whole section twice
    with pytest.raises(ConfigError, match=r"c\.yaml:4: duplicate key 'train'"):
        load_config(SFTConfig, p)
    with pytest.raises(ConfigError, match="duplicate key 'path'"):  # inside an override's value too
        load_config(SFTConfig, None, ["data.train=[{path: a.jsonl, path: b.jsonl}]"])


def test_the_same_key_in_different_mappings_and_merge_overrides_are_fine(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: tiny-llama\n"
                 "data:\n  train:\n    - {path: a.jsonl, weight: 1}\n    - {path: b.jsonl, weight: 2}\n"
                 "x: &base {steps: 3, batch_size: 2}\n")
    with pytest.raises(ConfigError, match="x: unknown field"):  # parsed, then the unknown top key is named
        load_config(SFTConfig, p)
    p.write_text("model: tiny-llama\n_base: &base {steps: 3, batch_size: 2}\n"
                 "train:\n  <<: *base\n  steps: 4\n")  # overriding a merged key is YAML's intended use
    with pytest.raises(ConfigError, match="_base: unknown field"):
        load_config(SFTConfig, p)


def test_pack_on_and_off_are_the_choices_not_booleans(tmp_path):
    # before: YAML 1.1 read `on` as True, and the error said "should be 'auto', 'on' or 'off'"
    assert load_config(SFTConfig, None, ["data.pack=on"]).data.pack == "on"
    assert load_config(SFTConfig, None, ["data.pack=off"]).data.pack == "off"
    assert load_config(RLConfig, None, ["train.pack=on"]).train.pack == "on"
    p = tmp_path / "c.yaml"
    p.write_text("data:\n  pack: on\n")
    cfg = load_config(SFTConfig, p)
    assert cfg.data.pack == "on"
    assert load_config(SFTConfig, save_config(cfg, tmp_path / "run")).data.pack == "on"  # round trip
    with pytest.raises(ConfigError, match=r"data\.pack: Input should be 'auto', 'on' or 'off' \(got True\)"):
        load_config(SFTConfig, None, ["data.pack=true"])
    assert load_config(SFTConfig, None, ["lora.enabled=true"]).lora.enabled is True  # true/false stay booleans


def test_pack_on_with_a_hybrid_model_says_why_and_what_to_set():
    from posttrain.models.facts import PackingError, use_packing

    hybrid = SimpleNamespace(config=SimpleNamespace(model_type="nemotron_h"))
    dense = SimpleNamespace(config=SimpleNamespace(model_type="llama"))
    assert use_packing(dense, "on") and use_packing(dense, "auto") and not use_packing(hybrid, "auto")
    assert not use_packing(hybrid, "off")
    with pytest.raises(PackingError, match=r"hybrid \(Mamba\).*cannot be packed.*pack=auto.*pack=off"):
        use_packing(hybrid, "on")

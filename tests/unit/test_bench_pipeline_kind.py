"""bench/pipeline.py's row names what a recorded run ran: its kind (quick or default sizes) and the
settings in which it differs from that kind's current defaults (a probe is not today's command)."""

from __future__ import annotations

import yaml

from tests.script_module import script_module


def test_a_run_is_quick_or_default_and_lists_what_it_changed(tmp_path):
    from posttrain.configs.pipeline import QUICK, PipelineConfig

    with script_module("bench", "pipeline") as bench:
        default = PipelineConfig().model_dump()
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump({**default, "run_dir": "elsewhere", "seed": 2}))
        assert bench.kind(tmp_path / "d") == ("default", {})
        probe = {**default, "sft_steps": 80, "rl_phrasings": ["plain", "story"]}
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump(probe))
        assert bench.kind(tmp_path / "d") == ("default", {"sft_steps": 80, "rl_phrasings": ["plain", "story"]})
        quick = PipelineConfig(**QUICK).model_dump()
        (tmp_path / "d" / "pipeline.yaml").write_text(yaml.safe_dump({**quick, "rl_lr": 3e-5}))
        assert bench.kind(tmp_path / "d") == ("quick", {"rl_lr": 3e-5})

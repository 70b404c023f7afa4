"""A finished pipeline stage frees the checkpoints it no longer needs (experiments/stages.py): the
others of its run, and the reported one's optimizer state; its weights stay."""

from __future__ import annotations

from posttrain.experiments import stages
from posttrain.train.checkpoint import STATE_FILE


def _checkpoint(root, step):
    d = root / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text("w")
    (d / STATE_FILE).write_text("optimizer")
    return d


def test_a_finished_stage_keeps_only_its_reported_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "RUNNING", [])
    run = tmp_path / "sft"
    old, final = _checkpoint(run, 36), _checkpoint(run, 40)
    out = stages.cached_stage(tmp_path, "sft", lambda: {"checkpoint": str(final), "steps": 40})
    assert not old.exists() and (final / "model.safetensors").exists() and not (final / STATE_FILE).exists()
    assert stages.cached_stage(tmp_path, "sft", lambda: 1 / 0) == out  # cached: never runs (or resumes) again


def test_a_result_that_is_not_a_training_checkpoint_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "RUNNING", [])
    other = _checkpoint(tmp_path / "elsewhere", 3)
    stages.cached_stage(tmp_path, "before", lambda: {"checkpoint": "embedded", "accuracy": 0.1})
    stages.release_checkpoints({"checkpoint": str(other.parent)})  # a folder named otherwise: not a step checkpoint
    stages.release_checkpoints({"accuracy": 0.1})
    assert (other / STATE_FILE).exists()

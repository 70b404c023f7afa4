"""The distill stage end to end on tiny models: ``posttrain distill`` runs the RL loop with the
teacher pool as its scorer — two domains, one owned by a teacher checkpoint, the other falling back
to the default teacher — logs the teacher metrics per domain, and writes a checkpoint that loads.

Like tests/integration/test_rl.py, the tiny random student rarely writes ``<|im_end|>``, so the
overlong filter is off (every rollout hits the length limit).
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from posttrain.commands import distill as distill_command
from posttrain.envs.base import ENVIRONMENTS, Environment, Task, VerifyResult, final_answer_text
from posttrain.models.loading import load_model
from posttrain.models.tiny import tiny_dir

pytestmark = pytest.mark.usefixtures("one_thread")


class ShortReplyEnv(Environment):
    """Reward 1 for a reply shorter than 12 characters (the reward is only logged: pure MOPD)."""

    name = "test_mopd_short"
    domain = "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"{self.name}/{split}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Say {i}."}]) for i in range(n or 8)]

    def verify(self, task, messages):
        return VerifyResult(float(len(final_answer_text(messages)) < 12))


class OtherEnv(ShortReplyEnv):
    name = "test_mopd_other"


for _env in (ShortReplyEnv, OtherEnv):
    if _env.name not in ENVIRONMENTS:
        ENVIRONMENTS.register(_env.name)(_env)


def test_distill_run_logs_teacher_metrics_and_writes_a_loadable_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    short_teacher, default_teacher = tiny_dir("tiny-llama", tmp_path, seed=1), tiny_dir("tiny-llama", tmp_path, seed=2)
    over = {
        "model": "tiny-llama", "run_dir": run_dir, "train.steps": 3, "train.eval_every": 0, "train.save_every": 0,
        "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 6,
        "algo.overlong_filter": False, "optim.lr": 1e-3,
        "envs": "[{name: test_mopd_short, train_tasks: 8}, {name: test_mopd_other, train_tasks: 8}]",
        "teachers.models": f"[{{name: short, model: '{short_teacher}', domains: [test_mopd_short]}}, "
                           f"{{name: generalist, model: '{default_teacher}'}}]",
        "teachers.default": "generalist",
    }
    args = argparse.Namespace(config=None, no_progress=True, overrides=[f"{k}={v}" for k, v in over.items()])
    assert distill_command.run(args) == 0
    out = capsys.readouterr().out
    assert "reverse-KL estimate to the teachers" in out and "mopd_gap/test_mopd_other" in out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("mopd_gap", "mopd_gap/test_mopd_short", "mopd_gap/test_mopd_other", "time_teacher_s",
                    "teacher_tokens", "teacher_tokens_per_s", "rollouts_trained", "grad_norm", "reward"):
            assert key in r, key
        assert r["teacher_tokens"] == 4 * r["response_tokens_mean"]  # every sampled token was scored
        assert r["teacher_models_loaded"] == 2 and r["groups_dropped"] == 0  # no dynamic filter in MOPD
        assert abs(r["mopd_gap"]) < 1  # nearly uniform random models: a small, noisy reverse-KL estimate
    saved = yaml_config(run_dir)
    assert saved["algo"]["advantage"]["type"] == "mopd" and saved["teachers"]["default"] == "generalist"
    from transformers import AutoModelForCausalLM

    ckpt = run_dir / "checkpoints" / "step_000003"
    after = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    before = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the student moved toward its teachers


def yaml_config(run_dir):
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())

"""Real kill -9 of ``posttrain rl`` and ``posttrain distill`` processes, then a resume: the resumed
run ends with weights bit-identical to an uninterrupted one (SFT's twin is in test_sft.py).

The process kills itself with SIGKILL right after a step (``POSTTRAIN_FAULT_AFTER_STEP``, the
loop's fault hook): nothing runs after the signal, no handler, no flush. The command runs through
``posttrain.cli.main`` in a fresh interpreter, with one test environment registered first (a
random tiny model needs a reward that varies to produce an update at all).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.models.tiny import tiny_dir

DRIVER = '''
import sys
from posttrain.envs.base import ENVIRONMENTS, Environment, Task, VerifyResult, final_answer_text

@ENVIRONMENTS.register("test_kill9_even")
class EvenLength(Environment):
    name, domain = "test_kill9_even", "test"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"k9/{split}/{seed}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Write about {i}."}]) for i in range(n or 8)]

    def verify(self, task, messages):
        return VerifyResult(float(len(final_answer_text(messages)) % 2 == 0))

from posttrain.cli import main
sys.exit(main(sys.argv[1:]))
'''

COMMON = ["--no-progress", "model=tiny-llama", "train.steps=4", "train.save_every=2", "train.eval_every=0",
          "train.threads=1", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
          "algo.overlong_filter=false", "optim.lr=1e-3", "envs=[{name: test_kill9_even, train_tasks: 8}]"]


def _run(driver: Path, argv: list[str], fault_after: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if fault_after is not None:
        env["POSTTRAIN_FAULT_AFTER_STEP"] = str(fault_after)
    return subprocess.run([sys.executable, str(driver), *argv], env=env, capture_output=True, text=True, timeout=600)


def _kill_and_resume(tmp_path: Path, argv) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    full, killed = tmp_path / "full", tmp_path / "killed"
    r = _run(driver, argv(full))
    assert r.returncode == 0, r.stderr[-2000:]
    r = _run(driver, argv(killed), fault_after=3)
    assert r.returncode == -9, r.stderr[-2000:]  # really died by SIGKILL, after step 3
    assert (killed / "checkpoints" / "step_000002").exists() and not (killed / "checkpoints" / "step_000004").exists()
    r = _run(driver, argv(killed))
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stderr[-2000:]
    a = load_file(str(full / "checkpoints" / "step_000004" / "model.safetensors"))
    b = load_file(str(killed / "checkpoints" / "step_000004" / "model.safetensors"))
    start = load_file(str(killed / "checkpoints" / "step_000002" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # steps 3-4 trained: the comparison means something
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [line for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4  # step 3, logged before the kill, was dropped on resume and redone once


def test_rl_kill9_and_resume_gives_identical_weights(tmp_path):
    _kill_and_resume(tmp_path, lambda run_dir: ["rl", *COMMON, f"run_dir={run_dir}"])


@pytest.mark.parametrize("topk", [0, 2])
def test_distill_kill9_and_resume_gives_identical_weights(tmp_path, topk):
    teacher = tiny_dir("tiny-llama", tmp_path, seed=3)
    terms = "[{type: topk_kl, coef: 0.5}]" if topk else "[]"

    def argv(run_dir: Path) -> list[str]:
        return ["distill", *COMMON, f"run_dir={run_dir}", f"teachers.models=[{{name: t, model: '{teacher}'}}]",
                "teachers.default=t", f"teachers.topk={topk}", f"algo.loss_terms={terms}"]

    _kill_and_resume(tmp_path, argv)

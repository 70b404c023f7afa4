"""Fixtures shared across test modules."""

from __future__ import annotations

import os

import pytest

import posttrain  # noqa: F401  (before torch, as every posttrain program: models/blas.py's MKL shim on AMD CPUs)
import torch

# No test times a matmul: `precision: auto` reads these probe figures (an AVX2-like machine, where
# bf16 is slow, so auto means fp32 as it always did in tests). Subprocesses inherit it. Tests of the
# decision itself inject their own figures; tests that need bf16 set train.precision=bf16.
os.environ.setdefault("POSTTRAIN_PRECISION_PROBE", "fp32=100,bf16=1")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny-model matmuls gain nothing from a second thread and lose a lot on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def pg_backward():
    """One RL update's backward pass outside the loop: the stage's own row selection, micro-batching
    and loss inputs (``train/rl.py``), accumulated into ``.grad``; returns the loss metrics
    (token-weighted means) and ``rollouts_trained``."""
    from posttrain.train.rl import rl_loss_inputs, rl_micro_batches, trained_rows

    def run(model, rollouts, batch, advantages_BT, loss_fn, skip=True, pack=True, micro_batch_tokens=4096, pad_id=0):
        rows = trained_rows(batch, advantages_BT, skip and not loss_fn.dense)
        sums, weight = {}, 0.0
        for idx in rl_micro_batches(rollouts, rows, micro_batch_tokens, pack):
            x = rl_loss_inputs(model, rollouts, batch, advantages_BT, idx, pack, pad_id)
            out = loss_fn(x)
            out.loss.backward()
            w = float(x.mask_BT.sum())
            for k, v in out.metrics.items():
                sums[k] = sums.get(k, 0.0) + v * w
            weight += w
        return {**{k: v / weight for k, v in sums.items()}, "rollouts_trained": len(rows)}

    return run


@pytest.fixture
def sample_rollouts():
    """Sample and verify as the RL stage does: G rollouts per (env, task) pick, graded by the
    verifier scorer, carrying the rollout config's sampling settings."""
    from posttrain.engines.base import SamplingParams
    from posttrain.episodes.collect import Sampling, collect_rollouts
    from posttrain.scorers.verifier import VerifierReward

    def run(generator, envs, picks, cfg, seed):
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed,
                                reasoning=cfg.reasoning)
        rollouts, _ = collect_rollouts(generator, envs, picks, params, cfg.group_size, cfg.max_turns,
                                       Sampling(cfg.temperature))
        VerifierReward(envs)(rollouts)
        return rollouts

    return run


@pytest.fixture(scope="session")
def ray_session():
    """ONE local Ray instance for the whole test run (``ray.init(num_cpus=2)``; starting one takes
    seconds). Its workers get this checkout on ``PYTHONPATH``, so they import the same ``posttrain``
    and the tests' own environments (``tests.integration.scale_env``)."""
    import os
    from pathlib import Path

    from tests.require import require

    ray = require("ray", "ray")  # a skip outside CI only: make setup installs the extra
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()

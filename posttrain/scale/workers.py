"""The Ray actors of an RL run, one class per role (plain classes; ``controller.py`` wraps them
with ``ray.remote`` and the role's resources from ``scale:``).

* :class:`RolloutWorker` — a copy of the policy behind the run's engine (``rollout.engine``: the
  HF engine here, vLLM where it is installed) and the run's environments (multi-turn episodes call
  their tools here). Before each batch it asks the :class:`WeightStore` for the newest weights and
  loads them if its version is older; every rollout it samples carries that version.
* :class:`VerifierWorker` — the environments' verifiers behind the scorer interface
  (``scorers/verifier.py: VerifierReward``): the sandbox, judges and remote verifiers run here, off
  the trainer.
* :class:`WeightStore` — the newest ``(version, payload)`` of the weight-sync backend.
* :class:`TrainerWorker` — runs the one training loop (``train/rl.py: train_rl``) with a
  :class:`~posttrain.scale.rollouts.RayRollouts` source in place of its own engine. With
  ``scale.trainer.count`` = N > 1 there are N of them, ranks of one torch.distributed group holding
  the model sharded by FSDP2 (``train/sharding.py``): rank 0 runs ``train_rl``, the others
  ``follow_rl`` (their share of each update, and of each gather rank 0 asks for).

A rollout or verifier actor that dies is restarted by Ray and its call retried (``max_restarts``);
a restarted rollout worker reloads the newest weights on its first call, and a step's prompts and
seeds are functions of (seed, step), so the retried call returns the same rollouts: nothing lost.
"""

from __future__ import annotations

import importlib
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLLOUT_FAULT_ENV = "POSTTRAIN_ROLLOUT_FAULT"  # test hook "STEP:MARKER": SIGKILL a rollout worker once


def worker_setup(cfg: Any, threads: int, num_cpus: float) -> None:
    """What every actor does first: import the configured modules, set torch's threads."""
    import torch

    for name in cfg.scale.worker_imports:
        importlib.import_module(name)
    torch.set_num_threads(threads or max(1, math.floor(num_cpus)))


@dataclass
class Roles:
    """Handles of a run's actors (picklable: the trainer actor gets them)."""

    rollout: list[Any]
    verifier: list[Any]
    store: Any


class WeightStore:
    def __init__(self) -> None:
        self.version, self.payload = -1, None

    def set(self, version: int, payload: Any) -> None:
        self.version, self.payload = version, payload

    def latest(self) -> tuple[int, Any]:
        return self.version, self.payload


class RolloutWorker:
    def __init__(self, cfg: Any, store: str, rank: int = 0, fault: str | None = None) -> None:
        """``store``: the weight store's actor name (a name, not a handle: Ray can restart an actor
        only while its constructor's arguments are alive, and a handle argument lives in the object
        store)."""
        import ray

        from posttrain.engines.registry import make_engine
        from posttrain.serving.build import build_envs
        from posttrain.models.loading import load_model
        from posttrain.scale.weight_sync import make_sync

        role = cfg.scale.rollout
        worker_setup(cfg, role.threads, role.num_cpus)
        self.cfg, self.store, self.rank, self.fault = cfg, ray.get_actor(store), rank, fault
        loaded = load_model(cfg.model, seed=cfg.train.seed)  # the architecture; weights come from the store
        loaded.model.config.use_cache = False  # as the trainer's copy (train/loop.py: setup)
        loaded.model.eval()
        self.generator = make_engine(cfg.rollout.engine, loaded.model, loaded.tokenizer,
                                     batch_size=cfg.rollout.batch_size)
        self.envs = build_envs(cfg.envs)
        self.sync = make_sync(cfg.scale.weight_sync, cfg.run_dir)
        self.version = -1

    def pid(self) -> int:
        return os.getpid()

    def _newest_weights(self) -> float:
        import ray

        t0 = time.perf_counter()
        version, payload = ray.get(self.store.latest.remote())
        if version < 0:
            raise RuntimeError("no weights published yet: the trainer publishes before the first batch")
        if version != self.version:
            self.sync.load(payload, self.generator)
            self.version = version
        return time.perf_counter() - t0

    def sample(self, picks: list[tuple[str, Any]], seed: int, step: int, group_offset: int
               ) -> tuple[list[Any], dict[str, float]]:
        """G rollouts per pick from the newest weights (not yet rewarded)."""
        from posttrain.engines.base import SamplingParams
        from posttrain.episodes.collect import Sampling, collect_rollouts

        t_weights = self._newest_weights()
        self._maybe_die(step)
        r = self.cfg.rollout
        params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=seed,
                                reasoning=r.reasoning)
        rollouts, t_gen = collect_rollouts(self.generator, self.envs, picks, params, r.group_size, r.max_turns,
                                           Sampling(r.temperature, params.top_p, r.engine.type, self.version),
                                           group_offset)
        return rollouts, {"time_generate_s": t_gen, "time_weights_s": t_weights}

    def generate_ids(self, prompt_ids: list[list[int]], params: Any, seeds: list[int]) -> list[list[Any]]:
        """The engine's ``generate_ids`` on the newest weights (validation, re-profiling)."""
        self._newest_weights()
        return self.generator.generate_ids(prompt_ids, params, seeds=seeds)

    def _maybe_die(self, step: int) -> None:
        """Test hook: SIGKILL this process the first time it samples step STEP (MARKER records it)."""
        if not self.fault:
            return
        at, marker = self.fault.split(":", 1)
        if int(at) == step and self.rank == 0 and not Path(marker).exists():
            Path(marker).write_text(f"rollout worker {os.getpid()} killed at step {step}\n")
            os.kill(os.getpid(), signal.SIGKILL)

    # vLLM's weight-transfer control plane (weight_sync nccl): UNTESTED here (no GPU)
    def weight_transfer(self, method: str, arg: Any = None) -> None:
        llm = getattr(self.generator, "llm", None)
        if llm is None:
            raise RuntimeError("weight_sync nccl needs rollout.engine: vllm")
        llm.collective_rpc(method, args=() if arg is None else (arg,))

    def engine_ranks(self) -> int:
        """vLLM worker processes behind this actor (its tensor-parallel size)."""
        return int(self.cfg.rollout.engine.llm_args.get("tensor_parallel_size", 1))


class VerifierWorker:
    def __init__(self, cfg: Any) -> None:
        from posttrain.serving.build import build_envs
        from posttrain.scorers.verifier import VerifierReward

        role = cfg.scale.verifier
        worker_setup(cfg, role.threads, role.num_cpus)
        self.scorer = VerifierReward(build_envs(cfg.envs))

    def score(self, sampled: tuple[list[Any], dict[str, float]]) -> tuple[list[Any], dict[str, float]]:
        """Reward and reason on each rollout (``sampled``: a rollout worker's result, resolved by Ray)."""
        rollouts, m = sampled
        return rollouts, {**m, **self.scorer(rollouts)}


class TrainerWorker:
    def __init__(self, cfg: Any) -> None:
        role = cfg.scale.trainer
        worker_setup(cfg, role.threads, role.num_cpus)

    def address(self) -> tuple[str, int]:
        """Where rank 0 of a sharded trainer listens: this node's address and a free port."""
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def run(self, cfg: Any, roles: Roles, progress: bool, stop_after: int | None, rank: int = 0,
            address: tuple[str, int] | None = None) -> Any:
        from posttrain.scale.rollouts import RayRollouts
        from posttrain.scale.weight_sync import make_sync
        from posttrain.train import sharding
        from posttrain.train.rl import follow_rl, train_rl

        tr = cfg.scale.trainer
        if tr.count > 1:
            assert address is not None
            sharding.init(rank, tr.count, tr.resolved_backend(), *address, timeout_s=tr.timeout_s)
        finished = False
        try:
            if rank == 0:
                result = train_rl(cfg, progress=progress, stop_after=stop_after,
                                  source=lambda t, plan: RayRollouts(cfg, roles, t, plan))
            else:
                follow_rl(cfg, publish=make_sync(cfg.scale.weight_sync, cfg.run_dir).publish)
                result = None
            finished = True
            return result
        finally:
            sharding.close(barrier=finished)  # after an error a peer may be gone: no barrier

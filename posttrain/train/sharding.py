"""A sharded trainer: N ranks of one torch.distributed group, the model sharded with FSDP2.

``scale.trainer.count = N > 1`` (``configs/scale.py``) runs N trainer processes (Ray actors,
``scale/workers.py``) that hold one model between them: :func:`shard_model` wraps every decoder
layer with torch's own ``fully_shard`` and then the root, so each rank keeps 1/N of every
parameter, its gradient and its AdamW moments (the optimizer is built on the sharded parameters, so
its states are sharded too). A forward all-gathers one layer at a time; a backward reduce-scatters
its gradients. Torch's API, not accelerate's: the wrapping is a few lines, and accelerate would add
a launcher and a config file for nothing the loop needs. Dense models without LoRA only (MoE: the
expert-bias update would need the ranks' expert loads summed first; not done).

Who does what. Rank 0 is the trainer of a one-process run, unchanged: it samples (through the
rollout source), scores, logs, validates and writes checkpoints. The other ranks run
``train/loop.py: follow`` — they receive from rank 0 what takes all of them (:func:`send`):

* ``("update", micro, lr, inputs)`` — the step's micro-batches; rank r runs ``micro[r::N]``
  (:func:`share`); ``inputs`` turns a micro-batch into loss inputs (the RL stage's step data);
* ``("state", with_optimizer)`` — a full state dict is being gathered (a checkpoint, the best model);
* ``("publish", version)`` — the weight sync's gather (every rank takes part; rank 0 pushes);
* ``("stop",)``.

The gradient of the whole batch. The losses divide by the step's token count (``num_tokens``,
counted over the whole batch by rank 0 before the split), so the sum over ranks of each rank's
gradient is the one-process gradient; FSDP2 averages over ranks by default, so the divide factor is
set to 1 (a sum; ``force_sum_reduction`` because gloo has no pre-multiplied sum). A rank whose share
is short of micro-batches runs a pass with zero weight, so every rank runs the same collectives.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

_CURRENT: "Ranks | None" = None


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    device: str  # cpu (gloo) or cuda (nccl)

    @property
    def main(self) -> bool:
        return self.rank == 0


def current() -> Ranks | None:
    """This process's place in a sharded trainer; None in a one-process run."""
    return _CURRENT


def init(rank: int, world: int, backend: str, address: str, port: int, timeout_s: float) -> Ranks:
    """Join the trainer's process group (every rank calls it with rank 0's address and port)."""
    import datetime

    import torch
    import torch.distributed as dist

    from posttrain.errors import UserError

    global _CURRENT
    if backend == "nccl" and not torch.cuda.is_available():
        raise UserError("scale.trainer.backend: nccl needs a CUDA GPU in every trainer actor, and this one has "
                        "none; on CPUs use backend: gloo")
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(0)  # Ray shows each actor its own GPU as device 0
    _CURRENT = Ranks(rank, world, device)
    return _CURRENT


def close(barrier: bool = True) -> None:
    """Leave the group. ``barrier``: wait for every rank first, so that no rank tears its gloo pairs
    down while another still reads from them (a CI run failed so: one rank left the last gather
    early and the other's read saw its peer gone). Pass False on an error path, where a peer may be
    dead and a barrier would only wait out the group's timeout."""
    global _CURRENT
    import torch.distributed as dist

    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
    _CURRENT = None


def shard_model(model: Any, ranks: Ranks) -> Any:
    """FSDP2 over the ranks: each decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from posttrain.errors import UserError
    from posttrain.models.moe import find_routers

    kind = "MoE routers" if find_routers(model) else "LoRA" if hasattr(model, "peft_config") else None
    if kind:  # MoE: the expert-bias updates would need the ranks' expert loads summed first
        raise UserError(f"scale.trainer.count > 1 shards dense models without LoRA; this run has {kind}: "
                        "use trainer.count=1")
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise UserError(f"scale.trainer.count > 1: {type(model).__name__} has no decoder layers at model.layers "
                        "to shard; use trainer.count=1")
    mesh = init_device_mesh(ranks.device, (ranks.world,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():  # sum the ranks' gradients (the losses already divide by the whole step)
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def interleave(shares: list[list[Any]]) -> list[Any]:
    """One list from each rank's micro-batches, so that rank r's are ``out[r::N]`` (:func:`share`);
    a share short of the longest is padded with None (a pass with zero weight)."""
    n = max((len(s) for s in shares), default=0)
    return [s[i] if i < len(s) else None for i in range(n) for s in shares]


def share(micro: list[Any], ranks: Ranks | None) -> list[Any]:
    """This rank's micro-batches: every N-th, padded with None to the same count on every rank."""
    if ranks is None:
        return micro
    mine = micro[ranks.rank:: ranks.world]
    return mine + [None] * (math.ceil(len(micro) / ranks.world) - len(mine))


def send(msg: Any) -> Any:
    """Rank 0: ``msg`` to every rank; the others: pass None, get rank 0's ``msg``."""
    import torch.distributed as dist

    box = [msg]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Per-key sums over the ranks; a key some rank lacks counts 0 there (a rank whose share of the
    step held only RL's supervised anchor rows reports none of the policy-gradient metrics)."""
    import torch
    import torch.distributed as dist

    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(values))
    keys = sorted(set().union(*names))
    t = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64, device=_CURRENT.device if _CURRENT else "cpu")
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def full_state(model: Any, opt: Any = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Collective (every rank calls it): the full model state dict (HF names) and, with ``opt``, the
    full optimizer state dict (keyed by parameter name), as CPU tensors on rank 0; None elsewhere."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=opts)
    optim = get_optimizer_state_dict(model, opt, options=opts) if opt is not None else None
    if _CURRENT is not None and not _CURRENT.main:
        return None, None
    return weights, optim


def ask_full_state(model: Any, opt: Any = None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Rank 0: have every rank gather the full state with it (checkpoints, the best model)."""
    send(("state", opt is not None))
    return full_state(model, opt)


def load_optimizer(model: Any, opt: Any, state: dict[str, Any]) -> None:
    """Collective: rank 0's full optimizer state (from a checkpoint) into every rank's shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True,
                                                                         broadcast_from_rank0=True))


def local_bytes(tensors: Any) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard)."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total

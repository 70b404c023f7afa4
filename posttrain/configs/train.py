"""Settings every training stage shares: optimizer and schedule, LoRA, MoE balancing, the loop."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from posttrain.configs.base import StrictModel


class OptimConfig(StrictModel):
    lr: float = Field(5e-5, gt=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    weight_decay: float = Field(0.1, ge=0)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(10, ge=0)
    decay_frac: float = Field(0.2, ge=0, le=1)
    """Fraction of the run spent in the linear decay phase of WSD."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)

    @field_validator("lr", "weight_decay", "eps", "grad_clip")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class LoRAConfig(StrictModel):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class MoEConfig(StrictModel):
    lb_coef: float = Field(1e-4, ge=0)
    """Sequence-level load-balancing loss coefficient (NemotronH only)."""
    bias_update_rate: float = Field(1e-3, ge=0)
    """Aux-loss-free expert-bias update rate (NemotronH only)."""


def refuse_bf16_master(precision: str, stage: str, why: str) -> str:
    """``precision`` unless it is ``bf16_master`` in a stage whose numerics need fp32 weights."""
    if precision == "bf16_master":
        raise ValueError(f"bf16_master trains bf16 weights; the {stage} stage needs fp32 weights for {why} "
                         "(models/precision.py): use auto, bf16 or fp32")
    return precision


class LoopConfig(StrictModel):
    """What the training loop itself needs (``train/loop.py``); each stage's ``train`` section."""

    steps: int = Field(100, ge=1)
    seed: int = 0
    precision: Literal["auto", "bf16", "bf16_master", "fp32"] = "auto"
    """What the training forward and backward compute in (``models/precision.py``).
    ``fp32``: fp32 weights and compute. ``bf16``: fp32 weights, bf16 autocast (the matmuls in bf16,
    norms, activations and the loss in fp32). ``bf16_master`` (SFT-kind stages only: sft,
    distill-logits): bf16 weights, so forward and backward run in bf16 throughout, with an fp32
    master copy of every weight that clipping and AdamW work on; checkpoints are saved from the
    fp32 masters (``train/master_weights.py``). Refused with LoRA, hybrid (Mamba) and MoE models, and
    in the RL and DPO stages. ``auto``: bf16 autocast where the machine's probe says bf16 is faster
    (else fp32), and in the SFT stage on a CPU ``bf16_master`` instead of autocast wherever it is
    allowed (no LoRA, not hybrid, not MoE): whole SFT runs, three seeds side by side, 1.10x
    autocast's tokens/s at the same held-out loss (bench/sft_masters.py, docs/benchmarks.md)."""
    freeze_layers: int = Field(0, ge=0)
    """Train only the top of the network: the token embeddings (and an output head tied to them)
    and the first N decoder blocks get no gradient and no optimizer state, and backward stops at
    block N (``models/facts.py: freeze_bottom``). 0 trains every weight."""
    save_every: int = Field(50, ge=0)
    """Checkpoint every N steps (the last step is always saved)."""
    keep_last: int = Field(2, ge=0)
    log_every: int = Field(1, ge=1)
    """Write a metrics line every N steps (and at the last)."""
    threads: int = Field(0, ge=0)
    """torch CPU threads (0: the process default; from the CLI, one per idle core at start with
    ``OMP_WAIT_POLICY=PASSIVE``, unless ``OMP_NUM_THREADS`` is set: ``models/threads.py``)."""
    tensorboard: bool = False
    wandb_project: str | None = None

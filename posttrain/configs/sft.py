"""The SFT stage's config (``posttrain sft``; the stage is ``train/sft.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.train import LoopConfig, LoRAConfig, MoEConfig, OptimConfig


class DatasetSpec(StrictModel):
    path: str
    """Conversation JSONL file."""
    weight: float = Field(1.0, gt=0)
    """Relative sampling weight: a dataset with weight 2 is drawn twice as often per example."""


class SFTDataConfig(StrictModel):
    train: list[DatasetSpec] = Field(default_factory=list)
    validation: list[str] = Field(default_factory=list)
    """Held-out JSONL files; if empty, ``val_frac`` of the training rows are held out."""
    val_frac: float = Field(0.05, ge=0, lt=1)
    split_seed: int | None = None
    """Seed of the ``val_frac`` hold-out (the rows are shuffled by it before the cut). None: the
    training seed, as before. Set it to keep the same held-out rows while ``train.seed`` varies the
    batch order, so that seeds are compared on one held-out set (bench/prune.py's seeds)."""
    max_seq_len: int = Field(512, ge=16)
    """Packed row length. Longer rows waste attention FLOPs on the block mask: 512 measured fastest on CPU."""
    pack: Literal["auto", "on", "off"] = "auto"
    """auto: pack attention-only models, pad hybrid (Mamba) ones — see data/packing.py."""
    on_error: Literal["raise", "skip"] = "raise"
    reasoning_off_frac: float = Field(0.10, ge=0, le=1)
    budget_frac: float = Field(0.03, ge=0, le=1)


class SFTTrainConfig(LoopConfig):
    batch_size: int = Field(16, ge=1)
    """Conversations per optimizer step (packed rows are the gradient-accumulation micro-batches)."""
    eval_every: int = Field(0, ge=0)
    """Held-out loss every N steps (0: only at start and end)."""


class SFTConfig(StrictModel):
    model: str = "embedded"
    """Model spec: embedded, tiny-llama, tiny-nemotronh, or an HF directory / checkpoint."""
    run_dir: str = "runs/sft"
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    moe: MoEConfig = Field(default_factory=MoEConfig)
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig)

    @model_validator(mode="after")
    def _one_way_to_choose_weights(self) -> "SFTConfig":
        if self.lora.enabled and self.train.freeze_layers:
            raise ValueError("lora.enabled and train.freeze_layers both choose which weights train: set one "
                             f"(got lora.enabled=true, train.freeze_layers={self.train.freeze_layers})")
        if self.lora.enabled and self.train.precision == "bf16_master":  # train/master_weights.py
            raise ValueError("train.precision=bf16_master does not train LoRA adapters (the frozen base would be "
                             "merged and saved from bf16): use precision auto, bf16 or fp32 with lora.enabled")
        return self

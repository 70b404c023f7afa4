"""The DPO stage's config (``posttrain dpo``; the stage is ``train/dpo.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.plugins import DPOLossConfig
from posttrain.configs.train import LoopConfig, MoEConfig, OptimConfig, refuse_bf16_master


class DPODataConfig(StrictModel):
    train: str | None = None
    """Pairs JSONL: one ``{"prompt": str | "messages": [...], "chosen": ..., "rejected": ..., "tools": [...]}``
    per line (chosen / rejected: a string or an assistant message, e.g. with ``tool_calls``)."""
    validation: str | None = None
    """Held-out pairs JSONL; if None, ``val_frac`` of the training pairs are held out."""
    val_frac: float = Field(0.1, ge=0, lt=1)
    max_seq_len: int = Field(1024, ge=16)
    """A pair whose prompt + reply is longer than this is dropped (counted when the data loads)."""


class DPOTrainConfig(LoopConfig):
    steps: int = Field(50, ge=1)
    batch_size: int = Field(16, ge=1)
    """Pairs per optimizer step (the recipe: 128)."""
    micro_batch_pairs: int = Field(4, ge=1)
    """Pairs per forward/backward (gradient accumulation over the step's pairs)."""
    pack: Literal["auto", "on", "off"] = "auto"
    eval_every: int = Field(0, ge=0)
    """Held-out metrics every N steps (0: at the start and the end only)."""
    save_every: int = Field(10, ge=0)

    @field_validator("precision")
    @classmethod
    def _fp32_weights(cls, v: str) -> str:
        return refuse_bf16_master(v, "dpo", "its summed log-prob margins")


class DPOConfig(StrictModel):
    model: str = "embedded"
    """The policy to start from (an SFT checkpoint, typically)."""
    reference: str | None = None
    """The reference model; None: the starting weights (``model``). Its log-probs are computed once
    and cached in ``<run_dir>/reference_logprobs.pt``; a resumed run reads them back."""
    run_dir: str = "runs/dpo"
    data: DPODataConfig = Field(default_factory=DPODataConfig)
    loss: DPOLossConfig = Field(default_factory=DPOLossConfig)
    """``{type: dpo, beta: 0.1, variant: sigmoid | ipo, sft_coef: 0}``."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=3e-6, warmup_steps=0, decay_frac=0.0,
                                                                   weight_decay=0.0))
    """The recipe: LR 3e-6, 50 steps."""
    moe: MoEConfig = Field(default_factory=MoEConfig)
    train: DPOTrainConfig = Field(default_factory=DPOTrainConfig)

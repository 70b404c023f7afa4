"""Autocast for a training stage; *which* precision is decided in ``models/precision.py`` (a cached
matmul probe per machine plus a per-stage numerics rule). Under ``bf16`` the weights, gradient
accumulation and optimizer states stay fp32: autocast only runs the matmuls in bf16. ``fp32`` and
``bf16_master`` need no autocast: under ``bf16_master`` the weights themselves are bf16, with fp32
masters for the optimizer (``train/master_weights.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Literal

from posttrain.models.precision import Decision, Stage, resolve

Precision = Literal["auto", "bf16", "bf16_master", "fp32"]


def resolve_precision(precision: Precision, device: str, stage: Stage = "sft") -> str:
    return resolve(precision, stage, device).precision


def decide_precision(precision: Precision, device: str, stage: Stage, masters_ok: bool = False,
                     model_spec: str | None = None) -> Decision:
    """What the stage computes in. ``masters_ok`` (the SFT stage without LoRA): where ``auto`` picks
    bf16 autocast on a CPU, it takes ``bf16_master`` instead if the model allows it (not hybrid, not
    MoE: ``master_weights.refusal``). Measured side by side on the embedded model (bench/sft_masters.py,
    docs/benchmarks.md): more tokens/s than autocast at the same held-out loss. An explicit setting
    is kept as it is, and a GPU keeps autocast (not measured there)."""
    decision = resolve(precision, stage, device)
    return masters_where_they_apply(decision, precision, device, masters_ok, model_spec)


def masters_where_they_apply(decision: Decision, precision: str, device: str, masters_ok: bool,
                             model_spec: str | None) -> Decision:
    from posttrain.train.master_weights import refusal

    if not (precision == "auto" and decision.precision == "bf16" and device == "cpu" and masters_ok and model_spec):
        return decision
    if (why := refusal(model_spec)) is not None:
        return replace(decision, reason=f"{decision.reason}; autocast, not bf16 masters: {why}")
    return replace(decision, precision="bf16_master",
                   reason=f"{decision.reason}; bf16 weights with fp32 masters (bench/sft_masters.py)")


def autocast(precision: str, device: str):
    import torch

    if precision == "bf16":
        return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()

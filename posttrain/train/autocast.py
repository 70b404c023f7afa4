"""Autocast for a training stage; *which* precision is decided in ``models/precision.py`` (a cached
matmul probe per machine plus a per-stage numerics rule). Under ``bf16`` the weights, gradient
accumulation and optimizer states stay fp32: autocast only runs the matmuls in bf16. ``fp32`` and
``bf16_master`` need no autocast: under ``bf16_master`` the weights themselves are bf16, with fp32
masters for the optimizer (``train/master_weights.py``).
"""

from __future__ import annotations

import contextlib
from typing import Literal

from posttrain.models.precision import Decision, Stage, resolve

Precision = Literal["auto", "bf16", "bf16_master", "fp32"]


def resolve_precision(precision: Precision, device: str, stage: Stage = "sft") -> str:
    return resolve(precision, stage, device).precision


def decide_precision(precision: Precision, device: str, stage: Stage) -> Decision:
    return resolve(precision, stage, device)


def autocast(precision: str, device: str):
    import torch

    if precision == "bf16":
        return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()

"""Autocast policy: bf16 where the hardware computes it fast, fp32 otherwise.

On CUDA with bf16 support: bf16 autocast. On CPU, bf16 matmuls are only fast with AVX512-BF16 or
AMX; on a plain AVX2 CPU (such as the 2-core CI machine) oneDNN emulates them and bf16 is *slower*
than fp32, so "auto" keeps fp32 there. Weights and optimizer state stay fp32 in every case.
"""

from __future__ import annotations

import contextlib
from typing import Literal

Precision = Literal["auto", "bf16", "fp32"]


def cpu_has_fast_bf16() -> bool:
    import torch

    cap = torch.backends.cpu.get_cpu_capability()  # e.g. "AVX2", "AVX512", "AVX512_BF16", "AMX_BF16"
    return "BF16" in cap or "AMX" in cap


def resolve_precision(precision: Precision, device: str) -> str:
    import torch

    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_fast_bf16() else "fp32"


def autocast(precision: str, device: str):
    import torch

    if precision == "bf16":
        return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()

"""Facts about a loaded model that several stages branch on."""

from __future__ import annotations

from typing import Any, Literal


def is_hybrid(model: Any) -> bool:
    """Models with recurrent (Mamba) layers, which cannot be packed (see data/packing.py): a
    recurrent state would carry from one packed sequence into the next."""
    return "nemotron_h" in getattr(model.config, "model_type", "") or hasattr(model.config, "mamba_num_heads")


def use_packing(model: Any, setting: Literal["auto", "on", "off"]) -> bool:
    """``auto`` packs attention-only models and pads hybrid ones."""
    return {"on": True, "off": False}.get(setting, not is_hybrid(model))

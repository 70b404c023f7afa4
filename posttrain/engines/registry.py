"""Rollout engines by name, so moving RL from the CPU loop to vLLM is a config change.

``rollout.engine`` is a typed config (``configs/plugins.py``: ``{type: hf}``, ``{type: vllm,
gpu_memory_utilization: 0.3, ...}`` or ``{type: vllm-server, ...}``); ``ENGINES[type](config,
model, tokenizer, batch_size)`` builds the ``Generator`` for the policy being trained. Engines that
keep their own copy of the weights (vLLM in process, or a ``vllm serve`` subprocess) implement
``update_weights(model)``; :func:`sync_weights` calls it after every optimizer step. The
in-process ``hf`` engine samples from the live module: nothing to sync.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from pydantic import TypeAdapter

from posttrain.configs.plugins import EngineConfig, HFEngineConfig
from posttrain.registry import Registry

ENGINES: Registry[Callable[..., Any]] = Registry("rollout engine")


@ENGINES.register("hf")
def _hf(cfg: HFEngineConfig, model: Any, tokenizer: Any, batch_size: int) -> Any:
    from posttrain.engines.hf import HFGenerator
    from posttrain.models.precision import resolve

    decision = resolve(cfg.dtype, "sampling", str(next(model.parameters()).device))
    return HFGenerator(model, tokenizer, batch_size=batch_size, max_prefill_tokens=cfg.max_prefill_tokens,
                       dtype=decision.precision, static_cache=cfg.static_cache)


# Engines behind an optional extra register themselves when their module is imported; importing it
# only when asked keeps `vllm` (and its CUDA torch) out of CPU installs.
_OPTIONAL = {"vllm": "posttrain.engines.vllm_engine", "vllm-server": "posttrain.engines.vllm_server"}
_ENGINE_CONFIG: TypeAdapter[Any] = TypeAdapter(EngineConfig)


def make_engine(spec: str | Any, model: Any, tokenizer: Any, batch_size: int = 32) -> Any:
    """An engine from its config (or its ``type`` name with default settings)."""
    cfg = _ENGINE_CONFIG.validate_python(spec)
    if cfg.type in _OPTIONAL and cfg.type not in ENGINES:
        importlib.import_module(_OPTIONAL[cfg.type])
    return ENGINES.get(cfg.type)(cfg, model, tokenizer, batch_size)


def sync_weights(generator: Any, model: Any) -> None:
    """Push the trainer's weights to an engine that holds its own copy (no-op for ``hf``)."""
    update = getattr(generator, "update_weights", None)
    if update is not None:
        update(model)


def engine_for_spec(spec: str, engine: str | Any = "hf", batch_size: int = 32) -> Any:
    """The rollout engine an RL run with ``engine`` would sample with, over the model ``spec`` loads
    (a checkpoint, ``embedded``, a tiny model): the same precision decision, so a pass-rate profile
    samples like the RL stage it is for. An FP8 export keeps its simulated FP8 weights."""
    from posttrain.engines.hf import HFGenerator
    from posttrain.models.loading import load_model
    from posttrain.quant.checkpoint import is_fp8_checkpoint

    if is_fp8_checkpoint(spec):
        return HFGenerator.from_spec(spec, batch_size=batch_size)
    loaded = load_model(spec)
    return make_engine(engine, loaded.model, loaded.tokenizer, batch_size)

"""Rollout engines by name, so moving RL from the CPU loop to vLLM is a config change.

``ENGINES[name](model, tokenizer, **engine_args)`` builds a ``Generator`` for the policy being
trained. Engines that keep their own copy of the weights (vLLM) implement
``update_weights(model)``; :func:`sync_weights` calls it after every optimizer step. The in-process
``hf`` engine samples from the live module, so it has nothing to sync.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from posttrain.registry import Registry

ENGINES: Registry[Callable[..., Any]] = Registry("rollout engine")


@ENGINES.register("hf")
def _hf(model: Any, tokenizer: Any, **kwargs: Any) -> Any:
    from posttrain.engines.hf import HFGenerator

    return HFGenerator(model, tokenizer, **kwargs)


# Engines behind an optional extra register themselves when their module is imported; importing it
# only when asked keeps `vllm` (and its CUDA torch) out of CPU installs.
_OPTIONAL = {"vllm": "posttrain.engines.vllm_engine"}


def make_engine(name: str, model: Any, tokenizer: Any, **kwargs: Any) -> Any:
    if name in _OPTIONAL and name not in ENGINES:
        importlib.import_module(_OPTIONAL[name])
    return ENGINES.get(name)(model, tokenizer, **kwargs)


def sync_weights(generator: Any, model: Any) -> None:
    """Push the trainer's weights to an engine that holds its own copy (no-op for ``hf``)."""
    update = getattr(generator, "update_weights", None)
    if update is not None:
        update(model)

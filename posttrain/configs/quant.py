"""``posttrain quantize``'s config: FP8 (E4M3) post-training quantization (docs/quantization.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.configs.base import StrictModel


class CalibrationConfig(StrictModel):
    source: Literal["sft", "generic"] = "sft"
    """sft: the run's SFT data (the recipe's choice); generic: built-in generic English prose."""
    data: list[str] = Field(default_factory=list)
    """SFT JSONL files; empty: read ``data.train`` from the ``config.yaml`` of the run the model
    checkpoint belongs to (its directory or a parent)."""
    samples: int = Field(1024, ge=1)
    """Calibration texts (the recipe: about 1K)."""
    max_seq_len: int = Field(256, ge=8)
    batch_size: int = Field(8, ge=1)
    seed: int = 0
    scales: str | None = None
    """A file of calibrated scales (safetensors) to reuse: written by the first run that names it
    (with every Linear's input, the experts' inputs and every attention's K/V), read by later runs
    with the same model and calibration settings (another policy, say) instead of calibrating
    again; a run with different settings is refused."""


class PolicyConfig(StrictModel):
    type: Literal["all", "recipe", "patterns", "searched", "none"] = "recipe"
    """all: every quantizable linear in FP8; recipe: the hybrid rule (attention layers and the Mamba
    layer feeding each stay BF16, the rest FP8, KV cache FP8); patterns: ``keep_bf16`` regexes;
    searched: the ``budget`` most sensitive units of a ``ranking`` (a search's JSON) stay BF16;
    none: nothing in FP8 (the BF16 baseline, exported unquantized)."""
    keep_bf16: list[str] = Field(default_factory=list)
    """patterns: regexes (``re.search`` on module names) of modules that stay BF16."""
    ranking: str | None = None
    """searched: the ``sensitivity.json`` written by ``posttrain quantize --search``."""
    budget: int = Field(0, ge=0)
    """searched: how many units (most sensitive first) stay BF16."""
    budget_params: int | Literal["recipe"] | None = None
    """searched, instead of ``budget``: a memory budget, in parameters kept in BF16. Going down
    the ranking, a unit stays BF16 if it still fits (units that do not fit are skipped, smaller
    later ones may still fit). ``recipe``: as many as the recipe's rule keeps in BF16 on this
    model, for a comparison at equal memory."""


class SearchConfig(StrictModel):
    samples: int = Field(16, ge=1)
    """Held-out texts scored per unit (drawn after the calibration ones). The BF16 model's
    log-probs over them are kept in float32: texts × max_seq_len × vocabulary × 4 bytes (16 × 256
    × 49152 × 4 = 0.8 GB for SmolLM2)."""


class QuantConfig(StrictModel):
    model: str = "embedded"
    """Model spec: embedded, tiny-llama, tiny-nemotronh, or an HF directory / checkpoint."""
    out: str = "runs/quant/fp8"
    weights: Literal["channel", "tensor"] = "channel"
    """Weight scale granularity: one scale per output channel (row) or one per tensor."""
    activations: Literal["dynamic", "static", "none"] = "dynamic"
    """dynamic: per-token scales computed at run time; static: one per-tensor scale per layer,
    calibrated (max |x| on the calibration data); none: weight-only."""
    kv_cache: Literal["auto", "on", "off"] = "auto"
    """FP8 KV cache (static per-tensor scales). auto: on for the recipe policy, off otherwise."""
    rest_dtype: Literal["bf16", "fp32"] = "bf16"
    """Storage of everything not in FP8 (embeddings, norms, BF16 layers). The in-process
    simulation rounds those weights the same way, so it matches the export bit for bit."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    threads: int = Field(0, ge=0)
    """torch CPU threads (0: torch's default)."""

"""Configs of compression (``posttrain prune`` and ``posttrain distill-logits``; code in ``compress/``).

Checked before any model loads: an axis that cannot be cut the way asked (heads that do not split
into the KV groups, more channels than the model has) is a one-line error from the pruner that
compares the target with the model's config, also before any weight is read. Distillation checks
its fields here (k ≥ 1, T > 0, a cache needs top-k) and, before any weight loads, that student and
teacher share one tokenizer and one ``vocab_size`` (``compress/distill_logits.py``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.plugins import ForwardKLLossConfig
from posttrain.configs.sft import SFTDataConfig, SFTTrainConfig
from posttrain.configs.train import MoEConfig, OptimConfig


Axis = Literal["mlp_hidden", "heads", "hidden", "layers", "mamba_heads", "experts"]


class PruneTarget(StrictModel):
    """What the smaller model keeps: either a parameter count (the axes come from ``search``) or
    sizes per axis (unset axes are kept whole)."""

    params: float | None = Field(None, gt=0)
    """Total parameters of the pruned model (e.g. 1.0e8); the axes to cut come from ``axes_mix``."""
    axes_mix: list[Axis] = Field(default_factory=lambda: ["mlp_hidden", "layers"])
    """With ``params``: the axes cut, each by the same fraction of its size, until the count fits."""
    mlp_hidden: int | None = Field(None, ge=1)
    """MLP intermediate channels per layer (Llama ``intermediate_size``; NemotronH: every expert's and
    the shared expert's hidden channels scale by the same fraction)."""
    heads: int | None = Field(None, ge=1)
    """Attention (query) heads per layer; must be a multiple of ``kv_heads``."""
    kv_heads: int | None = Field(None, ge=1)
    """KV groups per layer (default: kept, or the largest count that divides ``heads``)."""
    hidden: int | None = Field(None, ge=8)
    """Embedding (residual stream) channels."""
    layers: int | None = Field(None, ge=1)
    """Decoder blocks kept (the least important by the config's top-level ``depth_metric`` go)."""
    mamba_heads: int | None = Field(None, ge=1)
    """NemotronH: Mamba heads per Mamba layer (pruned inside each of its ``n_groups`` groups)."""
    experts: int | None = Field(None, ge=1)
    """NemotronH: routed experts per MoE layer (by routed load × output norm)."""

    @model_validator(mode="after")
    def _one_kind(self) -> "PruneTarget":
        sizes = [self.mlp_hidden, self.heads, self.hidden, self.layers, self.mamba_heads, self.experts]
        if self.params is None and all(s is None for s in sizes):
            raise ValueError("target: give params (a parameter count) or at least one axis size "
                             "(mlp_hidden, heads, hidden, layers, mamba_heads, experts)")
        if self.params is not None and any(s is not None for s in sizes):
            raise ValueError("target: give params or axis sizes, not both")
        if self.kv_heads is not None and self.heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"target.heads={self.heads} is not a multiple of target.kv_heads={self.kv_heads}: "
                             "every KV group needs the same number of query heads")
        return self


class CalibrationConfig(StrictModel):
    path: str
    """Conversation JSONL (any SFT data: ``posttrain make-data`` writes one)."""
    samples: int = Field(64, ge=1)
    """Calibration conversations. Measured (bench/prune_calibration.py, docs/prune.md): 128 rows
    0.013 ± 0.006 nats/token lower dev loss after the cut than 64, 16 rows 0.05 ± 0.06 higher and
    three times as variable between draws; 64 kept."""
    max_seq_len: int = Field(256, ge=16)
    """Rows are cut to this many tokens; each row runs alone (no padding to mask out)."""
    aggregation: Literal["mean", "l2"] = "l2"
    """How per-token activation magnitudes become one score per channel: mean of |a| over tokens, or
    the L2 norm over tokens (Minitron's batch/sequence aggregation). ``l2``: 0.23 ± 0.02 nats/token
    lower dev loss right after the cut than ``mean``, on the MLP-only and the MLP+layers cut of the
    pipeline's SFT model alike (bench/prune_calibration.py, docs/prune.md)."""


class PruneConfig(StrictModel):
    model: str = "embedded"
    """Model to prune: embedded, tiny-llama, tiny-nemotronh or an HF directory."""
    out: str = "runs/prune/model"
    """Where the pruned HF directory (weights, config, tokenizer, chat template) is written."""
    target: PruneTarget
    calibration: CalibrationConfig
    """Required: no calibration set is shipped (``calibration.path=data.jsonl``; ``posttrain make-data``
    writes one). A default here could never validate, and its error named ``path`` without the block."""
    depth_metric: Literal["cosine", "loglik"] = "cosine"
    """Layer importance: 1 − cos(block input, block output) (one pass), or the drop of calibration
    log-likelihood when the block is skipped (one pass per block)."""
    seed: int = 0


class LogitTeacherConfig(StrictModel):
    """The model whose logits the student learns (usually the one that was pruned)."""

    model: str = "embedded"
    """Model spec: an HF directory (e.g. the SFT checkpoint before pruning), embedded or a tiny model."""
    topk: int | None = Field(None, ge=1)
    """None: the KL over the full vocabulary; k: over the teacher's k likeliest tokens per position,
    renormalised (the student's log-probs are its full-vocabulary ones at those ids: docs/prune.md)."""
    cache: str | None = None
    """A file (safetensors): the teacher's top-k log-probs of every training and held-out row are
    computed once, before step 1, written there and read back each step instead of a teacher forward
    pass (needs ``topk``). A cache made for another teacher, other data or another k is refused."""

    @model_validator(mode="after")
    def _cache_needs_topk(self) -> "LogitTeacherConfig":
        if self.cache is not None and self.topk is None:
            raise ValueError("teacher.cache needs teacher.topk (a full-vocabulary cache holds V floats per token)")
        return self


class DistillLogitsTrainConfig(SFTTrainConfig):
    """SFT's loop settings; only what ``eval_every`` measures differs."""

    eval_every: int = Field(0, ge=0)
    """Held-out KL to the teacher every N steps (0: only at start and end)."""


class DistillLogitsConfig(StrictModel):
    """``posttrain distill-logits``: a student learns a teacher's next-token distributions on SFT data."""

    model: str = "runs/prune/model"
    """The student (usually ``posttrain prune``'s output)."""
    run_dir: str = "runs/distill_logits"
    teacher: LogitTeacherConfig = Field(default_factory=LogitTeacherConfig)
    loss: ForwardKLLossConfig = Field(default_factory=ForwardKLLossConfig)
    """Temperature and the weight of cross-entropy on the data, e.g. ``{temperature: 2, ce_weight: 0.1}``."""
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    """SFT-format conversation JSONL, read, split and packed as ``posttrain sft`` does."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    moe: MoEConfig = Field(default_factory=MoEConfig)
    train: DistillLogitsTrainConfig = Field(default_factory=DistillLogitsTrainConfig)


# --------------------------------------------------------------------------- posttrain prune-search


class SearchCandidate(StrictModel):
    """One architecture of the sweep: the axes cut, each by one shared fraction, to ``params``."""

    axes: list[Axis] = Field(min_length=1)
    """Which axes to cut (``target.axes_mix`` of ``posttrain prune``), e.g. ``[mlp_hidden, heads]``."""
    name: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9_.+-]+$")
    """Its row in the table and its directory under ``out/candidates`` (default: the axes joined by +)."""

    @model_validator(mode="after")
    def _distinct_axes(self) -> "SearchCandidate":
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"candidate axes {self.axes} name an axis twice")
        return self

    @property
    def label(self) -> str:
        return self.name or "+".join(self.axes)


def _default_candidates() -> list[SearchCandidate]:
    return [SearchCandidate(axes=a) for a in (["mlp_hidden"], ["mlp_hidden", "heads"], ["hidden"], ["layers"],
                                              ["mlp_hidden", "layers"])]


class SearchDistillConfig(StrictModel):
    """The short distillation every candidate gets from the unpruned model: one budget for all."""

    topk: int | None = Field(None, ge=1)
    """None: KL over the full vocabulary, the teacher run in every step; k: the teacher's top-k,
    computed once into ``out/teacher_top<k>.safetensors`` and read back by every candidate."""
    loss: ForwardKLLossConfig = Field(default_factory=ForwardKLLossConfig)
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    """SFT-format JSONL; its held-out rows (``val_frac`` or ``validation``) are what candidates are scored on."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    moe: MoEConfig = Field(default_factory=MoEConfig)
    train: DistillLogitsTrainConfig = Field(default_factory=lambda: DistillLogitsTrainConfig(steps=20))
    """The budget: ``steps`` x ``batch_size`` conversations per candidate (default 20 steps)."""


class SearchRule(StrictModel):
    """How the winner is picked (``compress/search.py: choose``)."""

    metric: Literal["kl", "nll"] = "kl"
    """kl: held-out KL to the teacher after the distillation budget (nats/token); nll: held-out
    cross-entropy on the data's assistant tokens."""
    tie_tolerance: float = Field(0.01, ge=0)
    """Candidates within this many nats/token of the lowest figure tie; the fewest parameters wins a
    tie, then the faster decode (when measured), then the earlier candidate."""


class PruneSearchConfig(StrictModel):
    """``posttrain prune-search``: candidate architectures at one parameter count, each pruned and
    briefly distilled from the unpruned model, the best kept by a rule stated in numbers."""

    model: str = "embedded"
    """The model pruned, and the teacher every candidate is distilled from (embedded, tiny-llama,
    tiny-nemotronh or an HF directory; tiny models are built with seed 0, as the teacher is)."""
    out: str = "runs/prune_search"
    """Directory: ``candidates/<name>/model`` (pruned) and ``/distill`` (its run), ``search.json``,
    ``search.md`` and ``chosen`` (the winner's distilled weights, a plain HF directory)."""
    params: float = Field(gt=0)
    """Parameters of every candidate (each cuts its axes until it has at most this many)."""
    candidates: list[SearchCandidate] = Field(default_factory=_default_candidates, min_length=1)
    calibration: CalibrationConfig
    """Rows the importance is measured on (once, on the unpruned model, shared by every candidate)."""
    depth_metric: Literal["cosine", "loglik"] = "cosine"
    distill: SearchDistillConfig = Field(default_factory=SearchDistillConfig)
    select: SearchRule = Field(default_factory=SearchRule)
    decode_tokens: int = Field(32, ge=0)
    """Greedy decode speed of each distilled candidate: tokens/s over this many new tokens after one
    held-out prompt, batch 1 (0: not measured; the rule then breaks exact ties by order)."""

    @model_validator(mode="after")
    def _distinct_candidates(self) -> "PruneSearchConfig":
        names = [c.label for c in self.candidates]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"candidates: the name {dup[0]!r} appears twice (give each candidate its own name)")
        axes = [frozenset(c.axes) for c in self.candidates]
        same = [n for n, a in zip(names, axes) if axes.count(a) > 1]
        if same:
            raise ValueError(f"candidates {same[0]!r} and {same[1]!r} cut the same axes: they would be the same model")
        return self

"""The configs of ``posttrain curate`` (``data/curate.py``; docs/curation.md): one run's
settings, its filter stack and its near-duplicate removal. Plain pydantic, no data code: which
filters exist is the filter registry's to say, so ``FilterStack.from_config``
(``data/sft_filters.py``) checks the names this config gives, and the curate command checks them
before any teacher loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_ORDER = ("truncated", "tool_calls", "repetition", "keywords", "length")


class FiltersConfig(BaseModel):
    """Which filters run, in which order, with which settings."""

    model_config = ConfigDict(extra="forbid")
    order: list[str] = Field(default_factory=lambda: list(DEFAULT_ORDER),
                             description="filter names, applied in this order; the first failure drops")
    options: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                               description="filter name → settings, e.g. {'length': {'max_words': 2000}}")


class DedupConfig(BaseModel):
    """MinHash / LSH settings for near-duplicate removal."""

    model_config = ConfigDict(extra="forbid")
    shingle_size: int = Field(3, ge=1, description="words per shingle")
    num_perm: int = Field(128, ge=16, le=1024, description="MinHash permutations (more = finer estimates, slower)")
    seed: int = Field(1, description="MinHash permutation seed (datasketch's default)")
    threshold: float = Field(0.8, gt=0, le=1, description="estimated Jaccard at or above which two answers to one prompt are near-duplicates")
    global_threshold: float = Field(0.8, gt=0, le=1, description="same, for prompt+answer across the dataset")
    global_dedup: bool = Field(True, description="also remove near-duplicates across prompts")


class CurateConfig(BaseModel):
    """Settings of one curation run (what the CLI flags fill in)."""

    model_config = ConfigDict(extra="forbid")
    out: Path = Field(description="output SFT JSONL; the summary goes to <stem>.summary.json beside it")
    k: int = Field(4, ge=1, description="at most this many rows per prompt")
    min_reward: float = Field(1.0, ge=0, le=1, description="a candidate is accepted when its verifier reward is at least this")
    resume: bool = Field(False, description="continue an interrupted run: skip prompts already in the output")
    refresh: bool = Field(False, description="merge a new teacher pool's candidates into an existing output")
    prefer_new: bool = Field(True, description="refresh: among equally rewarded rows, prefer the newer round")
    reasoning_off_frac: float = Field(0.0, ge=0, le=1, description="share of kept rows with reasoning stripped (recipe: 0.10)")
    budget_frac: float = Field(0.0, ge=0, le=1, description="share of kept rows with reasoning truncated (recipe: 0.03)")
    seed: int = Field(0, description="seed of the per-prompt transform draws")
    batch_prompts: int = Field(8, ge=1, description="prompts per generate_fn call")
    filters: FiltersConfig = Field(default_factory=FiltersConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)

    @model_validator(mode="after")
    def _consistent(self) -> "CurateConfig":
        if self.resume and self.refresh:
            raise ValueError("resume and refresh are exclusive (a refresh resumes its own partial output)")
        if self.reasoning_off_frac + self.budget_frac > 1:
            raise ValueError("reasoning_off_frac + budget_frac must be at most 1")
        return self

"""Configs of the RLHF stage (``posttrain rlhf``) and of GenRM training (``posttrain genrm``).

Both are the RL stage (``configs/rl.py``): RLHF swaps the verifier for the GenRM reward scorer
(``judge``, ``length_control``); GenRM training is RL on the ``genrm`` environment. docs/rlhf.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.rl import EnvSpec, RLConfig, RolloutConfig


class JudgeConfig(StrictModel):
    """The GenRM that scores the policy's responses (``envs/genrm/judge.py``)."""

    model: str | None = None
    """Local model spec / HF directory (e.g. ``runs/genrm/best``); default: the embedded model."""
    url: str | None = None
    """OpenAI-compatible server instead: ``http://host:8000/v1`` or ``http://host:8000/v1#model``."""
    max_new_tokens: int = Field(256, ge=1)
    """Per judgement (reasoning + the three verdict lines)."""
    reasoning: bool = False
    """Render the judge's prompt in reasoning-on mode (it thinks in a ``<think>`` block first)."""
    temperature: float = Field(0.0, ge=0)
    """First-pass sampling temperature (0: greedy). A small judge's greedy verdict can be one
    fixed line whatever the responses (docs/results/rlhf_length_control.md): sampling gives the
    group a spread, seeded by the step, so a resumed run judges alike."""
    retries: int = Field(2, ge=0)
    """Re-asks of a judgement that does not parse; then the neutral fallback (3, 3, 3.5), counted."""
    retry_temperature: float = Field(0.7, ge=0)
    batched: bool = True
    """All the step's comparisons in one generate call (False: one call per comparison; benchmarks)."""
    batch_size: int = Field(32, ge=1)
    """Rows a local judge decodes together."""
    verdict: Literal["text", "expected"] = "text"
    """``text``: the numbers the judge wrote. ``expected``: their means under the judge's own token
    distribution at each number (``envs/genrm/judge.py``, 4.; a local judge only): a judge whose
    written verdict is always the same still gives a ring a spread."""

    @model_validator(mode="after")
    def _one_source(self) -> "JudgeConfig":
        if self.model is not None and self.url is not None:
            raise ValueError("judge: give model (local weights) or url (a server), not both")
        if self.verdict == "expected" and self.url is not None:
            raise ValueError("judge.verdict 'expected' reads the judge's token distribution: it needs judge.model "
                             "(local weights), not judge.url")
        return self


class LengthControlConfig(StrictModel):
    """Group-relative length control (``algos/length_control.py``)."""

    enabled: bool = True
    think_coef: float = Field(0.5, ge=0)
    """a: weight of the centred reasoning-length term."""
    answer_coef: float = Field(0.5, ge=0)
    """b: weight of the centred answer-length term."""
    bonus: float = Field(0.5, ge=0)
    """Conciseness bonus to the shortest reasoning / answer that passes the quality gate (0: off)."""
    quantile: float = Field(0.8, ge=0, le=1)
    """Quality gate: the response's base reward must be ≥ this percentile of its group's."""
    unit: Literal["tokens", "chars"] = "tokens"
    """How lengths are counted (the policy's tokenizer, or characters)."""
    empty_answer_credit: bool = False
    """Pay an empty answer as the shortest (the recipe as written). Off by default: with a weak judge
    that paid a policy to answer nothing (docs/results/rlhf_length_control.md)."""
    scale: Literal["fixed", "base_std"] = "fixed"
    """``fixed``: the coefficients as they are (the recipe). ``base_std``: every length term and bonus
    times the group's base-reward standard deviation, so length only breaks the judge's near-ties."""


class RLHFRolloutConfig(RolloutConfig):
    group_size: int = Field(4, ge=2)
    """G: responses per prompt, compared in a ring (G judge calls per prompt)."""


class RLHFConfig(RLConfig):
    run_dir: str = "runs/rlhf"
    rollout: RLHFRolloutConfig = Field(default_factory=RLHFRolloutConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    length_control: LengthControlConfig = Field(default_factory=LengthControlConfig)


def _genrm_envs() -> list[EnvSpec]:
    return [EnvSpec(name="genrm", train_tasks=256, val_tasks=16)]


class GenRMRolloutConfig(RolloutConfig):
    max_new_tokens: int = Field(256, ge=1)
    reasoning: bool = False
    """The judge writes its reasoning as text before the verdict lines by default."""


class GenRMConfig(RLConfig):
    """GRPO on the ``genrm`` environment: the policy is the judge being trained."""

    run_dir: str = "runs/genrm"
    envs: list[EnvSpec] = Field(default_factory=_genrm_envs)
    rollout: GenRMRolloutConfig = Field(default_factory=GenRMRolloutConfig)

    @model_validator(mode="after")
    def _genrm_env(self) -> "GenRMConfig":
        if [e.name for e in self.envs] != ["genrm"]:
            raise ValueError(f"genrm training runs on the genrm environment alone; got envs {[e.name for e in self.envs]}")
        return self

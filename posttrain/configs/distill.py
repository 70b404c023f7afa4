"""The distillation stage's config (``posttrain distill``; the stage is ``distill/stage.py``).

MOPD is the RL stage with a teacher scorer: the same sections as ``configs/rl.py``, plus
``teachers`` (which model scores which environment), and the ``mopd`` advantage by default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from pydantic import Field, model_validator

from posttrain.configs.base import ConfigError, StrictModel
from posttrain.configs.plugins import AdvantageConfig, MOPDAdvantageConfig
from posttrain.configs.rl import AlgoConfig, RLConfig


class TeacherSpec(StrictModel):
    name: str
    """How metrics and the ``default`` field refer to this teacher."""
    model: str | None = None
    """Model spec as ``load_model`` takes it: embedded, tiny-llama, or an HF directory (a run's
    ``best`` or ``checkpoints/step_N``)."""
    url: str | None = None
    """OpenAI-compatible server with prompt log-probs (vLLM): ``http://host:8000/v1`` or
    ``http://host:8000/v1#model-name``."""
    domains: list[str] = Field(default_factory=list)
    """RL environment names whose rollouts this teacher scores."""

    @model_validator(mode="after")
    def _one_source(self) -> "TeacherSpec":
        if (self.model is None) == (self.url is None):
            raise ValueError(f"teacher {self.name!r}: give exactly one of model (local weights) or url (a server)")
        return self

    @property
    def key(self) -> str:
        """Where the weights are: teachers with the same key share one loaded model."""
        if self.url is not None:
            return "url:" + self.url.rstrip("/")
        p = Path(self.model).expanduser()  # type: ignore[arg-type]
        return "model:" + (os.path.realpath(p) if p.exists() else str(self.model))


class TeachersConfig(StrictModel):
    models: list[TeacherSpec] = Field(default_factory=list)
    """The teachers; each domain may be owned by at most one."""
    default: str | None = None
    """Teacher for environments no teacher owns (None: every environment must be owned)."""
    topk: int = Field(0, ge=0)
    """> 0: teachers also give their top-k log-probs at every sampled position, for the top-k KL term
    (``algo.loss_terms: [{type: topk_kl}]``); local teachers only."""

    @model_validator(mode="after")
    def _consistent(self) -> "TeachersConfig":
        names = [t.name for t in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        if self.topk and any(t.url for t in self.models):
            raise ValueError("topk > 0 needs local teachers (model:); url teachers give sampled-token log-probs only")
        if self.default is not None and self.default not in names:
            raise ValueError(f"default teacher {self.default!r} is not one of the teachers {names}")
        owner: dict[str, str] = {}
        for t in self.models:
            for d in t.domains:
                if d in owner:
                    raise ValueError(f"domain {d!r} is owned by two teachers: {owner[d]!r} and {t.name!r}")
                owner[d] = t.name
        return self

    def routes(self) -> dict[str, str]:
        """Domain (environment name) → teacher name, for the owned domains."""
        return {d: t.name for t in self.models for d in t.domains}

    def teacher_for(self, env: str) -> str:
        name = self.routes().get(env, self.default)
        if name is None:
            raise ConfigError(f"no teacher owns environment {env!r} and teachers.default is not set")
        return name

    def check_envs(self, envs: Sequence[str]) -> None:
        """Every environment has a teacher; every owned domain is an environment of the run."""
        if not self.models:
            raise ConfigError("teachers.models is empty: distillation needs at least one teacher")
        unknown = sorted(set(self.routes()) - set(envs))
        if unknown:
            raise ConfigError(f"teachers own domains {unknown} that are not environments of this run ({list(envs)}); "
                              "domains are the names under envs[].name")
        for e in envs:
            self.teacher_for(e)


class DistillAlgoConfig(AlgoConfig):
    advantage: AdvantageConfig = Field(default_factory=MOPDAdvantageConfig)
    """``mopd``: per-token teacher − student log-prob (``{type: mopd, reward_coef: 0.1}`` mixes in GRPO)."""
    dynamic_filter: bool = False
    """Off: groups with equal rewards still carry the teacher's dense signal."""
    overlong_filter: bool = False
    """Off: the filter exists for the reward (a cut rollout's reward says nothing), but the teacher's
    per-token log-probs are as valid on a cut rollout as on a finished one, and the rambling that
    got it cut is what they correct. On, a just-pruned student that runs to ``max_new_tokens`` every
    time trained on nothing (bench/distill_logits_defaults.py's smoke). Turn it on with
    ``reward_coef > 0`` if the reward part matters more."""


class DistillConfig(RLConfig):
    run_dir: str = "runs/distill"
    algo: DistillAlgoConfig = Field(default_factory=DistillAlgoConfig)
    teachers: TeachersConfig = Field(default_factory=TeachersConfig)
    """The teachers and the domains (environment names) each owns."""

    @model_validator(mode="after")
    def _every_env_has_a_teacher(self) -> "DistillConfig":
        self.teachers.check_envs([e.name for e in self.envs])
        if self.rollout.temperature != 1.0 and any(t.url for t in self.teachers.models):
            raise ValueError("url teachers report temperature-1 prompt log-probs; set rollout.temperature=1 "
                             "or serve the teacher locally (teachers.models[].model)")
        has_term = any(t.type == "topk_kl" for t in self.algo.loss_terms)
        if bool(self.teachers.topk) != has_term:
            raise ValueError("the top-k KL needs both teachers.topk > 0 and algo.loss_terms: [{type: topk_kl}] "
                             f"(got topk={self.teachers.topk}, loss_terms={[t.type for t in self.algo.loss_terms]})")
        return self

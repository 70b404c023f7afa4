"""The RL stage's config (``posttrain rl``; the stage is ``train/rl.py``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.configs.base import StrictModel
from posttrain.configs.plugins import (AdvantageConfig, EngineConfig, GRPOAdvantageConfig, HFEngineConfig,
                                       LossConfig, LossTermConfig, PGLossConfig, fill_default_types,
                                       renamed)
from posttrain.configs.scale import ScaleConfig
from posttrain.configs.train import LoopConfig, MoEConfig, OptimConfig, refuse_bf16_master


class EnvSpec(StrictModel):
    name: str
    """Registered environment name (``posttrain envs`` lists them)."""
    ratio: float = Field(1.0, ge=0)
    """Share of each batch's prompts (relative to the other environments' ratios). 0: validated
    but never trained on (how a single-environment run watches the other domains)."""
    url: str | None = None
    """Resource-server URL (``posttrain serve-env``); None runs the environment in process."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments of the in-process environment (e.g. ``{families: [addition]}``)."""
    train_tasks: int = Field(256, ge=1)
    """Size of the training task pool: ``env.tasks("train", train_tasks, task_seed)``."""
    task_seed: int = 0
    """Seed of the pool; a profile must be written with the same ``--n`` and ``--seed``."""
    val_tasks: int = Field(8, ge=0)
    """Validation tasks (greedy, one sample each); 0 leaves the environment out of validation."""
    protocol: Literal["posttrain", "gym"] = "posttrain"
    """What serves ``url``: ``posttrain`` (``posttrain serve-env``) or ``gym`` (any NeMo Gym resource
    server; its tasks are the rows of ``dataset``; docs/env_server.md)."""
    dataset: str | None = None
    """protocol gym: the NeMo Gym dataset (JSONL rows with ``responses_create_params``) to train on."""
    val_dataset: str | None = None
    """protocol gym: the rows validation uses (default: ``dataset``)."""
    domain: str | None = None
    """protocol gym: the domain the environment reports (default: ``gym``)."""

    @model_validator(mode="after")
    def _gym_fields(self) -> "EnvSpec":
        gym_only = [f for f in ("dataset", "val_dataset", "domain") if getattr(self, f) is not None]
        if self.protocol == "gym" and (self.url is None or self.dataset is None):
            raise ValueError("protocol gym needs 'url' (the resource server) and 'dataset' (its JSONL rows)")
        if self.protocol == "posttrain" and gym_only:
            raise ValueError(f"{', '.join(gym_only)}: only for protocol gym")
        return self


class ReprofileConfig(StrictModel):
    """When to re-profile (the paper gives no numbers; docs/rl.md explains these).

    Watched value: ``pass_rate_gain`` = batch pass rate − the profiled pass rate of the batch's
    tasks. Fire when the mean of the last ``window`` steps is less than ``min_delta`` above the mean
    of the ``window`` before, and at least ``max(min_steps, 2·window)`` steps have passed since the
    last profile. Then the live policy profiles the same pools (``k`` samples per task), the
    curriculum is rebuilt from that profile, and its target mean restarts at ``mean_start`` and
    moves to ``mean_end`` over the remaining steps.
    """

    enabled: bool = False
    k: int = Field(4, ge=1)
    """Samples per task when re-profiling."""
    window: int = Field(5, ge=1)
    min_delta: float = 0.02
    min_steps: int = Field(10, ge=0)


class CurriculumConfig(StrictModel):
    kind: Literal["gaussian", "random"] = "gaussian"
    """gaussian needs ``profile``; random (the paper's baseline) samples the pool uniformly."""
    profile: str | None = None
    """Pass-rate profile JSONL from ``posttrain profile``; None means random over the whole pool."""
    mean_start: float = Field(0.8, ge=0, le=1)
    """Target pass rate at the start of training (easy)."""
    mean_end: float = Field(0.2, ge=0, le=1)
    """Target pass rate at the end of training (hard)."""
    std: float = Field(0.15, gt=0)
    """Width of the Gaussian around the target."""
    reprofile: ReprofileConfig = Field(default_factory=ReprofileConfig)
    """Automatic re-profiling when progress plateaus (gaussian curriculum only)."""


class RolloutConfig(StrictModel):
    prompts_per_step: int = Field(8, ge=1)
    """P: tasks per step, split among environments by ratio."""
    group_size: int = Field(4, ge=2)
    """G: rollouts per task; GRPO centres rewards within these."""
    max_new_tokens: int = Field(256, ge=1)
    """Per model turn; a rollout that hits it is overlong."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer divides its logits by the same value."""
    max_turns: int = Field(8, ge=1)
    """Model turns per multi-turn episode."""
    reasoning: bool = True
    """False renders the reasoning-off generation prompt."""
    batch_size: int = Field(32, ge=1)
    """Rows the sampler decodes together."""
    engine: EngineConfig = Field(default_factory=HFEngineConfig)
    """Rollout engine (``engines/registry.py``): ``hf`` (in-process CPU loop over the live weights) or
    ``{type: vllm, gpu_memory_utilization: 0.3, ...}`` (GPU, optional extra; weights pushed after
    every update)."""

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, v: Any) -> Any:
        if isinstance(v, dict) and "engine_args" in v:
            raise renamed("rollout", "engine_args", "engine", "{type: vllm, gpu_memory_utilization: 0.3}")
        return fill_default_types(cls, v)


class SFTAnchorConfig(StrictModel):
    """Supervised rows in every RL step (InstructGPT's PPO-ptx): the loss adds ``coef`` x the token-mean
    cross-entropy of ``rows_per_step`` conversations drawn from ``data``, so what SFT taught is pulled
    back while the reward teaches something else. Off (``data: null``) by default."""

    data: str | None = None
    """JSONL of conversations (the SFT data, e.g. ``runs/pipeline/data/train.jsonl``); None: off."""
    coef: float = Field(1.0, gt=0)
    """Weight of the supervised term against the policy-gradient loss (each a token mean)."""
    rows_per_step: int = Field(8, ge=1)
    """Conversations per step, drawn from ``data`` as a function of (seed, step)."""
    max_seq_len: int = Field(512, ge=16)
    """Packed row length (and per-conversation cut) of the supervised rows."""


class AlgoConfig(StrictModel):
    advantage: AdvantageConfig = Field(default_factory=GRPOAdvantageConfig)
    """Advantage estimator and its settings, e.g. ``{type: grpo, scale_by_std: false}`` (Dr. GRPO)."""
    loss: LossConfig = Field(default_factory=PGLossConfig)
    """The loss and its settings, e.g. ``{type: pg, clip_low: 0.2, clip_high: 0.28, is_mode: token}``."""
    loss_terms: list[LossTermConfig] = Field(default_factory=list)
    """Terms added to the loss per token, e.g. ``[{type: topk_kl, coef: 0.1}]`` (they need a scorer
    that supplies their targets)."""
    overlong_filter: bool = True
    """Drop rollouts cut by the length limit instead of scoring them."""
    dynamic_filter: bool = True
    """Drop groups whose rewards are all equal (zero advantage), and count them."""
    refill_rounds: int = Field(0, ge=0)
    """With the dynamic filter: up to this many extra sampling rounds per step, each replacing the
    dropped groups with fresh tasks of the same environments (DAPO's resampling); 0 trains on the
    short batch."""
    sft_anchor: SFTAnchorConfig = Field(default_factory=SFTAnchorConfig)
    """Supervised rows mixed into every step (PPO-ptx), e.g. ``{data: runs/p/data/train.jsonl, coef: 1}``."""
    skip_zero_advantage: bool = True
    """Leave rollouts with an all-zero advantage out of the forward/backward (same update, less work);
    ignored when a loss term has a gradient everywhere."""

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if "loss_args" in v:
                raise renamed("algo", "loss_args", "loss", "{type: pg, clip_high: 0.28, ...} "
                              "(topk_kl_coef is now algo.loss_terms: [{type: topk_kl, coef: 0.1}])")
            if "advantage_args" in v:
                raise renamed("algo", "advantage_args", "advantage", "{type: grpo, scale_by_std: false}")
        return fill_default_types(cls, v)

    @model_validator(mode="after")
    def _rft_keeps_every_group(self) -> "AlgoConfig":
        if self.advantage.type == "rft" and self.dynamic_filter:
            raise ValueError("algo.advantage rft trains on every passing sample, a group that all passed included; "
                             "the dynamic filter would drop those groups: set algo.dynamic_filter=false")
        return self

    @field_validator("loss")
    @classmethod
    def _no_kl(cls, v: Any) -> Any:
        if getattr(v, "kl_coef", 0):
            raise ValueError("kl_coef > 0 needs a reference model, which the rl stage does not load yet")
        return v


class RLTrainConfig(LoopConfig):
    steps: int = Field(50, ge=1)
    seed: int = 0
    """Seeds task sampling and generation: a resumed run draws the same batches."""
    micro_batch_tokens: int = Field(1024, ge=16)
    """Token budget of one forward/backward (packed row, or rows × longest when padded). Keep it
    short on CPU: sdpa over a packed row computes the whole row × row attention under a block mask,
    so cost and memory grow with the square of the row (a 4096-token row took minutes and ~7 GB on
    the embedded model); on GPU with varlen flash attention, longer rows are fine."""
    pack: Literal["auto", "on", "off"] = "auto"
    """auto: pack attention-only models, pad hybrid (Mamba) ones."""
    eval_every: int = Field(10, ge=0)
    """Validation every N steps, plus before the first and after the last (0: never)."""
    save_every: int = Field(10, ge=0)
    """Checkpoint every N steps (the last step is always saved)."""
    plot: bool = True
    """Write ``rewards.png`` (reward / pass rate over steps) next to metrics.jsonl."""

    @field_validator("precision")
    @classmethod
    def _fp32_weights(cls, v: str) -> str:  # also keeps bf16_master off sharded trainers (only RL shards)
        return refuse_bf16_master(v, "rl", "its on-policy ratios")


class RLConfig(StrictModel):
    model: str = "embedded"
    """Model spec: embedded, tiny-llama, tiny-nemotronh, or an HF directory / checkpoint (e.g. SFT's)."""
    run_dir: str = "runs/rl"
    envs: list[EnvSpec] = Field(default_factory=lambda: [EnvSpec(name="math")])
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-6, warmup_steps=0, decay_frac=0.0,
                                                                   weight_decay=0.0))
    moe: MoEConfig = Field(default_factory=MoEConfig)
    """Only ``bias_update_rate`` is used: routers are frozen in RL (no balance loss)."""
    train: RLTrainConfig = Field(default_factory=RLTrainConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    """Where the roles run: ``{backend: inprocess}`` (default) or ``{backend: ray, ...}`` with
    per-role resources, the weight-sync backend and asynchronous sampling (docs/scale.md)."""

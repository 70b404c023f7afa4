"""Advantage estimators: a scored batch in, one advantage per token out.

Every RL-like stage (RLVR, MOPD, RLHF, GenRM training) ends in the same place: a tensor
``advantages_BT`` that the policy-gradient loss multiplies into the log-probs. What differs is how
the rollouts were scored. So the trainer holds a :class:`ScoredBatch` and an estimator picked by
name from :data:`ADVANTAGES`; it never knows which estimator ran (prime-rl's "algorithm is data").

Estimators (a function ``(batch, settings) -> advantages_BT`` registered under the ``type`` of its
settings model in ``configs/plugins.py``):

* ``grpo`` — group-relative: within the G rollouts of one prompt, ``A = r − mean(r)``, optionally
  divided by ``std(r) + eps``; the rollout's advantage is broadcast to every unmasked token.
* ``rft`` — rejection-sampling fine-tuning: a constant on every token of a rollout whose reward
  reaches a threshold, else 0 (a token mean of supervised learning on the passing samples; the RLVR
  stage's control).
* ``mopd`` — on-policy distillation: ``A_t = log π_teacher(y_t) − log π_student(y_t)`` per token
  (no gradient flows through it: both are observed numbers), plus optionally
  ``reward_coef × grpo`` when the rollout also has a verifier reward.
* RLHF needs no estimator of its own: the GenRM's scores and the length control are computed by a
  reward-phase scorer (``scorers/genrm.py``, maths in ``algos/genrm.py`` and
  ``algos/length_control.py``), and ``grpo`` normalises the resulting rewards within groups.

Departures and choices, with the why:

* The std is the *population* std (divide by G, not G−1): a group of one has std 0 and advantage 0
  instead of NaN, and for a fixed G the two differ by a constant factor the learning rate absorbs.
* A rollout whose ``mask_BT`` row is all zero (overlong-filtered, say) is out of the batch: it does
  not count in its group's mean/std and gets advantage 0. One mechanism (the mask) means filters
  need no side channel to the estimator.

Shape suffixes (see docs/algorithms.md): B rollouts, T token positions, P prompts/groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Protocol

import torch
from pydantic import TypeAdapter

from posttrain.configs.plugins import AdvantageConfig, GRPOAdvantageConfig, MOPDAdvantageConfig, RFTAdvantageConfig
from posttrain.registry import Registry

Tensor = torch.Tensor


@dataclass
class ScoredBatch:
    """Rollouts after scoring, padded to a common length T (right-padded, mask 0 on padding).

    ``mask_BT`` is 1 on completion tokens that may receive loss (never on prompt or padding tokens).
    ``group_ids_B`` says which prompt each rollout answers; GRPO centres rewards within a group.
    """

    rewards_B: Tensor
    group_ids_B: Tensor
    mask_BT: Tensor
    sampler_logprobs_BT: Tensor | None = None  # the student's log-prob of its own sampled token
    teacher_logprobs_BT: Tensor | None = None  # the domain teacher's log-prob of that token
    extras: dict[str, Tensor] = field(default_factory=dict)  # estimator-specific per-rollout data

    def __post_init__(self) -> None:
        if self.mask_BT.dim() != 2:
            raise ValueError(f"mask_BT must be 2-D (B, T), got shape {tuple(self.mask_BT.shape)}")
        B, T = self.mask_BT.shape
        for name in ("rewards_B", "group_ids_B"):
            t = getattr(self, name)
            if tuple(t.shape) != (B,):
                raise ValueError(f"{name} must have shape ({B},) to match mask_BT, got {tuple(t.shape)}")
        for name in ("sampler_logprobs_BT", "teacher_logprobs_BT"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != (B, T):
                raise ValueError(f"{name} must have shape ({B}, {T}) to match mask_BT, got {tuple(t.shape)}")

    @property
    def valid_B(self) -> Tensor:
        """Rollouts that are in the batch: at least one token can receive loss."""
        return self.mask_BT.bool().any(dim=1)


def group_advantages(
    rewards_B: Tensor,
    group_ids_B: Tensor,
    valid_B: Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Per-rollout GRPO advantage: reward minus its group's mean, optionally over (std + eps).

    Only ``valid_B`` rollouts enter the group statistics; invalid ones get 0.
    """
    rewards_B = rewards_B.detach().to(torch.float32)
    valid_B = torch.ones_like(rewards_B, dtype=torch.bool) if valid_B is None else valid_B.bool()
    _, group_B = torch.unique(group_ids_B, return_inverse=True)  # dense 0..P-1 labels
    P = int(group_B.max()) + 1 if group_B.numel() else 0
    w_B = valid_B.to(rewards_B.dtype)

    def per_group_sum(x_B: Tensor) -> Tensor:
        return torch.zeros(P, dtype=x_B.dtype, device=x_B.device).index_add_(0, group_B, x_B)

    count_P = per_group_sum(w_B).clamp(min=1.0)
    mean_P = per_group_sum(rewards_B * w_B) / count_P
    centred_B = rewards_B - mean_P[group_B]
    if scale_by_std:
        var_P = per_group_sum(centred_B.square() * w_B) / count_P
        centred_B = centred_B / (var_P.sqrt()[group_B] + eps)
    return centred_B * w_B


def broadcast_to_tokens(values_B: Tensor, mask_BT: Tensor) -> Tensor:
    """One value per rollout → the same value on each of its unmasked tokens (0 elsewhere)."""
    return values_B[:, None] * mask_BT.to(values_B.dtype)


class AdvantageEstimator(Protocol):
    def __call__(self, batch: ScoredBatch) -> Tensor: ...


ADVANTAGES: Registry[Callable[[ScoredBatch, Any], Tensor]] = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo_advantages(batch: ScoredBatch, cfg: GRPOAdvantageConfig) -> Tensor:
    """Group-normalised outcome advantage (GRPO; ``scale_by_std=False`` is Dr. GRPO's variant)."""
    adv_B = group_advantages(batch.rewards_B, batch.group_ids_B, batch.valid_B, cfg.scale_by_std, cfg.eps)
    return broadcast_to_tokens(adv_B, batch.mask_BT)


def mopd_token_advantages(teacher_logprobs_BT: Tensor, student_logprobs_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Sampled reverse-KL advantage: ``log π_T(y_t) − log π_S(y_t)`` on unmasked tokens.

    Detached: the student is pushed toward the teacher through the policy-gradient log-prob, not
    by differentiating this difference (that would be a different, biased objective).
    """
    diff_BT = teacher_logprobs_BT.detach().float() - student_logprobs_BT.detach().float()
    return diff_BT * mask_BT.to(diff_BT.dtype)


@ADVANTAGES.register("mopd")
def mopd_advantages(batch: ScoredBatch, cfg: MOPDAdvantageConfig) -> Tensor:
    """Multi-teacher on-policy distillation: dense per-token advantage from the domain's teacher,
    plus ``reward_coef`` × the GRPO advantage of the verifier reward."""
    if batch.teacher_logprobs_BT is None or batch.sampler_logprobs_BT is None:
        raise ValueError("mopd needs teacher_logprobs_BT and sampler_logprobs_BT in the ScoredBatch")
    adv_BT = mopd_token_advantages(batch.teacher_logprobs_BT, batch.sampler_logprobs_BT, batch.mask_BT)
    if cfg.reward_coef:
        adv_BT = adv_BT + cfg.reward_coef * grpo_advantages(batch, cfg.grpo)
    return adv_BT


@ADVANTAGES.register("rft")
def rft_advantages(batch: ScoredBatch, cfg: RFTAdvantageConfig) -> Tensor:
    """Rejection-sampling fine-tuning: the same value on the tokens of every rollout whose reward
    reaches ``threshold``, 0 elsewhere, so the policy-gradient loss (ratio 1 on-policy) is the
    cross-entropy of the kept samples. The value is the batch's tokens over the kept tokens: the loop
    divides the step's loss by all of the batch's tokens, and this turns that into a token mean over the
    kept samples, as RFT's SFT on them is (without it their weight against the SFT anchor would shrink
    with the pass rate). A group that all passed still teaches here (under GRPO it is 0), so the
    dynamic filter must be off (``AlgoConfig`` refuses the two together)."""
    kept_B = (batch.rewards_B.detach().float() >= cfg.threshold) & batch.valid_B
    mask_BT = batch.mask_BT.float()
    kept_tokens = float((mask_BT * kept_B[:, None]).sum())
    scale = float(mask_BT.sum()) / kept_tokens if kept_tokens else 0.0
    return broadcast_to_tokens(kept_B.float() * scale, batch.mask_BT)


_ADVANTAGE_CONFIG: TypeAdapter[Any] = TypeAdapter(AdvantageConfig)


def make_advantage(spec: str | Any, **fields: object) -> AdvantageEstimator:
    """An estimator from its config (or its ``type`` name plus fields, validated here)."""
    cfg = _ADVANTAGE_CONFIG.validate_python({"type": spec, **fields} if isinstance(spec, str) else spec)
    return partial(ADVANTAGES.get(cfg.type), cfg=cfg)

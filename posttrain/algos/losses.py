"""Losses: pure functions of per-token tensors; none knows which stage called it.

The trainer computes, once per micro-batch, the log-prob its current weights give each target token
(:func:`token_logprobs`), packs them with the stage's signal into :class:`LossInputs` and calls the
loss picked by name from :data:`LOSSES`. All losses share that one input type, so the training loop
is the same for SFT, RLVR, MOPD, RLHF and DPO.

``pg`` — token-level clipped policy gradient (PPO/GRPO surrogate with DAPO's choices)::

    r_t   = exp(log π_θ(y_t) − log π_old(y_t))                       (trainer vs trainer before the step)
    obj_t = min(r_t·A_t, clip(r_t, 1−ε_low, 1+ε_high)·A_t)            ("clip-higher": ε_high > ε_low)
    ρ_t   = exp(log π_old(y_t) − log π_sampler(y_t))                 (trainer vs inference engine)
    w_t   = ρ_t · 1[low ≤ ρ_t ≤ high]                                 (masked importance sampling)
    loss  = Σ_t m_t·(−w_t·obj_t + β·k3_t) / Σ_t m_t                   (token-level normalisation)

* Clip-higher (DAPO): a larger upper clip lets low-probability tokens with positive advantage grow,
  which keeps entropy from collapsing.
* Token-level normalisation (DAPO): every token in the batch weighs the same, so long rollouts are
  not down-weighted as they are with a per-sequence mean. ``num_tokens`` lets the trainer divide by
  the whole step's token count when it accumulates gradients over micro-batches.
* Masked importance sampling: the sampler (vLLM, a bf16 CPU sampler) and the trainer compute
  slightly different log-probs for the same token, so on-policy data is in fact slightly off-policy.
  ρ_t reweights each token to the trainer's distribution; tokens whose ρ lies outside ``[low, high]``
  are dropped (a mismatch that large is a numerical accident, not a signal worth amplifying).
  ``is_mode="sequence"`` uses the geometric mean of ρ over the rollout's tokens for both the band
  test and the weight, so a rollout is kept or dropped whole.
* The advantage may come from any estimator: an outcome advantage broadcast to tokens (GRPO) and a
  dense per-token log-ratio to a target policy (MOPD) plug in unchanged.
* k3 KL to a reference (off by default, as in DAPO and the recipe): ``exp(ref−π) − (ref−π) − 1``,
  an unbiased, always non-negative estimate of KL(π‖ref) from samples of π.

``ce`` — SFT cross-entropy on the mask (the assistant tokens), token-normalised the same way.

Loss terms (:data:`LOSS_TERMS`) add to whichever loss runs, per token, with the same normalisation:

``topk_kl`` — ``coef · KL_t`` per token, where KL_t is the exact forward or reverse KL between a
target distribution and the policy *restricted to the target's top-k tokens at that position and
renormalised there* (:func:`topk_kl`). A dense, low-variance term next to a sampled one-token
advantage, differentiated directly; its targets come from a scorer (``topk_ids_BTK`` /
``topk_target_logprobs_BTK``).

``forward_kl`` — matching a target model's logits (Hinton et al. 2015's soft targets; Minitron's
recovery after pruning): ``T² · KL(p_target^T ‖ p_θ^T)`` per trained token, where ``p^T`` is the
softmax of the logits divided by the temperature T, plus ``ce_weight ×`` the token's negative log-likelihood
(T = 1), token-normalised like ``ce`` (:func:`forward_kl`). The target is either the full vocabulary
(``target_logprobs_BTK`` with K = V) or its top-k (``target_ids_BTK``): then the target is
renormalised over its k ids, and the policy's log-probs at those ids are read from its
*full-vocabulary* log-softmax, not renormalised. That choice makes the loss the cross-entropy of
the renormalised target against the policy (up to the target's constant entropy): it is ≥ 0, 0 only
when the policy puts exactly the target's renormalised mass on the k ids and nothing elsewhere, and
its gradient also pushes down tokens outside the top-k (a policy renormalised over the k ids, as
``topk_kl`` does, is blind to that mass). With k = V it is the full-vocabulary KL.

``dpo`` — rows come in pairs (chosen at even rows, rejected at odd rows); sequence log-probs are
sums over the mask; with ``h = (πc−refc) − (πr−refr)``: ``sigmoid`` (DPO) ``−log σ(β·h)``, ``ipo``
``(h − 1/(2β))²``, plus optionally ``sft_coef ×`` the chosen reply's mean token NLL; summed over
pairs and divided by ``num_pairs`` (the step's pair count, for gradient accumulation; default:
the pairs of this micro-batch).

Shape suffixes (see docs/algorithms.md): B rollouts, T token positions, V vocabulary, K kept ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence

import torch
import torch.nn.functional as F
from pydantic import TypeAdapter

from posttrain.configs.plugins import (CELossConfig, DPOLossConfig, ForwardKLLossConfig, LossConfig, LossTermConfig,
                                       PGLossConfig, TopKKLConfig)
from posttrain.registry import Registry

Tensor = torch.Tensor


@dataclass
class LossInputs:
    """Everything any loss may need, per token. ``logprobs_BT`` carries the gradient."""

    logprobs_BT: Tensor  # log π_θ of each target token under the current weights
    mask_BT: Tensor  # 1 where the token receives loss
    advantages_BT: Tensor | None = None  # pg
    old_logprobs_BT: Tensor | None = None  # pg: π_old; None means this is the first step on the batch
    sampler_logprobs_BT: Tensor | None = None  # pg: what the inference engine reported
    ref_logprobs_BT: Tensor | None = None  # pg with kl_coef > 0, dpo
    num_tokens: float | None = None  # token-normalisation denominator for the whole step
    topk_logprobs_BTK: Tensor | None = None  # topk_kl: π_θ at the target's top-k ids
    topk_target_logprobs_BTK: Tensor | None = None  # … and the target's log-probs of those ids
    num_pairs: float | None = None  # dpo: pairs in the whole step (normalisation under accumulation)
    logits_BTV: Tensor | None = None  # forward_kl: the policy's logits at the trained positions (with grad)
    target_logprobs_BTK: Tensor | None = None  # forward_kl: the target's log-probs at T = 1, all V or top-k
    target_ids_BTK: Tensor | None = None  # forward_kl: the ids of a top-k target; None: K = V, in vocabulary order


@dataclass
class LossOutput:
    loss: Tensor  # scalar, to call .backward() on
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_weight: float | None = None  # weight of these metrics in the step's mean; None: the loss tokens


def token_logprobs(logits_BTV: Tensor, targets_BT: Tensor) -> Tensor:
    """Log-prob of each target token. ``targets_BT`` = −100 gives 0 (an ignored position).

    Uses cross_entropy rather than log_softmax + gather so no B×T×V log-prob tensor is kept; in fp32
    whatever the logits' dtype (bf16 under autocast or bf16_master), as bf16 log-probs would be
    rounded to ~0.016 nat (train/supervised.py).
    """
    B, T, V = logits_BTV.shape
    nll = F.cross_entropy(logits_BTV.reshape(B * T, V).float(), targets_BT.reshape(B * T), reduction="none")
    return -nll.view(B, T)


def _masked_mean(x_BT: Tensor, mask_BT: Tensor) -> float:
    n = mask_BT.sum()
    return float((torch.where(mask_BT, x_BT, 0.0).sum() / n.clamp(min=1)).detach())


def _denominator(x: LossInputs, mask_BT: Tensor) -> Tensor | float:
    return x.num_tokens if x.num_tokens is not None else mask_BT.sum().clamp(min=1).to(x.logprobs_BT.dtype)


def k3_kl(logprobs_BT: Tensor, ref_logprobs_BT: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π‖ref): exp(ref−π) − (ref−π) − 1 (≥ 0, zero when equal)."""
    d = ref_logprobs_BT.detach() - logprobs_BT
    return torch.exp(d) - d - 1


def topk_kl(policy_logprobs_BTK: Tensor, target_logprobs_BTK: Tensor,
            direction: Literal["forward", "reverse"]) -> Tensor:
    """Per-token KL between a target and the policy over the target's top-k tokens, both
    renormalised to that set: forward KL(p_T‖p_θ) (mass-covering) or reverse KL(p_θ‖p_T)
    (mode-seeking).

    Renormalising makes each a true KL on k outcomes (≥ 0, zero iff the two agree up to a constant
    on the set), whatever mass lies outside the top-k. The target side carries no gradient.
    """
    log_s = torch.log_softmax(policy_logprobs_BTK.float(), dim=-1)
    log_t = torch.log_softmax(target_logprobs_BTK.detach().float(), dim=-1)
    if direction == "forward":
        return (log_t.exp() * (log_t - log_s)).sum(dim=-1)
    return (log_s.exp() * (log_s - log_t)).sum(dim=-1)


def forward_kl(logits_BTV: Tensor, target_logprobs_BTK: Tensor, temperature: float = 1.0,
               target_ids_BTK: Tensor | None = None) -> Tensor:
    """Per-token forward KL(p_target ‖ p_θ) between the two distributions softened by ``temperature``
    (no T² factor here; the loss applies it).

    ``target_logprobs_BTK``: the target's log-probs at temperature 1 (or its logits: only
    differences within a position matter), over the whole vocabulary in id order (K = V,
    ``target_ids_BTK`` None) or at its top-k ids ``target_ids_BTK``. Softening by T is exact from
    either: the top-k of ``softmax(z / T)`` renormalised is ``softmax(z_topk / T)``, whatever T.
    The top-k target is renormalised over its k ids; the policy's side is its full-vocabulary
    log-softmax read at those ids (module docstring: why). The target carries no gradient.
    """
    log_p_BTV = torch.log_softmax(logits_BTV.float() / temperature, dim=-1)
    log_t_BTK = torch.log_softmax(target_logprobs_BTK.detach().float() / temperature, dim=-1)
    if target_ids_BTK is None:
        if log_t_BTK.shape[-1] != log_p_BTV.shape[-1]:
            raise ValueError(f"a full-vocabulary target needs K = V: got {log_t_BTK.shape[-1]} target log-probs "
                             f"for {log_p_BTV.shape[-1]} logits (pass target_ids_BTK for a top-k target)")
        log_p_BTK = log_p_BTV
    else:
        log_p_BTK = log_p_BTV.gather(-1, target_ids_BTK.long())
    p_t_BTK = log_t_BTK.exp()
    # 0 · log 0 = 0: a target id of probability 0 (log-prob −inf) adds nothing, not NaN
    return torch.where(p_t_BTK > 0, p_t_BTK * (log_t_BTK - log_p_BTK), 0.0).sum(dim=-1)


def importance_weights(
    old_logprobs_BT: Tensor,
    sampler_logprobs_BT: Tensor,
    mask_BT: Tensor,
    mode: Literal["token", "sequence"],
    low: float,
    high: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Masked importance sampling between the sampler and the trainer.

    Returns ``(weight_BT, keep_BT, ratio_BT)``: the weight (ρ where kept, else 0), which tokens are
    kept, and the token-level ρ (for metrics). The band test is done on log ρ so a huge mismatch
    cannot overflow into inf·0 = NaN.
    """
    log_rho_BT = torch.where(mask_BT, old_logprobs_BT.detach() - sampler_logprobs_BT.detach(), 0.0)
    if mode == "sequence":
        n_B = mask_BT.sum(dim=1).clamp(min=1)
        log_w_BT = (log_rho_BT.sum(dim=1) / n_B)[:, None].expand_as(log_rho_BT)  # log geometric mean
    else:
        log_w_BT = log_rho_BT
    log_low = math.log(low) if low > 0 else -math.inf
    keep_BT = mask_BT & (log_w_BT >= log_low) & (log_w_BT <= math.log(high))
    weight_BT = torch.where(keep_BT, torch.exp(torch.where(keep_BT, log_w_BT, 0.0)), 0.0)
    return weight_BT, keep_BT, torch.exp(log_rho_BT)


def policy_gradient_loss(x: LossInputs, cfg: PGLossConfig) -> LossOutput:
    if x.advantages_BT is None:
        raise ValueError("the pg loss needs advantages_BT")
    mask = x.mask_BT.bool()
    old = x.old_logprobs_BT if x.old_logprobs_BT is not None else x.logprobs_BT.detach()
    adv = x.advantages_BT.detach().to(x.logprobs_BT.dtype)

    ratio = torch.exp(torch.where(mask, x.logprobs_BT - old.detach(), 0.0))
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    objective = torch.minimum(ratio * adv, clipped * adv)

    metrics: dict[str, float] = {}
    weight: Tensor | float = 1.0
    if x.sampler_logprobs_BT is not None:
        abs_err = (old.detach() - x.sampler_logprobs_BT.detach()).abs()
        metrics["logprob_abs_err"] = _masked_mean(abs_err, mask)
        if cfg.is_mode != "none":
            weight, keep, rho = importance_weights(
                old, x.sampler_logprobs_BT, mask, cfg.is_mode, cfg.is_low, cfg.is_high
            )
            metrics["is_masked_frac"] = _masked_mean((~keep).float(), mask)
            metrics["is_ratio_mean"] = _masked_mean(rho, mask)
    elif cfg.is_mode != "none":
        raise ValueError(f"is_mode={cfg.is_mode!r} needs sampler_logprobs_BT (or set is_mode='none')")

    per_token = -weight * objective
    if cfg.kl_coef > 0:
        if x.ref_logprobs_BT is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs_BT")
        kl = k3_kl(x.logprobs_BT, x.ref_logprobs_BT)
        per_token = per_token + cfg.kl_coef * kl
        metrics["kl"] = _masked_mean(kl, mask)
    loss = torch.where(mask, per_token, 0.0).sum() / _denominator(x, mask)
    clip_active = ((adv > 0) & (ratio > 1 + cfg.clip_high)) | ((adv < 0) & (ratio < 1 - cfg.clip_low))
    metrics["clip_frac"] = _masked_mean(clip_active.float(), mask)
    metrics["ratio_mean"] = _masked_mean(ratio, mask)
    return LossOutput(loss, metrics)


def cross_entropy_loss(x: LossInputs, cfg: CELossConfig | None = None) -> LossOutput:
    mask = x.mask_BT.bool()
    loss = -torch.where(mask, x.logprobs_BT, 0.0).sum() / _denominator(x, mask)
    return LossOutput(loss, {"nll": _masked_mean(-x.logprobs_BT, mask)})


def forward_kl_loss(x: LossInputs, cfg: ForwardKLLossConfig) -> LossOutput:
    """``T² · forward_kl + ce_weight · NLL`` per trained token, token-normalised (module docstring)."""
    if x.logits_BTV is None or x.target_logprobs_BTK is None:
        raise ValueError("the forward_kl loss needs logits_BTV and target_logprobs_BTK (a stage that gives the "
                         "target's log-probs at the trained tokens)")
    mask = x.mask_BT.bool()
    kl_BT = forward_kl(x.logits_BTV, x.target_logprobs_BTK, cfg.temperature, x.target_ids_BTK)
    per_token = cfg.temperature ** 2 * kl_BT
    if cfg.ce_weight:
        per_token = per_token - cfg.ce_weight * x.logprobs_BT
    loss = torch.where(mask, per_token, 0.0).sum() / _denominator(x, mask)
    return LossOutput(loss, {"kl": _masked_mean(kl_BT, mask), "nll": _masked_mean(-x.logprobs_BT, mask)})


def sequence_logprobs(logprobs_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Log-prob of each whole completion: the sum of its masked token log-probs."""
    return torch.where(mask_BT.bool(), logprobs_BT, 0.0).sum(dim=1)


def dpo_loss(x: LossInputs, cfg: DPOLossConfig) -> LossOutput:
    if x.ref_logprobs_BT is None:
        raise ValueError("the dpo loss needs ref_logprobs_BT")
    if x.logprobs_BT.shape[0] % 2:
        raise ValueError(f"dpo rows come in (chosen, rejected) pairs; got {x.logprobs_BT.shape[0]} rows")
    mask = x.mask_BT.bool()
    policy_B = sequence_logprobs(x.logprobs_BT, mask)
    ref_B = sequence_logprobs(x.ref_logprobs_BT.detach(), mask)
    logratio_B = policy_B - ref_B
    h = logratio_B[0::2] - logratio_B[1::2]  # (πc − refc) − (πr − refr), per pair
    if cfg.variant == "ipo":
        per_pair = (h - 1.0 / (2.0 * cfg.beta)).square()
    else:
        per_pair = -F.logsigmoid(cfg.beta * h)
    metrics: dict[str, float] = {}
    if cfg.sft_coef:
        n_chosen = mask[0::2].sum(dim=1).clamp(min=1)
        nll = -policy_B[0::2] / n_chosen
        per_pair = per_pair + cfg.sft_coef * nll
        metrics["sft_nll"] = float(nll.detach().mean())
    n_pairs = x.num_pairs if x.num_pairs is not None else per_pair.shape[0]
    loss = per_pair.sum() / n_pairs
    reward_B = cfg.beta * logratio_B.detach()  # DPO's implicit reward of each completion
    chosen, rejected = reward_B[0::2], reward_B[1::2]
    margin = chosen - rejected
    metrics.update({
        "reward_acc": float((margin > 0).float().mean()),
        "margin": float(margin.mean()),
        "chosen_reward": float(chosen.mean()),
        "rejected_reward": float(rejected.mean()),
        "chosen_logp": float(policy_B[0::2].detach().mean()),
        "rejected_logp": float(policy_B[1::2].detach().mean()),
    })
    return LossOutput(loss, metrics, metrics_weight=float(per_pair.shape[0]))  # per-pair means: weigh by pairs


def topk_kl_term(x: LossInputs, cfg: TopKKLConfig) -> LossOutput:
    """``coef · topk_kl`` per token, normalised like the main loss (see the module docstring)."""
    if x.topk_logprobs_BTK is None or x.topk_target_logprobs_BTK is None:
        raise ValueError("the topk_kl term needs topk_logprobs_BTK and topk_target_logprobs_BTK (a scorer that "
                         "gives top-k targets)")
    mask = x.mask_BT.bool()
    kl_BT = topk_kl(x.topk_logprobs_BTK, x.topk_target_logprobs_BTK, cfg.direction)
    loss = torch.where(mask, cfg.coef * kl_BT, 0.0).sum() / _denominator(x, mask)
    return LossOutput(loss, {"topk_kl": _masked_mean(kl_BT, mask)})


class Loss(Protocol):
    def __call__(self, x: LossInputs) -> LossOutput: ...


# type → implementation; the settings are the typed models of configs/plugins.py
LOSSES: Registry[Callable[[LossInputs, Any], LossOutput]] = Registry("loss")
LOSSES.register("pg")(policy_gradient_loss)
LOSSES.register("ce")(cross_entropy_loss)
LOSSES.register("dpo")(dpo_loss)
LOSSES.register("forward_kl")(forward_kl_loss)

LOSS_TERMS: Registry[Callable[[LossInputs, Any], LossOutput]] = Registry("loss term")
LOSS_TERMS.register("topk_kl")(topk_kl_term)
# terms with a gradient on every token, whatever the advantage: a stage may not skip rows for them
DENSE_TERMS = frozenset({"topk_kl"})

_LOSS_CONFIG: TypeAdapter[Any] = TypeAdapter(LossConfig)
_TERM_CONFIG: TypeAdapter[Any] = TypeAdapter(LossTermConfig)


@dataclass
class CompositeLoss:
    """The main loss plus its terms: outputs add up, metrics merge."""

    main: Any
    terms: Sequence[Any] = ()

    @property
    def dense(self) -> bool:
        """True when some term has a gradient even where the advantage is zero."""
        return any(t.type in DENSE_TERMS for t in self.terms)

    def __call__(self, x: LossInputs) -> LossOutput:
        out = LOSSES.get(self.main.type)(x, self.main)
        for term in self.terms:
            extra = LOSS_TERMS.get(term.type)(x, term)
            out = LossOutput(out.loss + extra.loss, {**out.metrics, **extra.metrics}, out.metrics_weight)
        return out


def make_loss(spec: str | Any, terms: Sequence[Any] = (), **fields: object) -> CompositeLoss:
    """A loss from its config (or its ``type`` name plus fields, validated here) and loss terms."""
    main = _LOSS_CONFIG.validate_python({"type": spec, **fields} if isinstance(spec, str) else spec)
    return CompositeLoss(main, [_TERM_CONFIG.validate_python(t) for t in terms])

"""Multi-teacher on-policy distillation: ``posttrain distill --config recipes/distill.yaml [key=value ...]``.

Algorithm (docs/recipe.md §3), one synchronous on-policy step — the RLVR step of ``train/rl.py``
with one more scorer, run on the filtered batch (``scorers/teachers.py``):

1. **Sample** on tasks from every domain, exactly as RLVR does (same ``envs`` ratios, curriculum,
   rollout engine, overlong filter): the student samples G rollouts per task and they are graded.
2. **Teacher scoring.** Each rollout goes to the teacher of its domain (``Rollout.env``; the
   default teacher otherwise). Each teacher scores every sampled token of its rollouts in batched
   no-grad forward passes at the sampler's temperature: log π_T(y_t | y_<t).
3. **Advantage** ``A_t = log π_T(y_t) − log π_S(y_t)`` per token (the ``mopd`` estimator; log π_S is
   the sampler's log-prob), optionally plus ``reward_coef ×`` the GRPO advantage of the verifier
   reward.
4. **Update** with the same ``pg`` loss as RLVR (clip-higher, token-level normalisation, masked
   importance sampling against the sampler's log-probs).

Why this is reverse KL: for y ~ π_S, E[log π_S(y) − log π_T(y)] = KL(π_S ‖ π_T), and the policy
gradient of E_{y~π_S}[Σ_t A_t] with A_t held fixed is −∇ KL per token (the score-function
estimator; the term E[∇ log π_S] = 0 drops out). So ``pg`` with this advantage descends the
sampled, per-token reverse KL to the domain's teacher — mode-seeking, on the student's own
distribution. docs/distill.md has the derivation and the measured numbers.

Departures, and why:

* **Per-token advantage, no discounting of future tokens.** Like the recipe (and tinker's
  on-policy distillation) each token's advantage is its own log-ratio only, not the sum over the
  rest of the sequence: lower variance, biased toward greedy per-token matching.
* **Dynamic filtering off by default.** A group whose rewards are all equal still carries a dense
  teacher signal; dropping it would throw distillation data away.
* **Teacher at the sampling temperature**, so a teacher equal to the student gives zero advantage;
  at temperature ≠ 1 the KL is between the tempered distributions.

Opt-in top-k KL (``teachers.topk: k`` and ``algo.loss_terms: [{type: topk_kl, coef: 0.1}]``): local
teachers also give their k likeliest tokens per position, and the ``topk_kl`` loss term adds the
exact forward or reverse KL over that renormalised set (``losses.topk_kl``), differentiated
directly; logged as ``topk_kl``.

Config: ``configs/distill.py``; CLI: ``commands/distill.py``.

Metrics on top of RLVR's: ``time_teacher_s``, ``teacher_tokens``, ``teacher_tokens_per_s``,
``teacher_models_loaded``, ``mopd_gap`` and ``mopd_gap/<env>`` = mean(log π_S − log π_T) over the
scored tokens — the sampled estimate of the reverse KL to the domain's teacher (it should fall).
"""

from __future__ import annotations

from posttrain.configs.distill import DistillConfig
from posttrain.scorers.teachers import ScoringTeacherPool
from posttrain.train.rl import RLResult


def make_pool(cfg: DistillConfig) -> ScoringTeacherPool:
    """The teacher scorer, with every teacher's tokenizer checked (no weights loaded yet)."""
    from posttrain.models.loading import load_tokenizer

    pool = ScoringTeacherPool(cfg.teachers, load_tokenizer(cfg.model), cfg.train.micro_batch_tokens)
    pool.check_tokenizers()
    return pool


def train_distill(cfg: DistillConfig, progress: bool = True, stop_after: int | None = None) -> RLResult:
    """The RL stage with the teacher pool among its scorers (see the module docstring)."""
    from posttrain.train.rl import train_rl

    return train_rl(cfg, progress=progress, stop_after=stop_after, scorers=[make_pool(cfg)])

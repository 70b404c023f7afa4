"""Multi-teacher on-policy distillation: ``posttrain distill --config recipes/distill.yaml [key=value ...]``.

Algorithm (RECIPE.md §3), one synchronous on-policy step — the RLVR step of ``train/rl.py`` with
one extra stage between the filters and the advantages:

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

Opt-in top-k KL (``teachers.topk: k`` and ``algo.loss_args.topk_kl_coef``): local teachers also give
their k likeliest tokens per position, and the ``pg`` loss adds the exact forward or reverse KL over
that renormalised set (``losses.topk_kl``), differentiated directly; logged as ``topk_kl``.

Metrics on top of RLVR's: ``time_teacher_s``, ``teacher_tokens``, ``teacher_tokens_per_s``,
``teacher_models_loaded``, ``mopd_gap`` and ``mopd_gap/<env>`` = mean(log π_S − log π_T) over the
scored tokens — the sampled estimate of the reverse KL to the domain's teacher (it should fall).
"""

from __future__ import annotations

import argparse

from pydantic import Field, model_validator

from posttrain.distill.teachers import TeacherPool, TeachersConfig
from posttrain.train.rl import AlgoConfig, RLConfig, RLResult


class DistillAlgoConfig(AlgoConfig):
    advantage: str = "mopd"
    """``mopd``: per-token teacher − student log-prob (``advantage_args: {reward_coef: 0.1}`` mixes in GRPO)."""
    dynamic_filter: bool = False
    """Off: groups with equal rewards still carry the teacher's dense signal."""


class DistillConfig(RLConfig):
    run_dir: str = "runs/distill"
    algo: DistillAlgoConfig = Field(default_factory=DistillAlgoConfig)
    teachers: TeachersConfig = Field(default_factory=TeachersConfig)
    """The teachers and the domains (environment names) each owns; see posttrain/distill/teachers.py."""

    @model_validator(mode="after")
    def _every_env_has_a_teacher(self) -> "DistillConfig":
        self.teachers.check_envs([e.name for e in self.envs])
        coef = float(self.algo.loss_args.get("topk_kl_coef", 0) or 0)
        if bool(self.teachers.topk) != bool(coef):
            raise ValueError("the top-k KL needs both teachers.topk > 0 and algo.loss_args.topk_kl_coef > 0 "
                             f"(got topk={self.teachers.topk}, topk_kl_coef={coef})")
        return self


def make_pool(cfg: DistillConfig) -> TeacherPool:
    """The scorer for ``train_rl``, with every teacher's tokenizer checked (no weights loaded yet)."""
    from posttrain.models.loading import load_tokenizer

    pool = TeacherPool(cfg.teachers, load_tokenizer(cfg.model), cfg.rollout.temperature,
                       cfg.train.micro_batch_tokens)
    pool.check_tokenizers()
    return pool


def train_distill(cfg: DistillConfig, progress: bool = True, stop_after: int | None = None) -> RLResult:
    """The RL loop with the teacher pool as its batch scorer (see the module docstring)."""
    from posttrain.train.rl import train_rl

    return train_rl(cfg, progress=progress, stop_after=stop_after, scorer=make_pool(cfg))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML recipe (see recipes/distill.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. optim.lr=1e-6 train.steps=20 teachers.default=math")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config

    cfg = load_config(DistillConfig, args.config, args.overrides)
    res = train_distill(cfg, progress=not args.no_progress)
    last = res.last
    nan = float("nan")
    print(f"[distill] {res.steps} steps in {res.seconds:.0f}s; last batch reward {last.get('reward', nan):.3f}, "
          f"reverse-KL estimate to the teachers {last.get('mopd_gap', nan):.4f} nats/token")
    for k in sorted(k for k in last if k.startswith("mopd_gap/")):
        print(f"[distill]   {k}: {last[k]:.4f}")
    if res.best_step is not None:
        print(f"[distill] best validation reward {res.best_val_reward:.3f} at step {res.best_step}: "
              f"{res.run_dir / 'best'}")
    print(f"[distill] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

"""Multi-environment RLVR with GRPO: ``posttrain rl --config recipes/rl.yaml [key=value ...]``.

Algorithm (RECIPE.md §2), one synchronous on-policy step:

1. **Pick prompts.** ``DomainMixSampler`` draws P tasks with a fixed share per environment; within an
   environment the tasks come from the Gaussian pass-rate curriculum (given a profile written by
   ``posttrain profile``) or uniformly (``curriculum.kind: random``, or no profile).
2. **Sample.** The policy itself (``HFGenerator`` over the live weights) samples G rollouts per
   task through ``run_episodes``: one turn for single-turn environments, the whole tool / user loop
   for multi-turn ones. Each rollout keeps the exact sampled ids and the sampler's log-probs.
3. **Verify.** Each rollout is graded by its task's environment (in process, or over HTTP when the
   environment has a ``url``): one reward in [0, 1].
4. **Filter.** Overlong filtering (a rollout cut by the token or context limit is dropped, not
   scored 0) and dynamic filtering (a group whose rewards are all equal gives zero advantage; it is
   dropped and counted).
5. **Advantages** from the estimator named in the config (``grpo`` by default): the trainer never
   knows which one ran.
6. **Update.** One forward + backward per micro-batch of packed rows gives the trainer's log-probs
   of the sampled tokens (``models/logprobs.py``) and the ``pg`` loss (clip-higher, token-level
   normalisation over the whole step, masked importance sampling against the sampler's log-probs);
   gradient clipping; AdamW. NemotronH: router weights are frozen, the aux-loss-free expert biases
   follow the load observed in the training forward passes.

Validation (greedy, a few tasks per environment) runs every ``train.eval_every`` steps; the best
mean validation reward is kept in ``<run_dir>/best``, and each task's reward and reason in
``<run_dir>/validation/step_N.jsonl`` (compare two of them with ``posttrain validate --against``). Checkpoints every ``train.save_every`` steps
use the SFT pattern (``train/checkpoint.py``); re-running the same command resumes. Metrics go to
``<run_dir>/metrics.jsonl`` and ``<run_dir>/rewards.png``.

Departures from the paper, and why:

* **No second forward for π_old.** In a synchronous on-policy step with one epoch, the "old" policy
  of the clipped ratio *is* the current one, so ``old_logprobs`` = the trainer's log-probs, detached
  (r = 1; the loss's default when ``old_logprobs_BT`` is None). Masked importance sampling still
  compares them with the sampler's, which differ numerically (a different batch layout, bf16).
* **Zero-advantage rollouts skip the backward.** A rollout whose advantage is 0 on every token
  contributes exactly zero gradient to the ``pg`` loss (with no KL term), so it is left out of the
  forward pass; the token-normalisation denominator still counts its tokens, so the update is the
  same as training on it (tested). The KL term is not supported (it would need a reference model
  and would make such rollouts count).
* **Dynamic filtering resamples only on request.** Dropped groups are counted; with
  ``algo.refill_rounds: N`` up to N extra rounds replace them with fresh tasks of the same
  environments until the step has P informative groups (DAPO). Off by default: on a CPU each round
  costs a generation pass. A rising ``groups_dropped`` says the curriculum is too easy or too hard.
* **No load-balancing loss in RL.** Its gradient would go to the frozen routers and the backbone;
  the recipe only keeps the bias updates.
* **Mixing unit = environment.** Shares (and the profile's ``domain`` field) are per environment,
  since two environments may share a domain (workplace and banking are both tool use).
* **Re-profiling by a rule in numbers** (``curriculum.reprofile``, off by default): see
  ``ReprofileConfig``. The profiles go to ``<run_dir>/profiles/step_NNNNNN.jsonl``; the resume state
  records which one is live.
* Scale: 128 prompts × 16 rollouts and 49K tokens in the paper; the recipe's CPU numbers are small.

Metrics per step (``metrics.jsonl``): ``reward``, ``pass_rate`` (reward ≥ 1) overall and per
environment (``reward/math``, ...); ``response_tokens_mean/max``; ``truncated_frac``;
``groups_dropped``; ``rollouts_trained`` / ``rollouts_zero_adv``; the loss's ``clip_frac``,
``is_masked_frac``, ``logprob_abs_err`` (|trainer − sampler| log-prob, over trained tokens);
``entropy_est`` = mean −log π_sampler(y_t) over all sampled tokens (an unbiased estimate of the
sampling distribution's per-token entropy, at no extra cost); ``grad_norm``, ``lr``;
``time_generate_s`` (includes tool / user steps of multi-turn envs), ``time_verify_s``,
``time_train_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from posttrain.configs import ConfigError, StrictModel
from posttrain.train.sft import MoEConfig, OptimConfig

TRUNCATED = frozenset({"length", "context"})  # finish reasons of a rollout cut short (overlong)

# --------------------------------------------------------------------------- config


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
    engine: str = "hf"
    """Rollout engine from the ENGINES registry (``engines/registry.py``): ``hf`` (in-process lean CPU
    loop over the live weights) or ``vllm`` (GPU, optional extra; weights pushed after every update)."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Engine constructor arguments (e.g. ``{gpu_memory_utilization: 0.3}`` for vllm)."""


class AlgoConfig(StrictModel):
    advantage: str = "grpo"
    """Estimator from the ADVANTAGES registry."""
    advantage_args: dict[str, Any] = Field(default_factory=dict)
    """Its config fields (e.g. ``{scale_by_std: false}`` for Dr. GRPO)."""
    loss: str = "pg"
    """Loss from the LOSSES registry."""
    loss_args: dict[str, Any] = Field(default_factory=dict)
    """Its config fields (clip_low, clip_high, is_mode, is_low, is_high)."""
    overlong_filter: bool = True
    """Drop rollouts cut by the length limit instead of scoring them."""
    dynamic_filter: bool = True
    """Drop groups whose rewards are all equal (zero advantage), and count them."""
    refill_rounds: int = Field(0, ge=0)
    """With the dynamic filter: up to this many extra sampling rounds per step, each replacing the
    dropped groups with fresh tasks of the same environments (DAPO's resampling); 0 trains on the
    short batch."""
    skip_zero_advantage: bool = True
    """Leave rollouts with an all-zero advantage out of the forward/backward (same update, less work)."""

    @field_validator("loss_args")
    @classmethod
    def _no_kl(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("kl_coef", 0):
            raise ValueError("kl_coef > 0 needs a reference model, which the rl stage does not load yet")
        return v


class RLTrainConfig(StrictModel):
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
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    eval_every: int = Field(10, ge=0)
    """Validation every N steps, plus before the first and after the last (0: never)."""
    save_every: int = Field(10, ge=0)
    """Checkpoint every N steps (the last step is always saved)."""
    keep_last: int = Field(2, ge=0)
    threads: int = Field(0, ge=0)
    """torch CPU threads (0: torch's default, one per core)."""
    plot: bool = True
    """Write ``rewards.png`` (reward / pass rate over steps) next to metrics.jsonl."""
    tensorboard: bool = False
    wandb_project: str | None = None


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


# --------------------------------------------------------------------------- rollouts


@dataclass
class Rollout:
    """One sampled and graded rollout, in the shape the trainer needs."""

    env: str
    task_id: str
    group: int  # which prompt of the step it answers
    token_ids: list[int]  # prompt + everything after it, exactly as sampled / rendered
    loss_mask: list[int]  # 1 on the tokens the model sampled
    sampler_logprobs: list[float]  # one per mask-1 token, in order
    finish_reason: str
    reward: float

    @property
    def response_tokens(self) -> int:
        return len(self.sampler_logprobs)


def build_envs(specs: list[EnvSpec]) -> dict[str, Any]:
    from posttrain.envs.base import make_env
    from posttrain.envs.remote import RemoteEnvironment

    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"envs: each environment may appear once, got {names}")
    if not any(s.ratio > 0 for s in specs):
        raise ConfigError("envs: at least one environment needs ratio > 0 (ratio 0 is validation only)")
    return {s.name: RemoteEnvironment(s.url) if s.url else make_env(s.name, **s.args) for s in specs}


def build_sampler(cfg: RLConfig, pools: dict[str, dict[str, Any]]) -> tuple[Any, Any]:
    """(DomainMixSampler, the curriculum or None) over the environments' training pools."""
    from posttrain.algos.curriculum import DomainMixSampler, RandomSampler, read_profile

    ratios = {s.name: s.ratio for s in cfg.envs}
    cur = cfg.curriculum
    if cur.profile is None:
        if cur.kind == "gaussian":
            print("[rl] no curriculum.profile: sampling tasks uniformly (run `posttrain profile` for the curriculum)")
        return DomainMixSampler(RandomSampler({n: list(p) for n, p in pools.items()}), ratios, cfg.train.seed), None
    rows = [r for r in read_profile(cur.profile) if r.domain in pools]
    unknown = [r.task_id for r in rows if r.task_id not in pools[r.domain]]
    if unknown:
        raise ConfigError(f"{cur.profile}: {len(unknown)} task ids (e.g. {unknown[0]!r}) are not in the training "
                          "pools; profile with the same --n and --seed as envs[].train_tasks / task_seed")
    if cur.kind == "random":
        return DomainMixSampler(RandomSampler.from_profile(rows), ratios, cfg.train.seed), None
    return curriculum_sampler(cfg, rows)


def curriculum_sampler(cfg: "RLConfig", rows: list[Any]) -> tuple[Any, Any]:
    """(DomainMixSampler, GaussianCurriculum) from profile rows. Tasks at pass rate 1.0 are dropped,
    unless that leaves an environment fewer tasks than its share of a batch (then all are kept)."""
    from posttrain.algos.curriculum import DomainMixSampler, GaussianCurriculum, largest_remainder

    cur, ratios = cfg.curriculum, {s.name: s.ratio for s in cfg.envs}
    curriculum = GaussianCurriculum(rows, cur.mean_start, cur.mean_end, cur.std)
    need = largest_remainder(ratios, cfg.rollout.prompts_per_step)
    short = [n for n, k in need.items() if curriculum.sizes().get(n, 0) < k]
    if short:
        print(f"[rl] curriculum: {', '.join(short)} would have fewer unsolved tasks than a batch needs; "
              "keeping the always-solved tasks in the pool")
        curriculum = GaussianCurriculum(rows, cur.mean_start, cur.mean_end, cur.std, drop_solved=False)
    return DomainMixSampler(curriculum, ratios, cfg.train.seed), curriculum


def collect_rollouts(generator: Any, envs: dict[str, Any], picks: list[tuple[str, Any]], cfg: RolloutConfig,
                     seed: int, group_offset: int = 0) -> tuple[list[Rollout], float, float]:
    """Sample G rollouts for each picked (env, task) and grade them: (rollouts, generate s, verify s).
    Rollouts answering ``picks[i]`` get group ``group_offset + i``."""
    from posttrain.engines.base import SamplingParams
    from posttrain.episodes.multiturn import run_episodes

    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=cfg.group_size,
                            seed=seed, reasoning=cfg.reasoning)
    out: list[Rollout] = []
    t_gen = t_ver = 0.0
    for name, env in envs.items():
        mine = [(g, task) for g, (env_name, task) in enumerate(picks) if env_name == name]
        if not mine:
            continue
        t0 = time.perf_counter()
        trajectories = run_episodes(generator, env, [t for _, t in mine], params, cfg.max_turns)
        t1 = time.perf_counter()
        for i, traj in enumerate(trajectories):  # task-major: the G episodes of task 0, then task 1, ...
            reward = env.verify(traj.task, traj.messages).reward
            out.append(Rollout(
                name, traj.task.id, group_offset + mine[i // cfg.group_size][0], traj.token_ids, traj.loss_mask,
                [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m], traj.finish_reason, reward,
            ))
        t_gen += t1 - t0
        t_ver += time.perf_counter() - t1
    return out, t_gen, t_ver


def informative_groups(rollouts: list[Rollout], overlong_filter: bool) -> tuple[list[int], list[int]]:
    """(groups whose rewards differ, the other groups), by group id in first-seen order; overlong
    rollouts do not count when the overlong filter will drop them."""
    from posttrain.algos.filters import group_is_informative

    rewards: dict[int, list[float]] = {}
    for r in rollouts:
        rs = rewards.setdefault(r.group, [])
        if not (overlong_filter and r.finish_reason in TRUNCATED):
            rs.append(r.reward)
    good = [g for g, rs in rewards.items() if group_is_informative(rs)]
    return good, [g for g in rewards if g not in set(good)]


def refill(generator: Any, envs: dict[str, Any], pools: dict[str, dict[str, Any]], mix: Any,
           picks: list[tuple[str, Any]], rollouts: list[Rollout], cfg: "RLConfig", step: int,
           progress: float) -> tuple[list[Rollout], list[tuple[str, Any]], dict[str, float]]:
    """Replace the step's uninformative groups with fresh tasks of the same environments, for up to
    ``algo.refill_rounds`` rounds, until P groups are informative; surplus informative groups of
    the last round are discarded. Returns (rollouts, picks, stats)."""
    from posttrain.engines.hf import row_seed

    P = cfg.rollout.prompts_per_step
    stats = {"refill_groups": 0.0, "time_generate_s": 0.0, "time_verify_s": 0.0}
    for rnd in range(1, cfg.algo.refill_rounds + 1):
        good, bad = informative_groups(rollouts, cfg.algo.overlong_filter)
        short = P - len(good)
        if short <= 0:
            break
        counts: dict[str, int] = {}
        for g in bad[:short]:
            counts[picks[g][0]] = counts.get(picks[g][0], 0) + 1
        extra = [(e, pools[e][t]) for e, t in mix.sample_counts(counts, step, progress, round=rnd)]
        new, t_gen, t_ver = collect_rollouts(generator, envs, extra, cfg.rollout,
                                             row_seed(cfg.train.seed, "rl", step, rnd), group_offset=len(picks))
        picks, rollouts = picks + extra, rollouts + new
        stats["refill_groups"] += len(extra)
        stats["time_generate_s"] += t_gen
        stats["time_verify_s"] += t_ver
    good, _ = informative_groups(rollouts, cfg.algo.overlong_filter)
    surplus = set(good[P:])
    return [r for r in rollouts if r.group not in surplus], picks, stats


def score_rollouts(rollouts: list[Rollout], algo: AlgoConfig) -> tuple[Any, dict[str, float]]:
    """ScoredBatch over the step's rollouts after the filters, and the filter counts.

    The T axis of every ``_BT`` tensor is a rollout's *sampled* tokens in order (mask-1 positions of
    its token ids), so single- and multi-turn rollouts share one layout.
    """
    import torch

    from posttrain.algos.advantages import ScoredBatch
    from posttrain.algos.filters import dynamic_filter, overlong_filter

    B, T = len(rollouts), max([r.response_tokens for r in rollouts] + [1])
    mask_BT = torch.zeros(B, T)
    sampler_BT = torch.zeros(B, T)
    for b, r in enumerate(rollouts):
        mask_BT[b, : r.response_tokens] = 1
        sampler_BT[b, : r.response_tokens] = torch.tensor(r.sampler_logprobs)
    rewards_B = torch.tensor([r.reward for r in rollouts])
    groups_B = torch.tensor([r.group for r in rollouts])
    stats = {"truncated": 0.0, "groups_dropped": 0.0}
    if algo.overlong_filter:
        reasons = ["length" if r.finish_reason in TRUNCATED else "stop" for r in rollouts]
        mask_BT, n = overlong_filter(reasons, mask_BT)
        stats["truncated"] = float(n)
    if algo.dynamic_filter:
        keep_B, n = dynamic_filter(rewards_B, groups_B, mask_BT.bool().any(dim=1))
        mask_BT = mask_BT * keep_B[:, None].to(mask_BT.dtype)
        stats["groups_dropped"] = float(n)
    return ScoredBatch(rewards_B, groups_B, mask_BT, sampler_BT), stats


# --------------------------------------------------------------------------- the update


def policy_gradient_backward(
    model: Any, rollouts: list[Rollout], batch: Any, advantages_BT: Any, loss_fn: Any, temperature: float,
    pack: bool, micro_batch_tokens: int, pad_id: int, skip_zero_advantage: bool = True,
    amp: Any = None, monitor: Any = None,
) -> dict[str, Any]:
    """Accumulate the step's policy-gradient into ``.grad`` (no optimizer step); return metrics.

    ``num_tokens`` (the token-normalisation denominator) counts every token still in the batch, also
    those of skipped zero-advantage rollouts, so skipping them does not change the update.

    MOPD's top-k KL (off unless the teachers put ``teacher_topk_ids_BTK`` / ``_logprobs_BTK`` in
    ``batch.extras``): the same forward also gives the student's log-probs at the teacher's top-k ids,
    and no rollout is skipped (its KL term has a gradient even where the advantage is 0).
    """
    import contextlib

    import torch
    import torch.nn.functional as F

    from posttrain.algos.losses import LossInputs
    from posttrain.models.logprobs import micro_batches, prompt_key, sampled_logprobs

    mask_BT = batch.mask_BT.bool()
    T = mask_BT.shape[1]
    num_tokens = float(mask_BT.sum())
    topk_ids_BTK = batch.extras.get("teacher_topk_ids_BTK")
    skip = skip_zero_advantage and topk_ids_BTK is None
    active_B = mask_BT & (advantages_BT != 0) if skip else mask_BT
    rows = torch.nonzero(active_B.any(dim=1)).flatten().tolist()
    sums: dict[str, float] = {}
    loss_total, n_weight = 0.0, 0.0
    loads: dict[str, Any] = {}
    if monitor is not None:
        monitor.clear()  # drop the routing recorded while sampling / validating: only training passes count
    prompts = [(key, len(key)) for key in (prompt_key(rollouts[i].token_ids, rollouts[i].loss_mask) for i in rows)]
    for mb in micro_batches([len(rollouts[i].token_ids) for i in rows], micro_batch_tokens, pack, prompts):
        idx = [rows[j] for j in mb]
        with amp() if amp else contextlib.nullcontext():
            extra = None if topk_ids_BTK is None else [topk_ids_BTK[i, : rollouts[i].response_tokens] for i in idx]
            lps = sampled_logprobs(model, [rollouts[i].token_ids for i in idx], [rollouts[i].loss_mask for i in idx],
                                   temperature, pack, pad_id, extra)
            topk: dict[str, Any] = {}
            if extra is not None:  # column 0: the sampled token; 1..k: the teacher's top-k ids
                topk = {"student_topk_logprobs_BTK": torch.stack([F.pad(lp[:, 1:], (0, 0, 0, T - lp.shape[0]))
                                                                  for lp in lps]),
                        "teacher_topk_logprobs_BTK": batch.extras["teacher_topk_logprobs_BTK"][idx]}
                lps = [lp[:, 0] for lp in lps]
            logprobs_BT = torch.stack([F.pad(lp, (0, T - lp.shape[0])) for lp in lps])
            out = loss_fn(LossInputs(logprobs_BT, mask_BT[idx], advantages_BT[idx], None,
                                     batch.sampler_logprobs_BT[idx], num_tokens=num_tokens, **topk))
        out.loss.backward()
        w = float(mask_BT[idx].sum())  # loss metrics are means over the micro-batch's tokens
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + v * w
        n_weight += w
        loss_total += float(out.loss.detach())
        if monitor is not None:  # keep the expert load, drop the recorded graphs
            for name, load in monitor.observed_load().items():
                loads[name] = loads.get(name, 0) + load
            monitor.clear()
    metrics: dict[str, Any] = {k: v / n_weight for k, v in sums.items()} if n_weight else {}
    metrics.update(loss=loss_total, rollouts_trained=len(rows), tokens_in_batch=num_tokens,
                   rollouts_zero_adv=int(mask_BT.any(dim=1).sum()) - len(rows))
    metrics["_loads"] = loads
    return metrics


# --------------------------------------------------------------------------- validation, plots


def validate(generator: Any, envs: dict[str, Any], cfg: RLConfig, records: Path | None = None,
             progress: bool = False) -> dict[str, float]:
    """Greedy mean reward per environment on its validation tasks, and their mean (``val_reward``).

    ``records``: also write one JSONL row per task (``env, task_id, reward, reason, response_tokens,
    finish_reason``), so two checkpoints can be compared task by task (``eval.compare``)."""
    from tqdm.auto import tqdm

    from posttrain.eval.evaluate import evaluate

    out: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for spec in cfg.envs:
        if spec.val_tasks:
            with tqdm(total=spec.val_tasks, desc=f"validate {spec.name}", unit="task", disable=not progress) as bar:
                r = evaluate(generator, envs[spec.name], "validation", spec.val_tasks, k=1, temperature=0.0,
                             max_new_tokens=cfg.rollout.max_new_tokens, seed=spec.task_seed,
                             reasoning=cfg.rollout.reasoning, max_turns=cfg.rollout.max_turns, progress=bar)
            out[f"val_reward/{spec.name}"] = r.mean_reward
            rows += [{"env": spec.name, "task_id": t.task_id, "reward": t.samples[0].reward,
                      "reason": t.samples[0].reason, "response_tokens": t.samples[0].response_tokens,
                      "finish_reason": t.samples[0].finish_reason} for t in r.tasks]
    if out:
        out["val_reward"] = sum(out.values()) / len(out)
    if records is not None:
        records.parent.mkdir(parents=True, exist_ok=True)
        tmp = records.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, records)
    return out


def plot_metrics(run_dir: Path) -> Path | None:
    """``rewards.png``: batch reward and pass rate per environment, validation reward, and (with a
    curriculum) the target vs the batch pass rate with the re-profiling steps, by step."""
    from posttrain.train.metrics import read_metrics

    rows = read_metrics(run_dir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "batch reward"), ("pass_rate", "batch pass rate"), ("val_reward", "validation (greedy)")]
    curriculum = any("curriculum_target" in r for r in rows)
    fig, axes = plt.subplots(1, 3 + curriculum, figsize=(14 + 4.5 * curriculum, 3.8))
    if curriculum:  # what the sampler aimed at vs what the batches got, and the re-profiles
        ax = axes[3]
        for k, label in (("curriculum_target", "target pass rate"), ("pass_rate", "batch pass rate"),
                         ("pass_rate_gain", "gain over profile")):
            pts = [(r["step"], r[k]) for r in rows if k in r]
            if pts:
                ax.plot(*zip(*pts), label=label, lw=1.5)
        for r in rows:
            if r.get("reprofiled"):
                ax.axvline(r["step"], color="grey", ls="--", lw=1)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title("curriculum (dashed: re-profiled)")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax, (prefix, title) in zip(axes, panels):
        keys = sorted({k for r in rows for k in r if k == prefix or k.startswith(prefix + "/")})
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if k in r]
            ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, ms=3, label=k,
                    lw=2 if k == prefix else 1)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        if keys:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = run_dir / "rewards.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- the stage


@dataclass
class RLResult:
    run_dir: Path
    checkpoint: Path | None
    steps: int
    best_step: int | None
    best_val_reward: float | None
    seconds: float
    last: dict[str, Any] = field(default_factory=dict)


def _step_metrics(rollouts: list[Rollout], filt: dict[str, float], upd: dict[str, Any],
                  names: list[str]) -> dict[str, Any]:
    def summary(rs: list[Rollout]) -> tuple[float, float]:
        return sum(r.reward for r in rs) / len(rs), sum(r.reward >= 1.0 for r in rs) / len(rs)

    m: dict[str, Any] = {}
    m["reward"], m["pass_rate"] = summary(rollouts)
    for n in names:
        mine = [r for r in rollouts if r.env == n]
        if mine:
            m[f"reward/{n}"], m[f"pass_rate/{n}"] = summary(mine)
    lengths = [r.response_tokens for r in rollouts]
    sampled = [lp for r in rollouts for lp in r.sampler_logprobs]
    m.update(response_tokens_mean=sum(lengths) / len(lengths), response_tokens_max=max(lengths),
             truncated_frac=sum(r.finish_reason in TRUNCATED for r in rollouts) / len(rollouts),
             groups_dropped=filt["groups_dropped"], entropy_est=-sum(sampled) / max(len(sampled), 1))
    m.update({k: v for k, v in upd.items() if not k.startswith("_")})
    return m


def train_rl(cfg: RLConfig, progress: bool = True, stop_after: int | None = None,
             scorer: Any = None) -> RLResult:
    """Run the stage (see the module docstring). ``stop_after`` (tests) returns right after that
    step as if the process had been killed there: no final checkpoint, no final validation.

    ``scorer`` (MOPD's teachers, ``posttrain/distill``): called as ``scorer(rollouts, batch)`` after
    the filters and before the advantage estimator; it may fill ``batch.teacher_logprobs_BT`` /
    ``batch.extras`` and returns metrics to log. The loop does not know what it computes."""
    import torch
    from tqdm.auto import tqdm

    from posttrain.algos.advantages import make_advantage
    from posttrain.algos.curriculum import PlateauDetector, read_profile, target_mean
    from posttrain.eval.profile import profile_envs
    from posttrain.algos.losses import make_loss
    from posttrain.configs import save_config
    from posttrain.models import moe as moe_lib
    from posttrain.models.loading import load_model
    from posttrain.engines.registry import make_engine, sync_weights
    from posttrain.engines.hf import row_seed
    from posttrain.train.checkpoint import (latest_checkpoint, load_trainer_state, rng_state, save_checkpoint,
                                            save_hf_model, set_rng_state)
    from posttrain.train.metrics import MetricsLogger, truncate_metrics
    from posttrain.train.precision import autocast, resolve_precision
    from posttrain.train.schedule import wsd_lr_factor
    from posttrain.models.facts import is_hybrid

    t_start = time.time()
    run_dir = Path(cfg.run_dir)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    save_config(cfg, run_dir)
    estimator = make_advantage(cfg.algo.advantage, **cfg.algo.advantage_args)
    loss_fn = make_loss(cfg.algo.loss, **cfg.algo.loss_args)
    envs = build_envs(cfg.envs)
    pools = {s.name: {t.id: t for t in envs[s.name].tasks("train", s.train_tasks, s.task_seed)} for s in cfg.envs}
    mix, curriculum = build_sampler(cfg, pools)
    rp = cfg.curriculum.reprofile
    # the live curriculum phase: which profile, from which step its target mean moves start → end
    phase: dict[str, Any] = {"profile": cfg.curriculum.profile, "start": 0, "plateau": []}
    detector = PlateauDetector(rp.window, rp.min_delta, rp.min_steps) if curriculum and rp.enabled else None

    resume_from = latest_checkpoint(run_dir)
    loaded = load_model(cfg.model, seed=cfg.train.seed)
    model, tok, device = loaded.model, loaded.tokenizer, loaded.device
    if resume_from is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(resume_from, dtype=model.dtype).to(device)
    model.config.use_cache = False
    frozen = moe_lib.freeze_routers(model)  # RL keeps router weights fixed; the biases still move
    monitor = moe_lib.RouterMonitor(model).__enter__() if frozen else None
    generator = make_engine(cfg.rollout.engine, model, tok, batch_size=cfg.rollout.batch_size,
                            **cfg.rollout.engine_args)
    pack = {"on": True, "off": False}.get(cfg.train.pack, not is_hybrid(model))
    precision = resolve_precision(cfg.train.precision, device)
    amp = lambda: autocast(precision, device)  # noqa: E731

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.optim.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # norms, biases: no decay
    opt = torch.optim.AdamW(groups, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps)
    start, best = 0, {"step": None, "val_reward": None}
    if resume_from is not None:
        st = load_trainer_state(resume_from)
        opt.load_state_dict(st["optimizer"])
        set_rng_state(st["rng"])
        start, best = st["step"], st["best"]
        phase = st.get("phase", phase)
        if curriculum is not None and phase["profile"] != cfg.curriculum.profile:  # re-profiled before the kill
            mix, curriculum = curriculum_sampler(cfg, read_profile(phase["profile"]))
        if detector is not None:
            detector.values = list(phase["plateau"])
        truncate_metrics(run_dir, start)
        print(f"[rl] resuming from {resume_from} (step {start}/{cfg.train.steps})")
    log = MetricsLogger(run_dir, cfg.train.tensorboard, cfg.train.wandb_project, cfg.model_dump(mode="json"))
    fault_after = int(os.environ.get("POSTTRAIN_FAULT_AFTER_STEP", "-1"))  # test hook: SIGKILL ourselves

    def evaluate_and_track(step: int) -> dict[str, float]:
        model.eval()
        val = validate(generator, envs, cfg, run_dir / "validation" / f"step_{step:06d}.jsonl")
        if "val_reward" in val and (best["val_reward"] is None or val["val_reward"] > best["val_reward"]):
            best.update(step=step, val_reward=val["val_reward"])
            tmp = run_dir / ".best.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            save_hf_model(model, tok, tmp)
            shutil.rmtree(run_dir / "best", ignore_errors=True)
            os.replace(tmp, run_dir / "best")
        return val

    def checkpoint(step: int) -> Path:
        if detector is not None:
            phase["plateau"] = list(detector.values)
        state = {"optimizer": opt.state_dict(), "rng": rng_state(), "best": dict(best), "phase": dict(phase)}
        path = save_checkpoint(run_dir, step, model, tok, state, cfg.train.keep_last)
        if cfg.train.plot:
            plot_metrics(run_dir)
        return path

    if start == 0 and cfg.train.eval_every:
        log.log(0, evaluate_and_track(0))
    bar = tqdm(total=cfg.train.steps, initial=start, desc="rl", disable=not progress, unit="step")
    last_ckpt, m = resume_from, {}
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        progress = (step - phase["start"]) / max(cfg.train.steps - phase["start"], 1)
        picks = [(e, pools[e][t]) for e, t in mix.sample(cfg.rollout.prompts_per_step, step, progress)]
        model.eval()
        seed = row_seed(cfg.train.seed, "rl", step)  # the step's sampling streams: resumable, reproducible
        rollouts, t_gen, t_ver = collect_rollouts(generator, envs, picks, cfg.rollout, seed)
        refilled: dict[str, float] = {}
        if cfg.algo.dynamic_filter and cfg.algo.refill_rounds:
            rollouts, picks, refilled = refill(generator, envs, pools, mix, picks, rollouts, cfg, step, progress)
            t_gen += refilled.pop("time_generate_s")
            t_ver += refilled.pop("time_verify_s")
        t1 = time.perf_counter()
        batch, filt = score_rollouts(rollouts, cfg.algo)
        scored = scorer(rollouts, batch) if scorer is not None else {}
        advantages_BT = estimator(batch)
        lr = cfg.optim.lr * wsd_lr_factor(step, cfg.train.steps, cfg.optim.warmup_steps, cfg.optim.decay_frac,
                                          cfg.optim.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        model.train()
        upd = policy_gradient_backward(model, rollouts, batch, advantages_BT, loss_fn, cfg.rollout.temperature, pack,
                                       cfg.train.micro_batch_tokens, tok.pad_token_id or 0,
                                       cfg.algo.skip_zero_advantage, amp, monitor)
        if upd["rollouts_trained"]:  # an all-filtered step has no gradient: no update, no bias move
            upd["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip))
            opt.step()
            sync_weights(generator, model)  # an external engine (vllm) gets the new weights; hf shares them
            if monitor and cfg.moe.bias_update_rate > 0:
                upd["moe_load_max_over_mean"] = _update_biases(monitor, upd["_loads"], cfg.moe.bias_update_rate)
        m = _step_metrics(rollouts, filt, upd, list(envs))
        m.update(scored, **refilled)
        if curriculum is not None:
            m["pass_rate_gain"] = m["pass_rate"] - curriculum.expected_pass_rate([r.task_id for r in rollouts])
            m["curriculum_target"] = target_mean(progress, cfg.curriculum.mean_start, cfg.curriculum.mean_end)
        m.update(lr=lr, time_generate_s=t_gen, time_verify_s=t_ver, time_train_s=time.perf_counter() - t1,
                 step_s=time.perf_counter() - t0)
        done = step + 1
        if detector is not None and done < cfg.train.steps and detector.update(m["pass_rate_gain"]):
            model.eval()
            path = run_dir / "profiles" / f"step_{done:06d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"\n[rl] step {done}: pass-rate gain plateaued; re-profiling the training pools (k={rp.k})")
            t_rp = time.perf_counter()
            rows = profile_envs(generator, envs, [(s.name, s.train_tasks, s.task_seed) for s in cfg.envs], rp.k,
                                cfg.rollout.temperature, cfg.rollout.max_new_tokens, cfg.rollout.reasoning,
                                cfg.rollout.max_turns, progress=False, out=str(path))
            mix, curriculum = curriculum_sampler(cfg, rows)
            phase.update(profile=str(path), start=done, plateau=[])
            m.update(reprofiled=1.0, time_reprofile_s=time.perf_counter() - t_rp)
        if cfg.train.eval_every and (done % cfg.train.eval_every == 0 or done == cfg.train.steps):
            m.update(evaluate_and_track(done))
        log.log(done, m)
        bar.set_postfix(reward=f"{m['reward']:.2f}", dropped=int(m["groups_dropped"]), s=f"{m['step_s']:.0f}")
        bar.update(1)
        if done == cfg.train.steps or (cfg.train.save_every and done % cfg.train.save_every == 0):
            last_ckpt = checkpoint(done)
        if done == fault_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if done == stop_after:
            break
    bar.close()
    log.close()
    if monitor:
        monitor.__exit__(None, None, None)
    return RLResult(run_dir, last_ckpt, cfg.train.steps, best["step"], best["val_reward"], time.time() - t_start, m)


def _update_biases(monitor: Any, loads: dict[str, Any], rate: float) -> float:
    """Aux-loss-free bias step from the training passes' load; returns max/mean load (imbalance)."""
    import torch

    from posttrain.models.moe import update_expert_bias

    ratios = []
    with torch.no_grad():
        for name, load in loads.items():
            bias = monitor.routers[name].e_score_correction_bias
            bias.copy_(update_expert_bias(bias, load.to(bias.device), rate))
            ratios.append(float(load.max() / load.mean().clamp(min=1e-9)))
    return sum(ratios) / max(len(ratios), 1)


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML recipe (see recipes/rl.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. optim.lr=1e-6 train.steps=20 rollout.group_size=8")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config

    cfg = load_config(RLConfig, args.config, args.overrides)
    res = train_rl(cfg, progress=not args.no_progress)
    print(f"[rl] {res.steps} steps in {res.seconds:.0f}s; last batch reward {res.last.get('reward', float('nan')):.3f}")
    if res.best_step is not None:
        print(f"[rl] best validation reward {res.best_val_reward:.3f} at step {res.best_step}: {res.run_dir / 'best'}")
    print(f"[rl] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

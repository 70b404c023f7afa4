"""Multi-environment RLVR with GRPO: ``posttrain rl --config recipes/rl.yaml [key=value ...]``.

Algorithm (docs/recipe.md §2), one synchronous on-policy step:

1. **Pick prompts** (``rl_curriculum.TaskSchedule``): P tasks with a fixed share per environment;
   within an environment from the Gaussian pass-rate curriculum (given a profile written by
   ``posttrain profile``) or uniformly (``curriculum.kind: random``, or no profile).
2. **Sample** (``episodes/collect.py``): the rollout engine samples G rollouts per task, one turn
   for single-turn environments, the whole tool / user loop for multi-turn ones. Each rollout
   keeps the exact sampled ids, the sampler's log-probs and how it was sampled.
3. **Reward scorers** (``scorers/``): the environment's verifier (in process, or over HTTP when
   the environment has a ``url``) gives each rollout a reward in [0, 1]; RLHF puts the GenRM
   scorer in its place (``train/rlhf.py``; rewards then are not in [0, 1], which nothing below
   assumes: GRPO normalises within groups, the filters compare rewards only for equality).
4. **Filter.** Overlong filtering (a rollout cut by the token or context limit is dropped, not
   scored 0) and dynamic filtering (a group whose rewards are all equal gives zero advantage; it is
   dropped and counted; ``algo.refill_rounds`` resamples replacements, DAPO-style).
5. **Signal scorers** (none for RLVR; MOPD adds per-token target log-probs) and the
   **advantage** estimator named in the config: the loop never knows which ran.
6. **Update** on the shared loop (``train/loop.py``): per micro-batch of packed rows, the trainer's
   log-probs of the sampled tokens (``models/logprobs.py``) and the registry's loss (``pg``:
   clip-higher, token-level normalisation over the whole step, masked importance sampling against
   the sampler's log-probs); clipping; AdamW; the rollout engine gets the new weights. NemotronH:
   router weights are frozen, the aux-loss-free expert biases follow the training passes' load.
   With ``algo.sft_anchor`` the step also trains on a few supervised rows (InstructGPT's PPO-ptx):
   ``coef`` x their token-mean cross-entropy joins the loss (:class:`AnchoredLoss`).

Scale-out (``scale.backend: ray``, ``posttrain/scale/``): the same stage runs in a Ray trainer actor
with a rollout *source* in place of its own engine — rollout and verification workers sample and
grade steps 2–3, possibly ahead of the trainer (``scale.ahead``, bounded staleness) — and
``after_update`` publishes the weights through it. Synchronous Ray gives this loop's metrics exactly.

Validation (greedy, a few tasks per environment) runs every ``train.eval_every`` steps; the best
mean validation reward is kept in ``<run_dir>/best``, each task's reward and reason in
``<run_dir>/validation/step_N.jsonl`` (``posttrain validate --against`` compares two). Checkpoints
every ``train.save_every`` steps; re-running the same command resumes. Metrics go to
``<run_dir>/metrics.jsonl`` and ``<run_dir>/rewards.png``.

Departures from the paper, and why:

* **No second forward for π_old.** In a synchronous on-policy step with one epoch, the "old" policy
  of the clipped ratio *is* the current one, so ``old_logprobs`` = the trainer's log-probs, detached
  (r = 1). Masked importance sampling still compares them with the sampler's, which differ
  numerically (a different batch layout, bf16).
* **Zero-advantage rollouts skip the backward.** A rollout whose advantage is 0 on every token
  contributes exactly zero gradient to ``pg`` (with no KL term), so it is left out of the forward;
  the token-normalisation denominator still counts its tokens, so the update is the same (tested).
  Not when a loss term has a gradient everywhere (``topk_kl``).
* **Dynamic filtering resamples only on request** (``algo.refill_rounds``): on a CPU each round
  costs a generation pass. A rising ``groups_dropped`` says the curriculum is too easy or too hard.
* **No load-balancing loss in RL.** Its gradient would go to the frozen routers and the backbone;
  the recipe only keeps the bias updates.
* **Mixing unit = environment.** Shares (and the profile's ``domain`` field) are per environment,
  since two environments may share a domain (workplace and banking are both tool use).
* **Re-profiling by a rule in numbers** (``curriculum.reprofile``, off by default; see
  ``ReprofileConfig``). Profiles go to ``<run_dir>/profiles/step_NNNNNN.jsonl``.
* Scale: 128 prompts × 16 rollouts and 49K tokens in the paper; the recipe's CPU numbers are small.

Metrics per step (``metrics.jsonl``): ``reward``, ``pass_rate`` (reward ≥ 1) overall and per
environment (``reward/math``, ...); ``response_tokens_mean/max``; ``truncated_frac``;
``groups_dropped``; ``rollouts_trained`` / ``rollouts_zero_adv``; the loss's ``clip_frac``,
``is_masked_frac``, ``logprob_abs_err`` (|trainer − sampler| log-prob over trained tokens);
``entropy_est`` = mean −log π_sampler(y_t) over all sampled tokens (an unbiased estimate of the
sampling distribution's per-token entropy, at no extra cost); ``grad_norm``, ``lr``;
``time_generate_s`` (includes tool / user steps), ``time_verify_s``, ``time_train_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from posttrain.configs.rl import AlgoConfig, RLConfig
from posttrain.errors import UserError
from posttrain.episodes.collect import Rollout, Sampling, sampling_temperature
from posttrain.train.loop import StepBatch, Trainer
from posttrain.train.sharding import interleave

# --------------------------------------------------------------------------- pieces of a step


def filtered_batch(rollouts: list[Rollout], algo: AlgoConfig) -> tuple[Any, dict[str, float]]:
    """ScoredBatch over the step's rollouts after the filters, and the filter counts.

    The T axis of every ``_BT`` tensor is a rollout's *sampled* tokens in order (mask-1 positions of
    its token ids), so single- and multi-turn rollouts share one layout.
    """
    import torch

    from posttrain.algos.advantages import ScoredBatch
    from posttrain.algos.rollout_filters import dynamic_filter, overlong_filter

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
        mask_BT, n = overlong_filter(["length" if r.truncated else "stop" for r in rollouts], mask_BT)
        stats["truncated"] = float(n)
    if algo.dynamic_filter:
        keep_B, n = dynamic_filter(rewards_B, groups_B, mask_BT.bool().any(dim=1))
        mask_BT = mask_BT * keep_B[:, None].to(mask_BT.dtype)
        stats["groups_dropped"] = float(n)
    return ScoredBatch(rewards_B, groups_B, mask_BT, sampler_BT), stats


def informative_groups(rollouts: list[Rollout], overlong_filter: bool) -> tuple[list[int], list[int]]:
    """(groups whose rewards differ, the other groups), by group id in first-seen order; overlong
    rollouts do not count when the overlong filter will drop them."""
    from posttrain.algos.rollout_filters import group_is_informative

    rewards: dict[int, list[float]] = {}
    for r in rollouts:
        rs = rewards.setdefault(r.group, [])
        if not (overlong_filter and r.truncated):
            rs.append(r.reward)
    good = [g for g, rs in rewards.items() if group_is_informative(rs)]
    return good, [g for g in rewards if g not in set(good)]


def trained_rows(batch: Any, advantages_BT: Any, skip_zero_advantage: bool) -> list[int]:
    """Rollouts that go through the forward/backward: those still in the batch, less (when
    skipping) those whose advantage is zero on every token: they would add exactly zero gradient."""
    mask_BT = batch.mask_BT.bool()
    active_BT = mask_BT & (advantages_BT != 0) if skip_zero_advantage else mask_BT
    return [int(i) for i in active_BT.any(dim=1).nonzero().flatten()]


def rl_micro_batches(rollouts: Sequence[Rollout], rows: list[int], micro_batch_tokens: int, pack: bool
                     ) -> list[list[int]]:
    """``rows`` split into micro-batches of at most ``micro_batch_tokens``, prompt groups together."""
    from posttrain.models.logprobs import micro_batches, prompt_key

    prompts = [(key, len(key)) for key in (prompt_key(rollouts[i].token_ids, rollouts[i].loss_mask) for i in rows)]
    return [[rows[j] for j in mb]
            for mb in micro_batches([len(rollouts[i].token_ids) for i in rows], micro_batch_tokens, pack, prompts)]


def rl_loss_inputs(model: Any, rollouts: Sequence[Rollout], batch: Any, advantages_BT: Any, idx: list[int],
                   pack: bool, pad_id: int) -> Any:
    """One micro-batch's :class:`LossInputs`: the trainer's log-probs of the sampled tokens (at the
    rollouts' own temperature) beside the batch's signal. When a scorer put top-k target ids in
    ``batch.extras`` (``topk_ids_BTK``), the same forward also gives the policy's log-probs there."""
    import torch
    import torch.nn.functional as F

    from posttrain.algos.losses import LossInputs
    from posttrain.models.logprobs import sampled_logprobs

    mine = [rollouts[i] for i in idx]
    T = batch.mask_BT.shape[1]
    topk_ids_BTK = batch.extras.get("topk_ids_BTK")
    extra = None if topk_ids_BTK is None else [topk_ids_BTK[i, : rollouts[i].response_tokens] for i in idx]
    lps = sampled_logprobs(model, [r.token_ids for r in mine], [r.loss_mask for r in mine],
                           sampling_temperature(mine), pack, pad_id, extra)
    topk: dict[str, Any] = {}
    if extra is not None:  # column 0: the sampled token; 1..k: the target's top-k ids
        topk = {"topk_logprobs_BTK": torch.stack([F.pad(lp[:, 1:], (0, 0, 0, T - lp.shape[0])) for lp in lps]),
                "topk_target_logprobs_BTK": batch.extras["topk_target_logprobs_BTK"][idx]}
        lps = [lp[:, 0] for lp in lps]
    logprobs_BT = torch.stack([F.pad(lp, (0, T - lp.shape[0])) for lp in lps])
    dev = logprobs_BT.device  # the batch's signal is built on the CPU; the trainer may be on a GPU
    topk = {k: v.to(dev) for k, v in topk.items()}
    return LossInputs(logprobs_BT, batch.mask_BT.bool()[idx].to(dev), advantages_BT[idx].to(dev), None,
                      batch.sampler_logprobs_BT[idx].to(dev), num_tokens=float(batch.mask_BT.sum()), **topk)


def step_metrics(rollouts: list[Rollout], names: list[str]) -> dict[str, Any]:
    """Reward, pass rate (overall and per environment), lengths, truncation, entropy estimate."""
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
             truncated_frac=sum(r.truncated for r in rollouts) / len(rollouts),
             entropy_est=-sum(sampled) / max(len(sampled), 1))
    return m


# --------------------------------------------------------------------------- the supervised anchor


@dataclass
class AnchorRows:
    """One step's supervised rows (``algo.sft_anchor``), packed as the SFT stage packs them."""

    rows: list[dict[str, Any]]  # tensors of each packed (or padded) row
    num_tokens: int  # their trained tokens: the term is a token mean over the step's rows

    def loss_inputs(self, model: Any, j: int) -> Any:
        from posttrain.algos.losses import LossInputs
        from posttrain.train.supervised import row_logprobs

        logprobs_BT, mask_BT = row_logprobs(model, self.rows[j])
        return LossInputs(logprobs_BT, mask_BT, num_tokens=float(self.num_tokens))  # no advantage: supervised


def load_anchor(cfg: RLConfig, tokenizer: Any, rows: list[dict[str, Any]] | None = None) -> list[Any]:
    """The anchor's conversations (``rows``, as :func:`check_anchor` read them, or read here),
    tokenized as SFT does (reasoning and tools as each row says)."""
    from posttrain.data.examples import tokenize_rows

    a = cfg.algo.sft_anchor
    examples, _ = tokenize_rows(tokenizer, rows if rows is not None else check_anchor(cfg), a.max_seq_len)
    if not examples:
        raise UserError(f"algo.sft_anchor.data={a.data}: no row has an assistant token to train on")
    return examples


def anchor_rows_pick(examples: list[Any], cfg: RLConfig, step: int) -> list[Any]:
    """``rows_per_step`` conversations drawn without replacement as a function of (seed, step), so a
    resumed run trains on the same rows."""
    import random

    n = min(cfg.algo.sft_anchor.rows_per_step, len(examples))
    return [examples[i] for i in random.Random(f"{cfg.train.seed}-anchor-{step}").sample(range(len(examples)), n)]


def anchor_rows(examples: list[Any], cfg: RLConfig, step: int, pack: bool, pad_id: int, device: Any = "cpu"
                ) -> AnchorRows:
    """The step's anchor rows (:func:`anchor_rows_pick`), packed."""
    from posttrain.data.packing import trainable_rows

    rows = trainable_rows(anchor_rows_pick(examples, cfg, step), cfg.algo.sft_anchor.max_seq_len, pad_id, pack)
    return AnchorRows([r.to_tensors(device) for r in rows], sum(r.n_target_tokens for r in rows))


@dataclass
class AnchoredLoss:
    """The RL loss on rollouts, and ``coef`` x the cross-entropy (``ce``) on the anchor's rows, told
    apart by their inputs: supervised rows carry no advantage. Both are token means over the step
    (each over its own tokens), so ``coef`` weighs the two directly."""

    main: Any
    coef: float

    @property
    def dense(self) -> bool:
        return bool(self.main.dense)

    def __call__(self, x: Any) -> Any:
        from posttrain.algos.losses import LossOutput, cross_entropy_loss

        if x.advantages_BT is not None:
            return self.main(x)
        out = cross_entropy_loss(x)
        return LossOutput(self.coef * out.loss, {"anchor_nll": out.metrics["nll"]})


def check_anchor(cfg: RLConfig) -> list[dict[str, Any]]:
    """The anchor's conversations, read before the model loads: a missing file or a bad row is one
    line naming the file and the problem. Empty when the anchor is off."""
    from posttrain.data.conversations import read_conversations

    if not cfg.algo.sft_anchor.data:
        return []
    rows, _ = read_conversations(cfg.algo.sft_anchor.data)
    if not rows:
        raise UserError(f"algo.sft_anchor.data={cfg.algo.sft_anchor.data}: no conversation in the file")
    return rows


def make_rl_loss(cfg: RLConfig) -> Any:
    """The registry's loss and terms, wrapped in :class:`AnchoredLoss` when ``algo.sft_anchor`` is on."""
    from posttrain.algos.losses import make_loss

    loss = make_loss(cfg.algo.loss, cfg.algo.loss_terms)
    return AnchoredLoss(loss, cfg.algo.sft_anchor.coef) if cfg.algo.sft_anchor.data else loss


# --------------------------------------------------------------------------- the stage


@dataclass
class RLStep:
    """A step's data after scoring: all a trainer rank needs to turn its micro-batches (row indices)
    into loss inputs (picklable: rank 0 sends it to the other ranks of a sharded trainer)."""

    rollouts: list[Rollout]
    batch: Any
    advantages_BT: Any
    pack: bool
    pad_id: int
    anchor: "AnchorRows | None" = None

    def loss_inputs(self, model: Any, idx: Any) -> Any:
        if isinstance(idx, tuple):  # ("anchor", j): the j-th packed supervised row
            assert self.anchor is not None
            return self.anchor.loss_inputs(model, idx[1])
        return rl_loss_inputs(model, self.rollouts, self.batch, self.advantages_BT, idx, self.pack, self.pad_id)


class RLStage:
    """Sample → score → filter → advantages; the loop does the update (see the module docstring)."""

    name = "rl"
    balance_loss = False  # routers are frozen in RL; only the expert biases move

    def __init__(self, cfg: RLConfig, t: Trainer, scorers: Sequence[Any], dense_loss: bool,
                 envs: dict[str, Any] | None = None, reward: Any = None, source: Any = None,
                 anchor: list[dict[str, Any]] | None = None) -> None:
        from posttrain.algos.advantages import make_advantage
        from posttrain.engines.registry import make_engine
        from posttrain.serving.build import build_envs
        from posttrain.models.facts import use_packing
        from posttrain.scorers.verifier import VerifierReward
        from posttrain.train.rl_curriculum import TaskSchedule
        from posttrain.train.validation import BestCheckpoint

        self.cfg, self.t = cfg, t
        self.envs = envs if envs is not None else build_envs(cfg.envs)
        self.scorers = [reward if reward is not None else VerifierReward(self.envs), *scorers]
        self.tasks = TaskSchedule(cfg, self.envs)
        self.estimator = make_advantage(cfg.algo.advantage)
        self.pack = use_packing(t.model, cfg.train.pack)
        self.skip = cfg.algo.skip_zero_advantage and not dense_loss
        self.best = BestCheckpoint(t.run_dir)
        self.current: RLStep | None = None
        self.anchor = load_anchor(cfg, t.tokenizer, anchor) if cfg.algo.sft_anchor.data else None
        self.first_metrics: dict[str, Any] = {}  # logged with the run's first step (begin)
        if source is not None and reward is not None:
            raise ValueError("a custom reward scorer runs in process only (scale.backend: inprocess)")
        self.source = source(t, self.plan) if source is not None else None
        # validation and re-profiling sample through the same engine as training: the rollout
        # workers' (on the newest weights) when there is a source, else this process's
        self.generator = (self.source.engine() if self.source is not None else
                          make_engine(cfg.rollout.engine, t.model, t.tokenizer, batch_size=cfg.rollout.batch_size))

    def plan(self, step: int) -> tuple[list[tuple[str, Any]], int]:
        """A step's prompts and sampling seed: functions of (seed, step), so a rollout source may
        draw them ahead of the trainer (asynchronous sampling) and a resumed run draws the same."""
        from posttrain.engines.hf import row_seed

        return self.tasks.picks(step), row_seed(self.cfg.train.seed, "rl", step)

    def sample(self, picks: list[tuple[str, Any]], seed: int, step: int, group_offset: int = 0
               ) -> tuple[list[Rollout], dict[str, float]]:
        """G rollouts per pick, graded by the reward scorers."""
        from posttrain.engines.base import SamplingParams
        from posttrain.episodes.collect import collect_rollouts
        from posttrain.scorers.base import run_scorers

        if self.source is not None:  # rollout workers (posttrain/scale): fresh, from the current weights
            return self.source.sample(picks, seed, step, group_offset)
        r = self.cfg.rollout
        params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=seed,
                                reasoning=r.reasoning)
        self.t.model.eval()
        rollouts, t_gen = collect_rollouts(self.generator, self.envs, picks, params, r.group_size, r.max_turns,
                                           Sampling(r.temperature, params.top_p, r.engine.type, step), group_offset)
        return rollouts, {"time_generate_s": t_gen, **run_scorers(self.scorers, "reward", rollouts)}

    def refill(self, picks: list[tuple[str, Any]], rollouts: list[Rollout], step: int) -> tuple[list[Rollout], dict]:
        """Replace uninformative groups with fresh tasks of the same environments, up to
        ``algo.refill_rounds`` rounds, until P groups are informative; surplus ones are discarded."""
        from posttrain.engines.hf import row_seed

        P, algo = self.cfg.rollout.prompts_per_step, self.cfg.algo
        stats = {"refill_groups": 0.0, "time_generate_s": 0.0, "time_verify_s": 0.0}
        for rnd in range(1, algo.refill_rounds + 1):
            good, bad = informative_groups(rollouts, algo.overlong_filter)
            if len(good) >= P:
                break
            counts: dict[str, int] = {}
            for g in bad[: P - len(good)]:
                counts[picks[g][0]] = counts.get(picks[g][0], 0) + 1
            extra = self.tasks.more(counts, step, rnd)
            new, m = self.sample(extra, row_seed(self.cfg.train.seed, "rl", step, rnd), step, len(picks))
            picks, rollouts = picks + extra, rollouts + new
            stats["refill_groups"] += len(extra)
            for k in ("time_generate_s", "time_verify_s"):
                stats[k] += m.get(k, 0.0)
        surplus = set(informative_groups(rollouts, algo.overlong_filter)[0][P:])
        return [r for r in rollouts if r.group not in surplus], stats

    def prepare(self, step: int) -> StepBatch:
        from posttrain.scorers.base import run_scorers

        # the step's sampling streams are a function of (seed, step): resumable, reproducible
        picks, seed = self.plan(step)
        if self.source is not None:  # may have been sampled ahead, from an older policy version
            rollouts, m = self.source.batch(step, picks, seed)
        else:
            rollouts, m = self.sample(picks, seed, step)
        if self.cfg.algo.dynamic_filter and self.cfg.algo.refill_rounds:
            rollouts, extra = self.refill(picks, rollouts, step)
            for k in ("time_generate_s", "time_verify_s"):
                m[k] += extra.pop(k)
            m.update(extra)
        # sampled this step, stale batches a rollout source dropped included (equal-token comparisons)
        m["tokens_sampled"] = float(sum(r.response_tokens for r in rollouts)) + m.get("stale_tokens_dropped", 0.0)
        t0 = time.perf_counter()
        batch, filt = filtered_batch(rollouts, self.cfg.algo)
        m.update(run_scorers(self.scorers, "signal", rollouts, batch), groups_dropped=filt["groups_dropped"])
        anchor = (anchor_rows(self.anchor, self.cfg, step, self.pack, self.t.pad_id, self.t.device)
                  if self.anchor is not None else None)
        self.current = RLStep(rollouts, batch, self.estimator(batch), self.pack, self.t.pad_id, anchor)
        rows = trained_rows(batch, self.current.advantages_BT, self.skip)
        # a sharded trainer: each rank an equal share of the rows (one share when not sharded); the
        # loss divides by the whole step's tokens (num_tokens), so the ranks' gradients add up
        n = self.t.ranks.world if self.t.ranks is not None else 1
        cuts = [len(rows) * r // n for r in range(n + 1)]
        micro: list[Any] = interleave([rl_micro_batches(rollouts, rows[a:b], self.cfg.train.micro_batch_tokens,
                                                        self.pack) for a, b in zip(cuts, cuts[1:])])
        if anchor is not None:  # the supervised rows: micro-batches of their own (sharded like the rest)
            micro += [("anchor", j) for j in range(len(anchor.rows))]
            m["anchor_tokens"] = float(anchor.num_tokens)
        m.update(rollouts_trained=len(rows), tokens_in_batch=float(batch.mask_BT.sum()),
                 rollouts_zero_adv=int(batch.valid_B.sum()) - len(rows), time_score_s=time.perf_counter() - t0)
        return StepBatch(micro, m, inputs=self.current)

    def loss_inputs(self, model: Any, idx: list[int]) -> Any:
        assert self.current is not None
        return self.current.loss_inputs(model, idx)

    def after_update(self) -> None:
        from posttrain.engines.registry import sync_weights

        sync_weights(self.generator, self.t.model)  # an external engine (vllm) gets the new weights
        if self.source is not None:  # rollout workers get them through the weight-sync backend
            self.source.publish(self.t.model)

    def end_step(self, done: int, batch: StepBatch, m: dict[str, Any]) -> dict[str, Any]:
        assert self.current is not None
        rollouts = self.current.rollouts
        m.update(step_metrics(rollouts, list(self.envs)))
        m.update(self.first_metrics)
        self.first_metrics = {}
        m.update(self.tasks.metrics(done - 1, [r.task_id for r in rollouts], m["pass_rate"]))
        m["time_train_s"] = m.pop("time_score_s") + m["time_update_s"]
        m.update(self.tasks.maybe_reprofile(done, m, self.generator, self.envs, self.t.run_dir))
        every = self.cfg.train.eval_every
        if every and (done % every == 0 or done == self.cfg.train.steps):
            m.update(self.validate(done))
        return m

    def validate(self, step: int) -> dict[str, float]:
        from posttrain.train.validation import validate

        self.t.model.eval()
        val = validate(self.generator, self.envs, self.cfg, self.t.run_dir / "validation" / f"step_{step:06d}.jsonl")
        self.best.offer(step, val, self.t.model, self.t.tokenizer)
        return val

    def begin(self, start: int) -> dict[str, Any]:
        from posttrain.models.precision import resolve

        # the decision the HF engine makes (engines/registry.py), here or in the rollout workers
        engine = self.cfg.rollout.engine
        sampling = resolve(engine.dtype, "sampling", str(self.t.device)) if engine.type == "hf" else None
        if sampling is not None and (self.t.ranks is None or self.t.ranks.main):
            print(f"[{self.t.run_dir.name}] sampling weights: {sampling.line()}")
        # logged with the run's first step, beside the trainer's precision (train/loop.py)
        self.first_metrics = {"precision_sampling": sampling.precision} if sampling is not None else {}
        return self.validate(0) if start == 0 and self.cfg.train.eval_every else {}

    def state_dict(self) -> dict[str, Any]:
        if self.cfg.train.plot:  # the plot is redrawn with each checkpoint
            from posttrain.train.plots import plot_metrics

            plot_metrics(self.t.run_dir)
        return {"best": self.best.state_dict(), "phase": self.tasks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best.load_state_dict(state["best"])
        if "phase" in state:
            self.tasks.load_state_dict(state["phase"])

    def postfix(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"reward": f"{m['reward']:.2f}", "dropped": int(m["groups_dropped"]), "s": f"{m['step_s']:.0f}"}


# --------------------------------------------------------------------------- the entry


@dataclass
class RLResult:
    run_dir: Path
    checkpoint: Path | None
    steps: int
    best_step: int | None
    best_val_reward: float | None
    seconds: float
    last: dict[str, Any] = field(default_factory=dict)


def train_rl(cfg: RLConfig, progress: bool = True, stop_after: int | None = None,
             scorers: Sequence[Any] = (), reward: Any = None, source: Any = None) -> RLResult:
    """Run the stage (see the module docstring). ``scorers`` run after the verifier (MOPD's
    target log-probs); ``reward``: a reward-phase scorer *instead of* the verifier (RLHF's GenRM;
    a function of the trainer, ``reward(t)``, so it may use the policy's tokenizer); ``stop_after``
    (tests) returns right after that step as if killed there. ``source(t, plan)``: builds where the
    rollouts come from instead of the stage's own engine (``scale/rollouts.py``: Ray rollout and
    verification workers; it has ``batch``, ``sample``, ``publish`` and ``close``)."""
    from posttrain.serving.build import build_envs
    from posttrain.train import loop
    from posttrain.train.checkpoint import latest_checkpoint
    from posttrain.train.rl_curriculum import check_profile

    t_start = time.time()
    if cfg.scale.backend != "inprocess" and source is None:  # never a silent in-process run
        raise UserError(f"scale.backend: {cfg.scale.backend} runs through `posttrain rl` (posttrain/scale/controller.py);"
                        " this stage runs in process only: set scale.backend=inprocess")
    loss_fn = make_rl_loss(cfg)
    # what the config names outside itself (environments, servers, the profile, the anchor's data)
    # is checked before the model loads: a wrong name or a dead URL fails in seconds with one line
    envs = build_envs(cfg.envs)
    check_profile(cfg)
    anchor = check_anchor(cfg)
    t = loop.setup(cfg, freeze_routers=True, numerics="rl")
    stage = RLStage(cfg, t, scorers, dense_loss=loss_fn.dense, envs=envs,
                    reward=reward(t) if reward is not None else None, source=source, anchor=anchor)
    try:
        last = loop.run(t, stage, loss_fn, progress, stop_after)
    finally:
        if stage.source is not None:
            stage.source.close()
    return RLResult(t.run_dir, latest_checkpoint(t.run_dir), cfg.train.steps, stage.best.step, stage.best.val_reward,
                    time.time() - t_start, last)


def follow_rl(cfg: RLConfig, publish: Any) -> None:
    """Ranks > 0 of a sharded trainer (``scale.trainer.count`` > 1): the same model set-up as
    :func:`train_rl`, then their share of every update and of every gather, as rank 0 asks
    (``train/loop.py: follow``). ``publish(model, version)``: this rank's half of the weight sync."""
    from posttrain.train import loop

    t = loop.setup(cfg, freeze_routers=True, numerics="rl")
    loop.follow(t, make_rl_loss(cfg), publish)

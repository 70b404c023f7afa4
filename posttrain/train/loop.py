"""The one training loop every stage runs on (SFT, RL, MOPD; DPO and GenRM next).

The loop owns everything that is the same in every stage: loading the model (or resuming it from
the run's last checkpoint), the optimizer and its parameter groups, the WSD learning-rate schedule,
gradient accumulation over micro-batches, clipping, the MoE load-balancing loss and aux-loss-free
bias updates, checkpoints, metrics, the progress bar and the fault hook the kill -9 tests use.

A stage supplies only what differs (:class:`Stage`): how it makes a step's batch (read packed
conversations; or sample, verify, score and filter rollouts), how one micro-batch becomes
:class:`~posttrain.algos.losses.LossInputs` (the current log-probs and the per-token signal), and
what it does after a step (validation, re-profiling). The loss comes from the registry
(``algos/losses.py``); the loop never knows which one ran.

One step::

    batch = stage.prepare(step)                       # micro-batches + the stage's metrics so far
    for micro in batch.micro:                         # gradient accumulation
        out = loss(stage.loss_inputs(model, micro))   # (+ MoE balance loss where routers train)
        out.loss.backward()
    clip → AdamW → expert biases → stage.after_update()
    (bf16_master: bf16 grads → fp32 masters before the clip, bf16 weights ← masters after AdamW;
    train/master_weights.py)
    metrics = stage.end_step(step, batch, metrics) → metrics.jsonl → checkpoint → fault hook

Resume: a checkpoint stores the weights (an HF directory), the optimizer, every RNG and the
stage's own state (:meth:`Stage.state_dict`); data order and sampling seeds are functions of
(seed, step), so a killed and resumed run ends with bit-identical weights (tested for SFT and RL).

Failures the user can act on end the run with one line (``UserError``, printed by the CLI), never
with a checkpoint that would poison the resume: a non-finite loss or gradient norm stops before
the optimizer step (:class:`TrainingDiverged`), weights that became non-finite are never saved, a
run directory that cannot be written fails before the model loads (:class:`RunDirError`), and a
checkpoint that cannot be written (disk full) or read back says which one and what to do
(:class:`CheckpointError`); the previous checkpoint stays intact in every case.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from posttrain.configs import save_config
from posttrain.configs.train import LoRAConfig, LoopConfig, MoEConfig, OptimConfig
from posttrain.errors import UserError

FAULT_ENV = "POSTTRAIN_FAULT_AFTER_STEP"  # test hook: SIGKILL the process right after that step


class TrainingDiverged(UserError):
    """The loss, the gradient norm or the weights stopped being finite (usually: lr too high)."""


class RunDirError(UserError):
    """The run directory (config, metrics) cannot be written."""


class CheckpointError(UserError):
    """A checkpoint cannot be written (disk full) or the one to resume from cannot be read."""


def _why(e: BaseException) -> str:
    """An exception as a short phrase for a one-line error message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


@dataclass
class StepBatch:
    """What a stage hands the loop for one step."""

    micro: list[Any]  # micro-batches, in order; empty: nothing to train on this step (no update)
    metrics: dict[str, Any] = field(default_factory=dict)  # the stage's metrics of this step so far
    data: Any = None  # anything the stage wants back in ``end_step``
    inputs: Any = None  # picklable, ``inputs.loss_inputs(model, micro)``: what the other ranks of a
    # sharded trainer need to run their share (``train/sharding.py``); None: the stage runs unsharded only


class Stage(Protocol):
    name: str
    balance_loss: bool  # add the MoE load-balancing loss (routers train in SFT, are frozen in RL)

    def prepare(self, step: int) -> StepBatch: ...

    def loss_inputs(self, model: Any, micro: Any) -> Any: ...

    def after_update(self) -> None: ...

    def end_step(self, done: int, batch: StepBatch, metrics: dict[str, Any]) -> dict[str, Any]: ...

    def begin(self, start: int) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def postfix(self, metrics: dict[str, Any]) -> dict[str, Any]: ...


class StageConfig(Protocol):
    model: str
    run_dir: str
    optim: OptimConfig
    moe: MoEConfig
    train: LoopConfig


@dataclass
class Trainer:
    """The model, optimizer and run state the loop works on (built by :func:`setup`)."""

    cfg: Any  # the stage's whole config (saved as config.yaml; sections optim, moe, train used here)
    model: Any
    tokenizer: Any
    device: Any
    opt: Any
    params: list[Any]  # what the optimizer steps and clipping sees: the trainable parameters, or their fp32 masters
    amp: Callable[[], Any]  # autocast context for forward passes (bf16 or a no-op)
    monitor: Any  # RouterMonitor on MoE models, else None
    log: Any  # MetricsLogger
    start: int = 0  # first step to run (> 0 when resumed)
    resumed_from: Path | None = None
    resume_state: dict[str, Any] = field(default_factory=dict)  # the stage's state from the checkpoint
    precision: Any = None  # models.precision.Decision: what ran and why (logged with the first step)
    ranks: Any = None  # sharding.Ranks in a sharded trainer (scale.trainer.count > 1), else None
    master: Any = None  # master_weights.MasterWeights under precision bf16_master, else None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id or 0


def setup(cfg: StageConfig, lora: LoRAConfig | None = None, freeze_routers: bool = False,
          numerics: str = "sft", auto_masters: bool = False) -> Trainer:
    """Load (or resume) the model, build the optimizer, open the metrics log.

    The resolved config is written first, so a run directory always says what ran. ``lora``: train
    an adapter (its weights restored on resume). ``freeze_routers``: MoE router weights get no
    gradient (RL); the aux-loss-free biases still follow the load. ``numerics``: the stage kind
    (sft, rl, dpo) that ``precision: auto`` decides for (``models/precision.py``). ``auto_masters``:
    ``auto`` may take bf16 weights with fp32 masters where it would autocast (``autocast.py``; the
    SFT stage, where it was measured).

    In a sharded trainer (``sharding.current()`` set) every rank loads the same model (or
    checkpoint) and shards it before the optimizer is built; only rank 0 writes to the run
    directory and reads the optimizer state, which reaches the other ranks' shards by broadcast.
    """
    import torch

    from posttrain.models import moe as moe_lib, threads
    from posttrain.models.facts import freeze_bottom
    from posttrain.train.checkpoint import latest_checkpoint, set_rng_state
    from posttrain.train.metrics import MetricsLogger, truncate_metrics
    from posttrain.models.precision import attention_for
    from posttrain.train import sharding
    from posttrain.train.autocast import autocast, decide_precision
    from posttrain.train.master_weights import MasterWeights, refusal

    run_dir, loop, ranks = Path(cfg.run_dir), cfg.train, sharding.current()
    main = ranks is None or ranks.main
    if loop.threads:
        threads.set_exact(loop.threads)
    try:  # first thing: a run directory we cannot write fails before any model loads
        if main:
            save_config(cfg, run_dir)
    except OSError as e:
        raise RunDirError(f"cannot write the run directory {run_dir} ({_why(e)}): set run_dir= to a "
                          "writable directory") from None
    if loop.precision == "bf16_master" and (why := refusal(cfg.model)):  # from the model's config alone
        raise UserError(f"train.precision=bf16_master: {why}; use precision auto, bf16 or fp32")
    torch.manual_seed(loop.seed)
    resume_from = latest_checkpoint(run_dir)
    # bf16_master's masters start from fp32 weights even where the default is bf16 (CUDA)
    dtype = torch.float32 if loop.precision == "bf16_master" else None
    model, tok, device, state = _load(cfg.model, loop.seed, lora, resume_from, main, dtype)
    model.config.use_cache = False
    if (frozen := freeze_bottom(model, loop.freeze_layers)) and main:  # with LoRA: refused by the config
        print(f"[{run_dir.name}] frozen: embeddings + blocks 0..{loop.freeze_layers - 1} ({frozen / 1e6:.1f}M weights)")
    routers = moe_lib.freeze_routers(model) if freeze_routers else len(moe_lib.find_routers(model))
    monitor = moe_lib.RouterMonitor(model).__enter__() if routers else None
    masters_ok = auto_masters and ranks is None and not (lora is not None and lora.enabled)
    decision = decide_precision(loop.precision, str(device), numerics, masters_ok, cfg.model)  # type: ignore[arg-type]
    precision = decision.precision
    attention = attention_for(model, precision, str(device), getattr(getattr(cfg, "data", None), "max_seq_len", None))
    if main:
        print(f"[{run_dir.name}] {decision.line()}" + (f"; {attention} attention" if attention else ""))
        (run_dir / "precision.json").write_text(json.dumps(decision.metrics(), indent=1) + "\n")
    if ranks is not None:
        sharding.shard_model(model, ranks)

    master = MasterWeights(model) if precision == "bf16_master" else None  # the model's weights become bf16
    params = master.masters if master else [p for p in model.parameters() if p.requires_grad]
    opt, fused = _make_optimizer(cfg.optim, params, device)
    start = 0
    if resume_from is not None:
        _load_optimizer(opt, state.pop("optimizer", {}), model, ranks, resume_from)
        for g in opt.param_groups:  # a checkpoint's groups carry the writer's flags: keep this run's kernel
            g["fused"] = fused
        if main:
            set_rng_state(state.pop("rng"))
            start = state.pop("step")
            print(f"[{run_dir.name}] resuming from {resume_from} (step {start}/{loop.steps})")
    log = None
    if main:  # drop the lines of steps that will be redone and any line torn by a full disk or a kill
        aside = truncate_metrics(run_dir, start if resume_from is not None else None)
        if aside is not None:
            print(f"[{run_dir.name}] no checkpoint to resume from: an earlier run's metrics moved to {aside.name}")
        log = MetricsLogger(run_dir, loop.tensorboard, loop.wandb_project, cfg.model_dump(mode="json"))  # type: ignore[attr-defined]
    return Trainer(cfg, model, tok, device, opt, params, lambda: autocast(precision, device), monitor, log,
                   start, resume_from, state, decision, ranks, master)


def _load(spec: str, seed: int, lora: LoRAConfig | None, resume_from: Path | None, main: bool, dtype: Any = None
          ) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(model, tokenizer, device, trainer state): ``spec`` loaded, or the checkpoint ``resume_from``
    (with its trainer state on the main rank); a LoRA adapter applied (and restored) when enabled."""
    from posttrain.models.loading import load_model
    from posttrain.train.checkpoint import load_trainer_state

    loaded = load_model(spec, seed=seed, dtype=dtype)
    model, tok, device = loaded.model, loaded.tokenizer, loaded.device
    lora_on = lora is not None and lora.enabled
    try:
        if resume_from is not None and not lora_on:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(resume_from, dtype=model.dtype).to(device)
        if lora_on:
            model = _apply_lora(model, lora, resume_from)  # type: ignore[arg-type]
        state = load_trainer_state(resume_from) if resume_from is not None and main else {}
    except Exception as e:  # safetensors / torch.load / config errors of a damaged checkpoint
        if resume_from is None:
            raise
        raise CheckpointError(f"cannot resume from {resume_from} ({_why(e)}): the checkpoint is damaged; delete "
                              f"it (rm -r {resume_from}) to resume from the one before, or use a new run_dir") from None
    return model, tok, device, state


def _make_optimizer(optim: Any, params: list[Any], device: Any) -> tuple[Any, bool | None]:
    """AdamW over ``params`` (norms and biases without weight decay); also the ``fused`` flag it used."""
    import torch

    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": optim.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # norms, biases: no decay
    # fused AdamW (one kernel over all parameters; fp32 states as before): the step of the 135M
    # embedded model took 0.077 +- 0.004 s instead of 0.300 +- 0.011 s (1 thread, 4 alternating
    # repeats, load 2.5-2.9), ~3.5% of an SFT step. torch has the fused kernel on CPU and CUDA only.
    fused = True if str(device).split(":")[0] in ("cpu", "cuda") else None
    opt = torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
                            fused=fused)
    return opt, fused


def _load_optimizer(opt: Any, state: dict[str, Any], model: Any, ranks: Any, ckpt: Path) -> None:
    """A checkpoint's optimizer state: a one-process run's (keyed by index), or a sharded run's
    full state (keyed by parameter name; rank 0 reads it, the other ranks get their shards)."""
    from posttrain.train import sharding

    # a follower rank has no state of its own (rank 0's reaches it by broadcast): it counts as by-name
    follower = ranks is not None and not ranks.main
    by_name = follower or any(isinstance(k, str) for k in state.get("state", {}))
    if (ranks is not None) != by_name:
        raise CheckpointError(f"cannot resume from {ckpt}: it was written by a "
                              f"{'sharded' if by_name else 'single'} trainer (scale.trainer.count "
                              f"{'> 1' if by_name else '= 1'}); resume it with the same trainer.count")
    if ranks is None:
        opt.load_state_dict(state)
    else:
        sharding.load_optimizer(model, opt, state)


def _apply_lora(model: Any, cfg: LoRAConfig, resume_from: Path | None) -> Any:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                             target_modules=cfg.target_modules, task_type="CAUSAL_LM"))
    if resume_from is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(resume_from / "adapter" / "adapter_model.safetensors")))
    return model


def run(t: Trainer, stage: Stage, loss_fn: Callable[[Any], Any], progress: bool = True,
        stop_after: int | None = None) -> dict[str, Any]:
    """Train ``stage`` from ``t.start`` to ``cfg.train.steps``; returns the last step's metrics.

    ``stop_after`` (tests) returns right after that step as if the process had been killed there.
    """
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if not progress:  # no bar means none: not even transformers' "Writing model shards" at each checkpoint
        hf_logging.disable_progress_bar()
    try:
        return _run(t, stage, loss_fn, progress, stop_after)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _run(t: Trainer, stage: Stage, loss_fn: Callable[[Any], Any], progress: bool, stop_after: int | None
         ) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from posttrain.train import sharding
    from posttrain.train.schedule import wsd_lr_factor

    loop, optim = t.cfg.train, t.cfg.optim
    if t.resumed_from is not None:
        stage.load_state_dict(t.resume_state)
    first = stage.begin(t.start)
    if first:
        t.log.log(t.start, first)
    fault_after = int(os.environ.get(FAULT_ENV, "-1"))
    bar = tqdm(total=loop.steps, initial=t.start, desc=stage.name, disable=not progress, unit="step")
    m: dict[str, Any] = {}
    for step in range(t.start, loop.steps):
        t0 = time.perf_counter()
        lr = optim.lr * wsd_lr_factor(step, loop.steps, optim.warmup_steps, optim.decay_frac, optim.min_lr_ratio)
        for g in t.opt.param_groups:
            g["lr"] = lr
        batch = stage.prepare(step)
        t1 = time.perf_counter()
        if t.ranks is not None:  # the other ranks of a sharded trainer take their share of the update
            if batch.inputs is None:
                raise UserError(f"the {stage.name} stage cannot run on a sharded trainer: use scale.trainer.count=1")
            sharding.send(("update", batch.micro, lr, batch.inputs))
        m = {**batch.metrics, **update(t, stage, batch.micro, loss_fn, step=step), "lr": lr}
        m.update(time_update_s=time.perf_counter() - t1, step_s=time.perf_counter() - t0)
        done = step + 1
        m = stage.end_step(done, batch, m)
        if step == t.start and t.precision is not None:  # every run (and every resume) says what it ran in
            m.update(t.precision.metrics())
        if done % getattr(loop, "log_every", 1) == 0 or done == loop.steps:
            try:
                t.log.log(done, m)
            except OSError as e:
                raise RunDirError(f"step {done}: cannot append to {t.log.path} ({_why(e)}): free disk space and "
                                  "re-run the same command to resume from the last checkpoint") from None
        bar.set_postfix(stage.postfix(m))
        bar.update(1)
        if done == loop.steps or (loop.save_every and done % loop.save_every == 0):
            save(t, done, stage)
        if done == fault_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if done == stop_after:
            break
    if t.ranks is not None:
        sharding.send(("stop",))
    bar.close()
    t.log.close()
    if t.monitor is not None:
        t.monitor.__exit__(None, None, None)
    return m


def update(t: Trainer, stage: Stage, micro: list[Any], loss_fn: Callable[[Any], Any],
           step: int | None = None) -> dict[str, Any]:
    """Accumulate the step's gradient over ``micro`` and take one optimizer step.

    Loss metrics are means over the tokens of the step (each micro-batch weighted by its mask);
    ``loss`` is the sum of the micro-batch losses, i.e. the step's loss when the loss is normalised
    by the step's token count (``num_tokens``), as every registered loss is here. In a sharded
    trainer each rank runs its share (``sharding.share``; None: a pass with zero weight, so every
    rank runs the same collectives) and the metrics' sums are added over the ranks. No micro-batch
    (every rollout filtered, no trainable token): no update, no bias move, ``update_skipped`` = 1.
    A non-finite loss or gradient norm raises :class:`TrainingDiverged` before the optimizer step,
    so the weights stay those of the last finite step.
    """
    import math

    import torch

    from posttrain.models import threads
    from posttrain.train import sharding

    t.opt.zero_grad(set_to_none=True)
    if not micro:
        return {"update_skipped": 1.0}
    t.model.train()
    if t.monitor is not None:
        t.monitor.clear()  # drop routing recorded while sampling / evaluating: only training passes count
    lb_coef = t.cfg.moe.lb_coef if stage.balance_loss and t.monitor is not None else 0.0
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}  # per metric: micro-batches may report different metrics (RL's anchor rows)
    loss_total = lb_total = 0.0
    loads: dict[str, Any] = {}
    for mb in sharding.share(micro, t.ranks):
        threads.govern()  # fewer threads while other processes use the cores (models/threads.py)
        padding = mb is None  # this rank's share is short: the same passes as the others, no gradient
        mb = next(m for m in micro if m is not None) if padding else mb
        with t.amp():
            x = stage.loss_inputs(t.model, mb)
            out = loss_fn(x)
            loss = out.loss * 0.0 if padding else out.loss
            if lb_coef:  # a micro-batch of model inputs (a dict) gives its attention mask, if any
                lb = t.monitor.load_balancing_loss(mb.get("attention_mask") if isinstance(mb, dict) else None)
                loss = loss + lb_coef * lb / len(micro)
                lb_total += float(lb.detach())
        loss.backward()
        # a micro-batch's metrics weigh by its loss tokens, or by what the loss says they average
        # over (dpo: pairs, so reward_acc is the share of the step's pairs)
        w = 0.0 if padding else (out.metrics_weight if out.metrics_weight is not None else float(x.mask_BT.sum()))
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + v * w
            weights[k] = weights.get(k, 0.0) + w
        loss_total += 0.0 if padding else float(out.loss.detach())
        if t.monitor is not None:  # keep the expert load, drop the recorded graphs
            for name, load in t.monitor.observed_load().items():
                loads[name] = loads.get(name, 0) + load
            t.monitor.clear()
    if t.ranks is not None:
        total = sharding.all_reduce_sum({**sums, **{" w " + k: w for k, w in weights.items()}, " loss": loss_total})
        loss_total = total.pop(" loss")
        weights = {k[3:]: total.pop(k) for k in list(total) if k.startswith(" w ")}
        sums = total
    m: dict[str, Any] = {k: v / weights[k] for k, v in sums.items() if weights.get(k)}
    m["loss"] = loss_total
    if t.master is not None:  # bf16_master: clip and step the fp32 masters (train/master_weights.py)
        t.master.grads_to_masters()
    norm = torch.nn.utils.clip_grad_norm_(t.params, t.cfg.optim.grad_clip)
    m["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not (math.isfinite(loss_total) and math.isfinite(m["grad_norm"])):
        t.opt.zero_grad(set_to_none=True)
        where = f"step {step + 1}" if step is not None else "this step"
        raise TrainingDiverged(
            f"{where}: loss {loss_total:g}, gradient norm {m['grad_norm']:g}: training diverged (not finite); "
            f"no update was applied and no checkpoint written ({_last_good(t)}); lower optim.lr "
            f"(now {t.cfg.optim.lr:g}) and re-run")
    t.opt.step() if t.master is None else t.master.step(t.opt)  # bf16_master: and the bf16 weights ← masters
    if lb_coef:
        m["moe_lb_loss"] = lb_total / len(micro)
    if t.monitor is not None and t.cfg.moe.bias_update_rate > 0:
        m["moe_load_max_over_mean"] = update_expert_biases(t.monitor, loads, t.cfg.moe.bias_update_rate)
    stage.after_update()
    return m


def update_expert_biases(monitor: Any, loads: dict[str, Any], rate: float) -> float:
    """Aux-loss-free balancing: nudge each router's bias toward its under-used experts (no
    gradient). Returns the mean over routers of max/mean expert load (1.0 = perfectly balanced)."""
    import torch

    from posttrain.models.moe import update_expert_bias

    ratios = []
    with torch.no_grad():
        for name, load in loads.items():
            bias = monitor.routers[name].e_score_correction_bias
            bias.copy_(update_expert_bias(bias, load.to(bias.device), rate))
            ratios.append(float(load.max() / load.mean().clamp(min=1e-9)))
    return sum(ratios) / max(len(ratios), 1)


def _last_good(t: Trainer) -> str:
    from posttrain.train.checkpoint import latest_checkpoint

    last = latest_checkpoint(t.run_dir)
    return f"the last checkpoint, {last}, is kept" if last is not None else "there is no earlier checkpoint"


def save(t: Trainer, step: int, stage: Stage) -> Path:
    """Checkpoint: HF weights + optimizer + RNG + the stage's state, atomically.

    Weights that are no longer finite are not saved (a resume would start from garbage); a write
    that fails (disk full) leaves the previous checkpoint as it was and says so in one line.
    """
    import torch

    from posttrain.train import sharding
    from posttrain.train.checkpoint import rng_state, save_checkpoint

    weights, optim = None, None  # sharded: full state dicts gathered by every rank, here on rank 0
    if t.ranks is not None:
        weights, optim = sharding.ask_full_state(t.model, t.opt)
    elif t.master is not None:  # bf16_master: saved from the fp32 masters, so the checkpoint is fp32
        weights = t.master.state_dict()
    with torch.no_grad():
        finite = all(bool(torch.isfinite(p).all()) for p in (weights.values() if weights else t.params))
    if not finite:
        raise TrainingDiverged(f"step {step}: the weights are no longer finite after the update: training diverged; "
                               f"not saved ({_last_good(t)}); lower optim.lr (now {t.cfg.optim.lr:g}) and re-run")
    state = {"optimizer": optim if optim is not None else t.opt.state_dict(), "rng": rng_state(), **stage.state_dict()}
    try:
        return save_checkpoint(t.run_dir, step, t.model, t.tokenizer, state, t.cfg.train.keep_last, weights)
    except Exception as e:  # OSError, or the writer's own wrapping of it (safetensors' SafetensorError)
        raise CheckpointError(f"cannot write the step {step} checkpoint in {t.run_dir / 'checkpoints'} ({_why(e)}); "
                              f"{_last_good(t)}: free disk space and re-run the same command to resume") from None


@dataclass
class _Share:
    """A follower's stand-in for the stage: rank 0's step data, which turns a micro-batch into loss inputs."""

    inputs: Any
    name: str = "share"
    balance_loss: bool = False  # sharded runs refuse MoE models (setup)

    def loss_inputs(self, model: Any, micro: Any) -> Any:
        return self.inputs.loss_inputs(model, micro)

    def after_update(self) -> None:
        pass  # rank 0 publishes; this rank takes part when it says so ("publish")


def follow(t: Trainer, loss_fn: Callable[[Any], Any], publish: Callable[[Any, int], Any]) -> None:
    """Ranks > 0 of a sharded trainer: do what rank 0 asks until it stops (``train/sharding.py``).

    ``publish(model, version)``: this rank's half of the weight sync's gather."""
    from posttrain.train import sharding

    while True:
        msg = sharding.send(None)
        if msg[0] == "update":
            _, micro, lr, inputs = msg
            for g in t.opt.param_groups:
                g["lr"] = lr
            update(t, _Share(inputs), micro, loss_fn)
        elif msg[0] == "state":
            sharding.full_state(t.model, t.opt if msg[1] else None)
        elif msg[0] == "publish":
            publish(t.model, msg[1])
        elif msg[0] == "stop":
            return

"""Supervised fine-tuning: ``posttrain sft --config recipes/sft.yaml [key=value ...]``.

Algorithm (RECIPE.md §1, §6): conversations → chat template (loss on assistant tokens only) →
per-dataset blend weights decide how often each dataset is drawn → each optimizer step takes
``train.batch_size`` conversations, packs them into rows of at most ``data.max_seq_len`` tokens
(rows never attend to each other) and accumulates gradients over the rows → token-mean
cross-entropy → clip → AdamW (β = 0.9, 0.95; weight decay 0.1) on a Warmup-Stable-Decay schedule.
NemotronH (MoE) models add the sequence-level load-balancing loss × ``moe.lb_coef`` and update the
aux-loss-free expert biases from the observed load after every step.

Departures from the paper, and why:
* Logits are computed only at positions whose next token is trained on (``logits_to_keep``).
  Prompt positions get exactly zero gradient anyway; on a 135M model the vocabulary projection is
  a large share of the FLOPs, so this is the biggest single CPU saving.
* The data order is a pure function of (seed, step): a resumed run draws exactly the batches the
  uninterrupted run would have, so kill -9 + restart ends with bit-identical weights.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from posttrain.configs import StrictModel

# --------------------------------------------------------------------------- config


class DatasetSpec(StrictModel):
    path: str
    """Conversation JSONL file."""
    weight: float = Field(1.0, gt=0)
    """Relative sampling weight: a dataset with weight 2 is drawn twice as often per example."""


class SFTDataConfig(StrictModel):
    train: list[DatasetSpec] = Field(default_factory=list)
    validation: list[str] = Field(default_factory=list)
    """Held-out JSONL files; if empty, ``val_frac`` of the training rows are held out."""
    val_frac: float = Field(0.05, ge=0, lt=1)
    max_seq_len: int = Field(512, ge=16)
    """Packed row length. Longer rows waste attention FLOPs on the block mask: 512 measured fastest on CPU."""
    pack: Literal["auto", "on", "off"] = "auto"
    """auto: pack attention-only models, pad hybrid (Mamba) ones — see data/packing.py."""
    on_error: Literal["raise", "skip"] = "raise"
    reasoning_off_frac: float = Field(0.10, ge=0, le=1)
    budget_frac: float = Field(0.03, ge=0, le=1)


class OptimConfig(StrictModel):
    lr: float = Field(5e-5, gt=0)
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = Field(0.1, ge=0)
    eps: float = 1e-8
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(10, ge=0)
    decay_frac: float = Field(0.2, ge=0, le=1)
    """Fraction of the run spent in the linear decay phase of WSD."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)


class LoRAConfig(StrictModel):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class MoEConfig(StrictModel):
    lb_coef: float = Field(1e-4, ge=0)
    """Sequence-level load-balancing loss coefficient (NemotronH only)."""
    bias_update_rate: float = Field(1e-3, ge=0)
    """Aux-loss-free expert-bias update rate (NemotronH only)."""


class SFTTrainConfig(StrictModel):
    steps: int = Field(100, ge=1)
    batch_size: int = Field(16, ge=1)
    """Conversations per optimizer step (packed rows are the gradient-accumulation micro-batches)."""
    seed: int = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    eval_every: int = Field(0, ge=0)
    """Held-out loss every N steps (0: only at start and end)."""
    save_every: int = Field(50, ge=0)
    keep_last: int = Field(2, ge=0)
    log_every: int = Field(1, ge=1)
    threads: int = Field(0, ge=0)
    """torch CPU threads (0: all cores)."""
    tensorboard: bool = False
    wandb_project: str | None = None


class SFTConfig(StrictModel):
    model: str = "embedded"
    """Model spec: embedded, tiny-llama, tiny-nemotronh, or an HF directory / checkpoint."""
    run_dir: str = "runs/sft"
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    moe: MoEConfig = Field(default_factory=MoEConfig)
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig)


# --------------------------------------------------------------------------- data


@dataclass
class SFTData:
    train: list[list[Any]]  # per dataset: list of Example
    weights: list[float]
    validation: list[Any]


def tokenize_rows(tokenizer: Any, rows: list[dict[str, Any]]) -> list[Any]:
    from posttrain.data.packing import Example
    from posttrain.models.chat_template import render

    out = []
    for r in rows:
        rendered = render(tokenizer, r["messages"], r.get("tools"), reasoning=r.get("reasoning", True))
        if sum(rendered.loss_mask):
            out.append(Example(rendered.input_ids, rendered.loss_mask))
    return out


def load_sft_data(cfg: SFTConfig, tokenizer: Any) -> SFTData:
    from posttrain.data.conversations import DataError, read_conversations
    from posttrain.data.transforms import apply_reasoning_transforms

    if not cfg.data.train:
        raise DataError("no training data: set data.train (a list of {path, weight}) in the config")
    train, weights, held = [], [], []
    for i, spec in enumerate(cfg.data.train):
        rows, report = read_conversations(spec.path, on_error=cfg.data.on_error)
        if report.bad:
            print(f"[data] {spec.path}: {report.summary()}")
        rng = random.Random(cfg.train.seed + i)
        rng.shuffle(rows)
        if not cfg.data.validation and cfg.data.val_frac > 0:
            n_val = max(1, int(len(rows) * cfg.data.val_frac))
            held.extend(rows[:n_val])
            rows = rows[n_val:]
        rows = apply_reasoning_transforms(rows, cfg.train.seed + i, cfg.data.reasoning_off_frac, cfg.data.budget_frac)
        examples = tokenize_rows(tokenizer, rows)
        if not examples:
            raise DataError(f"{spec.path}: no usable training rows")
        train.append(examples)
        weights.append(spec.weight)
    for p in cfg.data.validation:
        rows, report = read_conversations(p, on_error=cfg.data.on_error)
        held.extend(rows)
    return SFTData(train, weights, tokenize_rows(tokenizer, held))


def step_plan(sizes: list[int], weights: list[float], batch_size: int, steps: int, seed: int) -> list[list[tuple[int, int]]]:
    """Which (dataset, example) pairs each step trains on: a pure function of its arguments.

    Datasets are drawn by weight; inside a dataset, examples come from a fresh permutation each epoch,
    so a small dataset with a large weight is simply seen for more epochs (RECIPE.md §1).
    """
    rng = random.Random(seed)
    perms: list[list[int]] = [[] for _ in sizes]
    plan = []
    for _ in range(steps):
        batch = []
        for d in rng.choices(range(len(sizes)), weights=weights, k=batch_size):
            if not perms[d]:
                perms[d] = list(range(sizes[d]))
                rng.shuffle(perms[d])
            batch.append((d, perms[d].pop()))
        plan.append(batch)
    return plan


# --------------------------------------------------------------------------- model pieces


def target_positions(labels_1d: Any) -> Any:
    """Positions whose *next* token is trained on: the only logits that get a gradient."""
    import torch

    nxt = labels_1d[1:] != -100
    return torch.nonzero(nxt, as_tuple=False).flatten()


def row_loss_sum(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """Summed token cross-entropy of one micro-batch, computing logits only where needed."""
    import torch
    import torch.nn.functional as F

    labels = batch["labels"]
    if labels.shape[0] == 1:  # packed row: keep exactly the target positions
        pos = target_positions(labels[0])
        if pos.numel() == 0:
            return labels.new_zeros((), dtype=torch.float32), 0
        out = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"],
            attention_mask=batch.get("attention_mask"), logits_to_keep=pos, use_cache=False,
        )
        logits = out.logits[0].float()
        targets = labels[0, pos + 1]
    else:  # padded rows (hybrid models): full logits, mask by labels
        out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
        logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float()
        targets = labels[:, 1:].reshape(-1)
    loss_sum = F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
    return loss_sum, int((targets != -100).sum())


def apply_lora(model: Any, cfg: LoRAConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


@dataclass
class EvalStats:
    loss: float
    tokens: int


def heldout_loss(model: Any, examples: list[Any], max_len: int, pack: bool, pad_id: int, autocast_ctx: Any) -> EvalStats:
    import torch

    from posttrain.data.packing import pack_examples, pad_examples

    if not examples:
        return EvalStats(float("nan"), 0)
    rows = pack_examples(examples, max_len, pad_id) if pack else pad_examples(examples, max_len, pad_id, 4)
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad(), autocast_ctx():
        for r in rows:
            s, k = row_loss_sum(model, r.to_tensors())
            total += float(s)
            n += k
    model.train(was_training)
    return EvalStats(total / max(n, 1), n)


# --------------------------------------------------------------------------- the stage


@dataclass
class SFTResult:
    run_dir: Path
    checkpoint: Path
    steps: int
    val_loss_before: float
    val_loss_after: float
    tokens_trained: int
    seconds: float


def train_sft(cfg: SFTConfig, progress: bool = True) -> SFTResult:
    import torch
    from tqdm.auto import tqdm

    from posttrain.configs import save_config
    from posttrain.data.packing import pack_examples, pad_examples
    from posttrain.models import moe as moe_lib
    from posttrain.models.facts import is_hybrid
    from posttrain.models.loading import load_model
    from posttrain.train.checkpoint import (latest_checkpoint, load_trainer_state, rng_state,
                                            save_checkpoint, set_rng_state)
    from posttrain.train.metrics import MetricsLogger, truncate_metrics
    from posttrain.train.precision import autocast, resolve_precision
    from posttrain.train.schedule import wsd_lr_factor

    t_start = time.time()
    run_dir = Path(cfg.run_dir)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    save_config(cfg, run_dir)
    torch.manual_seed(cfg.train.seed)

    resume_from = latest_checkpoint(run_dir)
    loaded = load_model(cfg.model, seed=cfg.train.seed)
    model, tok, device = loaded.model, loaded.tokenizer, loaded.device
    if resume_from is not None and not cfg.lora.enabled:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(resume_from, dtype=model.dtype).to(device)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
        if resume_from is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(model, load_file(str(resume_from / "adapter" / "adapter_model.safetensors")))
    model.train()
    model.config.use_cache = False

    pack = {"on": True, "off": False}.get(cfg.data.pack, not is_hybrid(model))
    precision = resolve_precision(cfg.train.precision, device)
    amp = lambda: autocast(precision, device)  # noqa: E731
    data = load_sft_data(cfg, tok)
    plan = step_plan([len(d) for d in data.train], data.weights, cfg.train.batch_size, cfg.train.steps, cfg.train.seed)

    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]  # norms and biases are not decayed
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
    )
    start_step, tokens_trained, val_before = 0, 0, None
    if resume_from is not None:
        st = load_trainer_state(resume_from)
        opt.load_state_dict(st["optimizer"])
        set_rng_state(st["rng"])
        start_step, tokens_trained, val_before = st["step"], st["tokens_trained"], st.get("val_loss_before")
        truncate_metrics(run_dir, start_step)
        print(f"[sft] resuming from {resume_from} (step {start_step}/{cfg.train.steps})")

    log = MetricsLogger(run_dir, cfg.train.tensorboard, cfg.train.wandb_project, cfg.model_dump(mode="json"))
    pad_id = tok.pad_token_id or 0
    evaluate = lambda: heldout_loss(model, data.validation, cfg.data.max_seq_len, pack, pad_id, amp)  # noqa: E731
    if val_before is None:
        val_before = evaluate().loss
        log.log(start_step, {"val_loss": val_before})
    monitor = moe_lib.RouterMonitor(model).__enter__() if moe_lib.find_routers(model) else None
    fault_after = int(os.environ.get("POSTTRAIN_FAULT_AFTER_STEP", "-1"))  # test hook: SIGKILL ourselves

    def checkpoint(step: int) -> Path:
        state = {"optimizer": opt.state_dict(), "rng": rng_state(), "tokens_trained": tokens_trained,
                 "val_loss_before": val_before}
        return save_checkpoint(run_dir, step, model, tok, state, cfg.train.keep_last)

    bar = tqdm(total=cfg.train.steps, initial=start_step, desc="sft", disable=not progress, unit="step")
    last_ckpt = resume_from
    for step in range(start_step, cfg.train.steps):
        t0 = time.time()
        examples = [data.train[d][i] for d, i in plan[step]]
        rows = pack_examples(examples, cfg.data.max_seq_len, pad_id) if pack else pad_examples(examples, cfg.data.max_seq_len, pad_id)
        n_targets = sum(r.n_target_tokens for r in rows)
        lr = cfg.optim.lr * wsd_lr_factor(step, cfg.train.steps, cfg.optim.warmup_steps, cfg.optim.decay_frac, cfg.optim.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss_total, lb_total = 0.0, 0.0
        loads: dict[str, Any] = {}
        if monitor:
            monitor.clear()  # drop router records left by an evaluation pass
        for r in rows:
            tensors = r.to_tensors(device)
            with amp():
                s, _ = row_loss_sum(model, tensors)
                loss = s / max(n_targets, 1)  # token mean over the whole step, not per row
                if monitor:
                    lb = monitor.load_balancing_loss(tensors.get("attention_mask"))
                    loss = loss + cfg.moe.lb_coef * lb / len(rows)
                    lb_total += float(lb.detach())
            loss.backward()
            loss_total += float(s.detach())
            if monitor:  # keep the step's expert load, drop the per-row graphs
                for name, load in monitor.observed_load().items():
                    loads[name] = loads.get(name, 0) + load
                monitor.clear()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip))
        opt.step()
        if monitor and cfg.moe.bias_update_rate > 0:
            with torch.no_grad():  # aux-loss-free balancing: no gradient, a direct nudge of each bias
                for name, load in loads.items():
                    bias = monitor.routers[name].e_score_correction_bias
                    bias.copy_(moe_lib.update_expert_bias(bias, load, cfg.moe.bias_update_rate))
        tokens_trained += n_targets
        dt = time.time() - t0
        row_tokens = sum(len(x) for r in rows for x in r.input_ids_BT)
        metrics = {"loss": loss_total / max(n_targets, 1), "lr": lr, "grad_norm": grad_norm,
                   "target_tokens": n_targets, "tokens": row_tokens, "rows": len(rows),
                   "tokens_per_s": row_tokens / dt, "step_s": dt}
        if monitor:
            metrics["moe_lb_loss"] = lb_total / max(len(rows), 1)
        done = step + 1
        if cfg.train.eval_every and done % cfg.train.eval_every == 0 and done < cfg.train.steps:
            metrics["val_loss"] = evaluate().loss
        if done % cfg.train.log_every == 0 or done == cfg.train.steps:
            log.log(done, metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", lr=f"{lr:.1e}", tok_s=f"{metrics['tokens_per_s']:.0f}")
        bar.update(1)
        if cfg.train.save_every and done % cfg.train.save_every == 0 and done < cfg.train.steps:
            last_ckpt = checkpoint(done)
        if done == fault_after:
            os.kill(os.getpid(), signal.SIGKILL)
    bar.close()
    val_after = evaluate().loss
    log.log(cfg.train.steps, {"val_loss": val_after})
    final = checkpoint(cfg.train.steps) if last_ckpt is None or not str(last_ckpt).endswith(f"{cfg.train.steps:06d}") else last_ckpt
    log.close()
    if monitor:
        monitor.__exit__(None, None, None)
    return SFTResult(run_dir, final, cfg.train.steps, val_before, val_after, tokens_trained, time.time() - t_start)


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML recipe (see recipes/sft.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides, e.g. optim.lr=1e-4 train.steps=50 model=tiny-llama")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config

    cfg = load_config(SFTConfig, args.config, args.overrides)
    res = train_sft(cfg, progress=not args.no_progress)
    print(f"[sft] {res.steps} steps, {res.tokens_trained} target tokens in {res.seconds:.0f}s")
    print(f"[sft] held-out loss {res.val_loss_before:.4f} → {res.val_loss_after:.4f}")
    print(f"[sft] checkpoint: {res.checkpoint}  (loads with AutoModelForCausalLM.from_pretrained)")
    return 0

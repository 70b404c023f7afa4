"""Supervised fine-tuning: ``posttrain sft --config recipes/sft.yaml [key=value ...]``.

Algorithm (docs/recipe.md §1, §6): conversations → chat template (loss on assistant tokens only) →
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
* Rows are cut to ``data.max_seq_len`` when they are tokenized, never silently: a row whose
  prompt alone fills ``max_seq_len`` (no assistant token would survive the cut) is skipped, and a
  row whose assistant tokens run past it is cut; both are counted and printed per file
  (``[data] train.jsonl: 3 rows longer than data.max_seq_len=512 before any assistant token:
  skipped``). A packed row with no trained token is still not a micro-batch (no gradient to give),
  and a step left with none takes no update (``update_skipped`` in metrics) instead of crashing.

The stage runs on the shared loop (``train/loop.py``): this module supplies the data, how a packed
row becomes per-token log-probs and a mask, and the held-out loss; the loss is the registry's ``ce``.
CLI: ``commands/sft.py``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.configs.sft import SFTConfig
from posttrain.data.examples import tokenize_rows
from posttrain.train.loop import StepBatch, Trainer
from posttrain.train.supervised import row_logprobs

# --------------------------------------------------------------------------- data


@dataclass
class SFTData:
    train: list[list[Any]]  # per dataset: list of Example
    weights: list[float]
    validation: list[Any]


def check_data_files(cfg: SFTConfig) -> None:
    """Every data path is a readable file: checked before the model loads (a directory given as
    the data file, a typo) so the run fails in a second with one line."""
    from posttrain.data.conversations import DataError

    for p in [s.path for s in cfg.data.train] + list(cfg.data.validation):
        path = Path(p)
        if path.is_dir():
            raise DataError(f"data file {p} is a directory: give a conversation JSONL file (data.train[].path "
                            "or data.validation)")
        if not path.exists():
            raise DataError(f"data file not found: {p}")


def load_sft_data(cfg: SFTConfig, tokenizer: Any) -> SFTData:
    from posttrain.data.conversations import DataError, read_conversations
    from posttrain.data.transforms import apply_reasoning_transforms

    if not cfg.data.train:
        raise DataError("no training data: set data.train (a list of {path, weight}) in the config")
    train, weights, held = [], [], []
    split_seed = cfg.train.seed if cfg.data.split_seed is None else cfg.data.split_seed
    for i, spec in enumerate(cfg.data.train):
        rows, report = read_conversations(spec.path, on_error=cfg.data.on_error)
        if report.bad:
            print(f"[data] {spec.path}: {report.summary()}")
        random.Random(split_seed + i).shuffle(rows)
        if not cfg.data.validation and cfg.data.val_frac > 0:
            n_val = max(1, int(len(rows) * cfg.data.val_frac))
            held.extend(rows[:n_val])
            rows = rows[n_val:]
        rows = apply_reasoning_transforms(rows, cfg.train.seed + i, cfg.data.reasoning_off_frac, cfg.data.budget_frac)
        examples, lengths = tokenize_rows(tokenizer, rows, cfg.data.max_seq_len)
        for line in lengths.lines(spec.path):
            print(line)
        if not examples:
            raise DataError(f"{spec.path}: no usable training rows ({lengths.prompt_too_long} of {lengths.rows} "
                            f"longer than data.max_seq_len={cfg.data.max_seq_len} before any assistant token)")
        train.append(examples)
        weights.append(spec.weight)
    for p in cfg.data.validation:
        rows, report = read_conversations(p, on_error=cfg.data.on_error)
        if report.bad:
            print(f"[data] {p}: {report.summary()}")
        held.extend(rows)
    validation, lengths = tokenize_rows(tokenizer, held, cfg.data.max_seq_len)
    for line in lengths.lines("held-out rows"):
        print(line)
    return SFTData(train, weights, validation)


def step_plan(sizes: list[int], weights: list[float], batch_size: int, steps: int, seed: int) -> list[list[tuple[int, int]]]:
    """Which (dataset, example) pairs each step trains on: a pure function of its arguments.

    Datasets are drawn by weight; inside a dataset, examples come from a fresh permutation each epoch,
    so a small dataset with a large weight is simply seen for more epochs (docs/recipe.md §1).
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


@dataclass
class EvalStats:
    loss: float
    tokens: int


def heldout_loss(model: Any, examples: list[Any], max_len: int, pack: bool, pad_id: int, autocast_ctx: Any) -> EvalStats:
    """Token-mean cross-entropy over held-out examples (NaN with no tokens: nothing was measured)."""
    import torch

    from posttrain.data.packing import trainable_rows

    rows = trainable_rows(examples, max_len, pad_id, pack, rows_per_batch=4)
    if not rows:
        return EvalStats(float("nan"), 0)
    was_training = model.training
    model.eval()
    device = str(next(model.parameters()).device)  # rows are built on the CPU; the model may be on a GPU
    total, n = 0.0, 0
    with torch.no_grad(), autocast_ctx():
        for r in rows:
            lp, mask = row_logprobs(model, r.to_tensors(device))
            total -= float(lp[mask].sum())
            n += int(mask.sum())
    model.train(was_training)
    return EvalStats(total / n, n)


# --------------------------------------------------------------------------- the stage


class SFTStage:
    """Packed conversations → per-token log-probs on the assistant tokens → ``ce``."""

    name = "sft"
    balance_loss = True  # routers train in SFT: the load-balancing loss applies
    val_metric = "val_loss"  # what ``heldout()`` measures, as logged

    def __init__(self, cfg: SFTConfig, t: Trainer, data: SFTData | None = None) -> None:
        from posttrain.models.facts import use_packing

        self.cfg, self.t = cfg, t
        self.pack = use_packing(t.model, cfg.data.pack)
        self.data = data if data is not None else load_sft_data(cfg, t.tokenizer)
        self.plan = step_plan([len(d) for d in self.data.train], self.data.weights, cfg.train.batch_size,
                              cfg.train.steps, cfg.train.seed)
        self.tokens_trained = 0
        self.val_before: float | None = None
        self.val_after: float | None = None
        self._num_tokens = 0

    def heldout(self) -> float:
        return heldout_loss(self.t.model, self.data.validation, self.cfg.data.max_seq_len, self.pack, self.t.pad_id,
                            self.t.amp).loss

    def begin(self, start: int) -> dict[str, Any]:
        if self.val_before is not None:
            return {}
        self.val_before = self.heldout()
        return {self.val_metric: self.val_before}

    def prepare(self, step: int) -> StepBatch:
        from posttrain.data.packing import trainable_rows

        examples = [self.data.train[d][i] for d, i in self.plan[step]]
        rows = trainable_rows(examples, self.cfg.data.max_seq_len, self.t.pad_id, self.pack)
        self._num_tokens = sum(r.n_target_tokens for r in rows)  # token mean over the whole step
        return StepBatch([self.micro(step, r) for r in rows],
                         {"target_tokens": self._num_tokens, "rows": len(rows),
                          "tokens": sum(len(x) for r in rows for x in r.input_ids_BT)})

    def micro(self, step: int, row: Any) -> dict[str, Any]:
        """One packed row of step ``step`` as model inputs (``row.members`` index ``self.plan[step]``)."""
        return row.to_tensors(self.t.device)

    def loss_inputs(self, model: Any, micro: dict[str, Any]) -> Any:
        from posttrain.algos.losses import LossInputs

        logprobs_BT, mask_BT = row_logprobs(model, micro)
        return LossInputs(logprobs_BT, mask_BT, num_tokens=self._num_tokens)

    def after_update(self) -> None:
        pass

    def end_step(self, done: int, batch: StepBatch, m: dict[str, Any]) -> dict[str, Any]:
        self.tokens_trained += m["target_tokens"]
        m["tokens_per_s"] = m["tokens"] / m["step_s"]
        every = self.cfg.train.eval_every
        if done == self.cfg.train.steps or (every and done % every == 0):
            m[self.val_metric] = self.val_after = self.heldout()
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"tokens_trained": self.tokens_trained, "val_loss_before": self.val_before}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens_trained, self.val_before = state["tokens_trained"], state.get("val_loss_before")

    def postfix(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"loss": f"{m.get('loss', float('nan')):.3f}", "lr": f"{m['lr']:.1e}", "tok_s": f"{m['tokens_per_s']:.0f}"}


@dataclass
class SFTResult:
    run_dir: Path
    checkpoint: Path
    steps: int
    val_loss_before: float
    val_loss_after: float
    tokens_trained: int
    seconds: float
    start_step: int = 0
    """The step this process started from (> 0 when it resumed): ``steps - start_step`` ran here."""


def train_sft(cfg: SFTConfig, progress: bool = True, stop_after: int | None = None) -> SFTResult:
    """Run the stage (see the module docstring): ``posttrain sft --config recipes/sft.yaml``.
    ``stop_after`` (tests) returns right after that step as if the process had been killed there."""
    from posttrain.algos.losses import make_loss
    from posttrain.train import loop

    t_start = time.time()
    check_data_files(cfg)
    t = loop.setup(cfg, lora=cfg.lora, auto_masters=True)
    stage = SFTStage(cfg, t)
    loop.run(t, stage, make_loss("ce"), progress, stop_after)
    ckpt, before, after = finish(stage, cfg, stop_after)
    return SFTResult(Path(cfg.run_dir), ckpt, cfg.train.steps, before, after, stage.tokens_trained,
                     time.time() - t_start, t.start)


def finish(stage: Any, cfg: Any, stop_after: int | None) -> tuple[Path, float, float]:
    """(last checkpoint, held-out figure before, after) once ``loop.run`` returns, for SFTStage and the
    stages built on it: NaN after when stopped early, measured now when a resumed run had nothing left."""
    from posttrain.train.checkpoint import latest_checkpoint

    if stop_after is not None and stop_after < cfg.train.steps:
        stage.val_after = float("nan")  # stopped early: no final held-out figure
    if stage.val_after is None:  # resumed after the last step: nothing ran, measure anyway
        stage.val_after = stage.heldout()
    ckpt = latest_checkpoint(cfg.run_dir)
    assert ckpt is not None and stage.val_before is not None
    return ckpt, stage.val_before, stage.val_after

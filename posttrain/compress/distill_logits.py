"""Knowledge distillation on logits: ``posttrain distill-logits --config recipes/distill_logits.yaml``.

Minitron's recovery step after pruning (docs/recipe.md §8; docs/prune.md):
a student — usually ``posttrain prune``'s output — learns the next-token distributions of a
teacher — usually the model it was cut from — on SFT-format conversations.

1. **Data** exactly as ``posttrain sft`` reads it (``train/sft.py``): blends, held-out split,
   reasoning transforms, packing; ``train.batch_size`` conversations per step, one packed row per
   micro-batch.
2. **Teacher** log-probs at every trained (assistant) position of the row: a no-grad forward of the
   teacher (eval mode) on the same row in the same step, or read back from ``teacher.cache``
   (``compress/teacher_cache.py``), computed once for every row before step 1.
3. **Loss** ``forward_kl`` (``algos/losses.py``): T² · KL(teacher^T ‖ student^T) per token, over the
   full vocabulary or the teacher's renormalised top-k, plus ``loss.ce_weight`` × cross-entropy on
   the data, a token mean over the step.
4. **Update** on the shared loop (``train/loop.py``): AdamW + WSD, accumulation, checkpoints that
   load in plain transformers, kill -9 resume. The stage is the SFT stage with another loss: only
   the micro-batch's targets, the loss inputs and the held-out figure differ.

Departures from Minitron, and why:

* **Assistant tokens only**, like SFT's loss mask: the data is conversations, and the prompt's
  tokens are not what the student is asked to write. Minitron distils on every token of pretraining
  text.
* **Off-policy** (teacher forcing on the data's tokens); ``posttrain distill`` (MOPD) is the
  on-policy counterpart, reverse KL on the student's own samples (docs/prune.md compares them).
* **Top-k** (``teacher.topk``) keeps the student's full-vocabulary log-softmax, so mass the student
  puts outside the teacher's top-k is still pushed down (``losses.forward_kl``).

Before any weight loads: the config's bounds (k ≥ 1, T > 0, a cache needs top-k), student and
teacher ``vocab_size`` (their config.json) and tokenizers equal, the data files readable, and a
cache made for another teacher, other data or another k refused. ``val_kl`` (held-out rows, the
loss's per-token KL at T, without T²) is logged at the start, every ``train.eval_every`` steps and
at the end. Config: ``configs/prune.py``; CLI: ``commands/distill_logits.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.compress.teacher_cache import TeacherCache, targets_from_logits
from posttrain.configs.prune import DistillLogitsConfig
from posttrain.errors import UserError
from posttrain.train.loop import Trainer
from posttrain.train.sft import SFTData, SFTStage, finish


class VocabMismatch(UserError, ValueError):
    """Student and teacher logits do not index the same vocabulary."""


def vocab_size(spec: str, tokenizer: Any) -> int:
    """A model's ``vocab_size`` from its config.json (no weights read); a tiny model is built to its
    tokenizer's size."""
    from posttrain.models.loading import resolve_spec
    from posttrain.scorers.teachers import config_vocab_size

    where = resolve_spec(spec)
    if isinstance(where, str):
        return len(tokenizer)
    size = config_vocab_size(where)
    if size is None:
        raise VocabMismatch(f"{where}/config.json gives no vocab_size: cannot check that student and teacher "
                            "share a vocabulary")
    return size


def check_pair(cfg: DistillLogitsConfig) -> Any:
    """Student and teacher share one vocabulary and tokenizer (configs and tokenizers only, before any
    weight loads); returns the student's tokenizer."""
    from posttrain.models.loading import load_tokenizer
    from posttrain.scorers.teachers import compare_tokenizers

    tok, teacher_tok = load_tokenizer(cfg.model), load_tokenizer(cfg.teacher.model)
    vs, vt = vocab_size(cfg.model, tok), vocab_size(cfg.teacher.model, teacher_tok)
    if vs != vt:
        raise VocabMismatch(f"student {cfg.model} has vocab_size {vs} but teacher {cfg.teacher.model} has {vt}: the "
                            "KL compares the two models' logits id by id; use a teacher and student of one "
                            "tokenizer (prune the teacher to get the student)")
    compare_tokenizers(tok, teacher_tok, cfg.teacher.model)
    if cfg.teacher.topk is not None and cfg.teacher.topk > vs:
        raise VocabMismatch(f"teacher.topk={cfg.teacher.topk} is more than the vocabulary ({vs} tokens)")
    return tok


def splits(data: SFTData) -> dict[str, list[Any]]:
    """The rows the teacher scores, by cache split name: ``train.<i>`` per data.train file, ``validation``."""
    return {**{f"train.{d}": list(ex) for d, ex in enumerate(data.train)}, "validation": list(data.validation)}


class DistillLogitsStage(SFTStage):
    """Packed conversations → student logits and teacher log-probs at the trained tokens → ``forward_kl``."""

    name = "distill-logits"
    val_metric = "val_kl"

    def __init__(self, cfg: DistillLogitsConfig, t: Trainer, data: SFTData, teacher: Any | None,
                 cache: TeacherCache | None) -> None:
        from posttrain.models.facts import use_packing

        super().__init__(cfg, t, data)  # type: ignore[arg-type]  # the SFT stage reads data, train, model
        self.teacher, self.cache, self.k, self.temperature = teacher, cache, cfg.teacher.topk, cfg.loss.temperature
        if teacher is not None:  # a hybrid (Mamba) teacher cannot read packed rows either
            self.pack = self.pack and use_packing(teacher, cfg.data.pack)

    def _with_targets(self, row: Any, keys: list[tuple[str, int]]) -> dict[str, Any]:
        micro = row.to_tensors(self.t.device)
        if self.cache is not None:
            micro["target_logprobs"], micro["target_ids"] = self.cache.targets(keys, self.t.device)
        return micro

    def micro(self, step: int, row: Any) -> dict[str, Any]:
        return self._with_targets(row, [(f"train.{d}", i) for d, i in (self.plan[step][m] for m in row.members)])

    def targets(self, micro: dict[str, Any]) -> tuple[Any, Any]:
        """The teacher's (log-probs, ids) at the row's trained positions: cached, or computed now."""
        import torch

        from posttrain.train.supervised import target_logits

        if "target_logprobs" in micro:
            return micro["target_logprobs"], micro["target_ids"]
        with torch.no_grad():
            return targets_from_logits(target_logits(self.teacher, micro)[0], self.k)

    def loss_inputs(self, model: Any, micro: dict[str, Any]) -> Any:
        import torch

        from posttrain.algos.losses import LossInputs, token_logprobs
        from posttrain.train.supervised import target_logits

        logits_NV, targets_N = target_logits(model, micro)
        lp_NK, ids_NK = self.targets(micro)
        logprobs_BT = token_logprobs(logits_NV[None], targets_N[None])
        return LossInputs(logprobs_BT, torch.ones_like(logprobs_BT, dtype=torch.bool), num_tokens=self._num_tokens,
                          logits_BTV=logits_NV[None], target_logprobs_BTK=lp_NK[None],
                          target_ids_BTK=None if ids_NK is None else ids_NK[None])

    def heldout(self) -> float:
        """Token-mean KL to the teacher on the held-out rows (the loss's, at T, without T²)."""
        import torch

        from posttrain.algos.losses import forward_kl
        from posttrain.data.packing import trainable_rows
        from posttrain.train.supervised import target_logits

        examples, model = self.data.validation, self.t.model
        rows = trainable_rows(examples, self.cfg.data.max_seq_len, self.t.pad_id, self.pack)
        total, n, was_training = 0.0, 0, model.training
        model.eval()
        with torch.no_grad(), self.t.amp():
            for r in rows:
                micro = self._with_targets(r, [("validation", m) for m in r.members or []])
                lp_NK, ids_NK = self.targets(micro)
                total += float(forward_kl(target_logits(model, micro)[0], lp_NK, self.temperature, ids_NK).sum())
                n += lp_NK.shape[0]
        model.train(was_training)
        return total / n if n else float("nan")


def teacher_source(cfg: DistillLogitsConfig, t: Trainer, data: SFTData, meta: dict[str, str] | None
                   ) -> tuple[Any | None, TeacherCache | None]:
    """(teacher model, None) for in-step scoring, or (None, the cache), building it first if absent."""
    from posttrain.compress.teacher_cache import build_cache
    from posttrain.models.facts import use_packing
    from posttrain.models.loading import load_model

    path = cfg.teacher.cache
    if path is not None and Path(path).exists():  # its fingerprint was checked before the student loaded
        return None, TeacherCache(path)
    teacher = load_model(cfg.teacher.model, device=str(t.device)).model.eval().requires_grad_(False)
    teacher.config.use_cache = False
    if path is None:
        return teacher, None
    assert cfg.teacher.topk is not None and meta is not None  # the config refuses a cache without top-k
    build_cache(path, teacher, splits(data), cfg.teacher.topk, cfg.data.max_seq_len, t.pad_id,
                use_packing(teacher, cfg.data.pack), t.amp, meta)
    return None, TeacherCache(path)


@dataclass
class DistillLogitsResult:
    run_dir: Path
    checkpoint: Path
    steps: int
    val_kl_before: float
    val_kl_after: float
    tokens_trained: int
    seconds: float


def train_distill_logits(cfg: DistillLogitsConfig, progress: bool = True, stop_after: int | None = None
                         ) -> DistillLogitsResult:
    """Run the stage (see the module docstring). ``stop_after`` (tests) returns right after that step
    as if the process had been killed there."""
    from posttrain.algos.losses import make_loss
    from posttrain.compress.teacher_cache import check_cache, fingerprint
    from posttrain.train import loop
    from posttrain.train.sft import check_data_files, load_sft_data

    t_start = time.time()
    check_data_files(cfg)  # type: ignore[arg-type]
    data = load_sft_data(cfg, check_pair(cfg))  # type: ignore[arg-type]
    meta = None
    if cfg.teacher.cache is not None:
        assert cfg.teacher.topk is not None
        meta = fingerprint(cfg.teacher.model, splits(data), cfg.teacher.topk)
        check_cache(cfg.teacher.cache, meta)  # a cache for another teacher, data or k: refused now
    t = loop.setup(cfg)
    teacher, cache = teacher_source(cfg, t, data, meta)
    stage = DistillLogitsStage(cfg, t, data, teacher, cache)
    loop.run(t, stage, make_loss(cfg.loss), progress, stop_after)
    ckpt, before, after = finish(stage, cfg, stop_after)
    return DistillLogitsResult(Path(cfg.run_dir), ckpt, cfg.train.steps, before, after, stage.tokens_trained,
                               time.time() - t_start)

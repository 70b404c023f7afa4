"""``posttrain distill-logits``: a student learns a teacher's logits on SFT data (the stage is
``compress/distill_logits.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments

DESCRIPTION = """\
Knowledge distillation on logits, Minitron's recovery step after `posttrain prune`: the student
(model=, e.g. the pruned checkpoint) learns the teacher's next-token distributions (teacher.model=,
e.g. the SFT checkpoint it was pruned from) at the assistant tokens of SFT-format JSONL, read and
packed as `posttrain sft` does.

loss = T^2 * KL(teacher^T || student^T) + loss.ce_weight * cross-entropy on the data, per token:
  teacher.topk     unset: KL over the full vocabulary; k: over the teacher's k likeliest tokens,
                   renormalised (the student keeps its full-vocabulary log-softmax)
  loss.temperature T > 0 softens both distributions (default 1)
  loss.ce_weight   weight of cross-entropy on the data's tokens (default 0)
  teacher.cache    PATH: compute the teacher's top-k log-probs of every row once, then read them
                   back each step (needs teacher.topk; a cache for another teacher, other data or
                   another k is refused)
Student and teacher must share a tokenizer and vocab_size (checked before any weight loads).
Checkpoints are plain HF directories; re-running the same command resumes. On-policy distillation
(reverse KL on the student's own samples) is `posttrain distill`. See docs/prune.md.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_recipe_arguments(p, "recipes/distill_logits.yaml",
                         "model=runs/prune/model teacher.model=runs/sft/checkpoints/step_000100 "
                         "data.train=[{path: data/arith.jsonl}] teacher.topk=64 loss.temperature=2")


def run(args: argparse.Namespace) -> int:
    from posttrain.compress.distill_logits import train_distill_logits
    from posttrain.configs import load_config
    from posttrain.configs.prune import DistillLogitsConfig
    from posttrain.train import run_lock

    cfg = load_config(DistillLogitsConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain distill-logits"):  # one process per run directory
        res = train_distill_logits(cfg, progress=not args.no_progress)
    print(f"[distill-logits] {res.steps} steps, {res.tokens_trained} target tokens in {res.seconds:.0f}s")
    print(f"[distill-logits] held-out KL to the teacher {res.val_kl_before:.4f} → {res.val_kl_after:.4f} nats/token")
    print(f"[distill-logits] checkpoint: {res.checkpoint}  (loads with AutoModelForCausalLM.from_pretrained)")
    return 0

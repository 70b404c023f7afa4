"""``posttrain sft``: supervised fine-tuning (the stage is ``train/sft.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/sft.yaml", "optim.lr=1e-4 train.steps=50 model=tiny-llama")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.sft import SFTConfig
    from posttrain.train.sft import train_sft

    cfg = load_config(SFTConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain sft"):  # one process per run directory
        res = train_sft(cfg, progress=not args.no_progress)
    print(f"[sft] {res.steps} steps, {res.tokens_trained} target tokens in {res.seconds:.0f}s")
    print(f"[sft] held-out loss {res.val_loss_before:.4f} → {res.val_loss_after:.4f}")
    print(f"[sft] checkpoint: {res.checkpoint}  (loads with AutoModelForCausalLM.from_pretrained)")
    return 0

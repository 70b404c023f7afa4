"""``posttrain dpo``: direct preference optimisation on pairs JSONL (the stage is ``train/dpo.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/dpo.yaml", "data.train=pairs.jsonl loss.variant=ipo loss.beta=0.1")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.dpo import DPOConfig
    from posttrain.train.dpo import train_dpo

    cfg = load_config(DPOConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain dpo"):  # one process per run directory
        res = train_dpo(cfg, progress=not args.no_progress)
    last, nan = res.last, float("nan")
    print(f"[dpo] {res.steps} steps in {res.seconds:.0f}s; last batch loss {last.get('loss', nan):.4f}, implicit-reward "
          f"accuracy {last.get('reward_acc', nan):.2f}, margin {last.get('margin', nan):.4f}; held out: accuracy "
          f"{last.get('val_reward_acc', nan):.2f}, margin {last.get('val_margin', nan):.4f}")
    print(f"[dpo] reference log-probs {'computed' if res.reference_computed else 'read from the cache'}; "
          f"checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

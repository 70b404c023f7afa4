"""``posttrain rl``: multi-environment RLVR with GRPO (the stage is ``train/rl.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/rl.yaml", "optim.lr=1e-6 train.steps=20 rollout.group_size=8")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.rl import RLConfig
    from posttrain.scale.controller import run_rl

    cfg = load_config(RLConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain rl"):  # one process per run directory
        res = run_rl(cfg, progress=not args.no_progress)  # in process, or on Ray (scale.backend)
    print(f"[rl] {res.steps} steps in {res.seconds:.0f}s; last batch reward {res.last.get('reward', float('nan')):.3f}")
    if res.best_step is not None:
        print(f"[rl] best validation reward {res.best_val_reward:.3f} at step {res.best_step}: {res.run_dir / 'best'}")
    print(f"[rl] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

"""``posttrain rlhf``: RL with the GenRM as the reward (the stage is ``train/rlhf.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/rlhf.yaml", "judge.model=runs/genrm/best length_control.enabled=false")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.rlhf import RLHFConfig
    from posttrain.train.rlhf import train_rlhf

    cfg = load_config(RLHFConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain rlhf"):  # one process per run directory
        res = train_rlhf(cfg, progress=not args.no_progress)
    last, nan = res.last, float("nan")
    print(f"[rlhf] {res.steps} steps in {res.seconds:.0f}s; last batch reward {last.get('reward', nan):.3f} "
          f"(base {last.get('reward_base', nan):.3f}), judge fallbacks {last.get('genrm_fallback_frac', nan):.1%}")
    if res.best_step is not None:
        print(f"[rlhf] best validation reward (verifiers) {res.best_val_reward:.3f} at step {res.best_step}: "
              f"{res.run_dir / 'best'}")
    print(f"[rlhf] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

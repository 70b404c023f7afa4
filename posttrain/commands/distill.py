"""``posttrain distill``: multi-teacher on-policy distillation (the stage is ``distill/stage.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/distill.yaml", "optim.lr=1e-6 train.steps=20 teachers.default=math")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.distill import DistillConfig
    from posttrain.distill.stage import train_distill

    cfg = load_config(DistillConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain distill"):  # one process per run directory
        res = train_distill(cfg, progress=not args.no_progress)
    last, nan = res.last, float("nan")
    print(f"[distill] {res.steps} steps in {res.seconds:.0f}s; last batch reward {last.get('reward', nan):.3f}, "
          f"reverse-KL estimate to the teachers {last.get('mopd_gap', nan):.4f} nats/token")
    for k in sorted(k for k in last if k.startswith("mopd_gap/")):
        print(f"[distill]   {k}: {last[k]:.4f}")
    if res.best_step is not None:
        print(f"[distill] best validation reward {res.best_val_reward:.3f} at step {res.best_step}: "
              f"{res.run_dir / 'best'}")
    print(f"[distill] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

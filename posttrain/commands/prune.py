"""``posttrain prune``: structured pruning from activation importance (the code is ``compress/``)."""

from __future__ import annotations

import argparse

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "a prune YAML (docs/prune.md)",
                         "model=embedded calibration.path=data/arith.jsonl target.params=1.0e8 out=runs/prune/model")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.configs.prune import PruneConfig
    from posttrain.compress.prune import run_prune

    cfg = load_config(PruneConfig, args.config, args.overrides)
    r = run_prune(cfg)
    print(f"[prune] {r.params_before / 1e6:.2f}M → {r.params_after / 1e6:.2f}M parameters: {r.sizes}")
    print(f"[prune] calibration log-likelihood {r.calib_loglik_before:.4f} → {r.calib_loglik_after:.4f} nats/token")
    print(f"[prune] checkpoint: {r.out}")
    return 0

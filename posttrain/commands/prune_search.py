"""``posttrain prune-search``: candidate architectures at one parameter count, each pruned and briefly
distilled, the best kept by a stated rule (the code is ``compress/search.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments

DESCRIPTION = """\
Which axes to cut to reach a parameter count (MiniPuzzle's idea, small): every candidate (a set of
axes: mlp_hidden, heads, hidden, layers, mamba_heads, experts) is cut from the same activation
importance to at most `params` parameters, distilled from the unpruned model for the same budget
(distill.train.steps x distill.train.batch_size conversations, `posttrain distill-logits`), and
scored on held-out rows. Chosen: the lowest held-out select.metric (kl or nll) after the budget;
within select.tie_tolerance nats/token, the fewest parameters, then the fastest decode, then list
order. Writes out/search.json, out/search.md and out/chosen (a plain HF directory). Every
candidate's sizes are checked before any weight is read. See docs/prune.md.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_recipe_arguments(p, "a prune-search YAML (docs/prune.md)",
                         "model=runs/sft/checkpoints/step_000060 params=1.0e8 calibration.path=data/arith.jsonl "
                         "\"distill.data.train=[{path: data/arith.jsonl}]\" "
                         "\"candidates=[{axes: [mlp_hidden]}, {axes: [layers]}]\"")


def run(args: argparse.Namespace) -> int:
    from posttrain.compress.search import run_search
    from posttrain.configs import load_config
    from posttrain.configs.prune import PruneSearchConfig
    from posttrain.train import run_lock

    cfg = load_config(PruneSearchConfig, args.config, args.overrides)
    with run_lock.hold(Path(cfg.out), "posttrain prune-search"):  # one search per directory
        r = run_search(cfg, progress=not args.no_progress)
    print(f"[prune-search] chosen: {r.chosen.name} ({r.chosen.params / 1e6:.3f}M parameters, held-out KL "
          f"{r.chosen.kl_after:.4f}, NLL {r.chosen.nll_after:.4f}); table: {r.out / 'search.md'}")
    print(f"[prune-search] checkpoint: {r.out / 'chosen'}  (loads with AutoModelForCausalLM.from_pretrained)")
    return 0

"""``posttrain quantize``: selective FP8 (E4M3) post-training quantization of a checkpoint.

    posttrain quantize --model runs/sft/final out=runs/quant/fp8            # the recipe's rule
    posttrain quantize --model tiny-nemotronh --search calibration.source=generic
    posttrain quantize -c recipes/quantize.yaml policy.type=searched \\
        policy.ranking=runs/quant/fp8-search/sensitivity.json policy.budget=4

Settings are ``configs/quant.py: QuantConfig`` (YAML and dotted overrides as in every stage).
Writes a compressed-tensors checkpoint (vLLM loads it; ``posttrain eval --model <out>`` evaluates
it with the exact FP8 rounding simulated on the CPU) and ``quant_report.json`` in it. ``--search``
first ranks the units by FP8 sensitivity and writes ``<out>-search/sensitivity.{json,md,png}``.
See docs/quantization.md.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=None, help="YAML config (QuantConfig)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. policy.type=all")
    p.add_argument("--model", default=None, help="model spec (overrides model=)")
    p.add_argument("--out", default=None, help="output directory (overrides out=)")
    p.add_argument("--search", action="store_true", help="run the per-unit sensitivity search first")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.configs.quant import QuantConfig
    from posttrain.quant.run import quantize

    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"model={args.model}")
    if args.out:
        overrides.append(f"out={args.out}")
    cfg = load_config(QuantConfig, args.config, overrides)
    quantize(cfg, search=args.search)
    return 0

"""``posttrain synth``: a synthetic SFT dataset from a config of columns (``data/synth.py``;
docs/synth.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """\
examples:
  posttrain synth --config recipes/synth/two_step_qa.yaml --out data/synth_qa.jsonl
  posttrain synth --config recipes/synth/instruction_personas.yaml --out data/synth_if.jsonl rows=200
  posttrain synth --config recipes/synth/two_step_qa.yaml --out data/synth_qa.jsonl --resume
  posttrain synth --config my.yaml --check          # validate the config and its DAG, load nothing

A config names columns (samplers, model columns, validators) and the output conversation:
  columns:
    topic:    {type: category, values: [tides, volcanoes], weights: [1, 2]}
    question: {type: model, prompt: "Write one question about {topic}."}
    answer:   {type: model, prompt: "{question}"}
    short:    {type: length, column: answer, max_words: 120}
  messages:
    - {role: user, content: "{question}"}
    - {role: assistant, content: "{answer}"}
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLES
    p.add_argument("--config", required=True, help="synth YAML (recipes/synth/)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rows=50 generation.model=embedded")
    p.add_argument("--out", help="output conversation JSONL (required unless --check)")
    p.add_argument("--model", help="generator: embedded, a checkpoint dir, http://host:port/v1[#model], "
                                     "vllm-server:MODEL (served by vllm serve from .venv-vllm; overrides generation.model)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run of the same config")
    p.add_argument("--check", action="store_true", help="check the config, its column DAG and seed files, then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs.base import load_config
    from posttrain.configs.synth import SynthConfig
    from posttrain.data.synth import SynthError, build_context, check_config, check_output, check_same_config, synthesize

    overrides = list(args.overrides) + ([f"generation.model={args.model}"] if args.model else [])
    cfg = load_config(SynthConfig, args.config, overrides)
    base_dir = Path(args.config).resolve().parent
    order = check_config(cfg, base_dir)  # a bad config fails here, before any model loads
    if args.check:
        print(f"ok: {len(cfg.columns)} columns in order {', '.join(order)}")
        return 0
    if not args.out:
        raise SynthError("--out is required (or pass --check)")
    out = Path(args.out)
    check_output(out, args.resume)
    if args.resume:
        check_same_config(cfg, out)
    ctx = build_context(cfg, base_dir)
    from posttrain.data.curate import make_teacher

    name, gen = make_teacher(cfg.generation.model, batch_size=cfg.generation.batch_rows)
    try:
        synthesize(cfg, gen, out, resume=args.resume, base_dir=base_dir, model_name=name,
                   progress=not args.no_progress, ctx=ctx)
    finally:
        if hasattr(gen, "close"):  # a vllm-server generator stops its server here, not at exit
            gen.close()
    return 0

"""``posttrain pipeline``: the whole recipe on the embedded model, resumable (the stages and what
the report holds are in ``experiments/pipeline.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain.configs.pipeline import PipelineConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes (see QUICK in posttrain/configs/pipeline.py)")
    p.add_argument("--config", "-c", help="YAML with PipelineConfig fields (see recipes/pipeline.yaml)")
    p.add_argument("--fresh", action="store_true", help="delete the run directory first instead of resuming")
    p.add_argument("--no-rlvr", action="store_true", help="skip the RLVR stage (and its after-RL measurement)")
    p.add_argument("--no-controls", action="store_true",
                   help="skip the RLVR stage's controls (SFT continued for its time and for its trained tokens, and "
                        "rejection sampling on the same rollouts, scored beside RL on the test table): the report "
                        "then has no RL − control")
    p.add_argument("--anchor-control", action="store_true",
                   help="also train the RLVR stage's SFT anchor alone (same rows, lr and steps, no reward) and "
                        "measure it on the same held-out sets: what in the stage's gain is the reward's")
    p.add_argument("--distill", action="store_true",
                   help="also run the distill stage: two RLVR specialists, then MOPD of both into the SFT model "
                        "(about three RL runs more)")
    p.add_argument("--rlhf", action="store_true",
                   help="also run the RLHF stage: train a GenRM with GRPO, then RLHF with it as the reward (opt-in)")
    p.add_argument("--curation", action="store_true",
                   help="also run the curation stage: curated vs unfiltered self-generated SFT data (~12 min more)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. sft_steps=30 n_eval=200 rl_steps=20")


FLAGS = (("quick", "--quick"), ("no_rlvr", "--no-rlvr"), ("no_controls", "--no-controls"),
         ("anchor_control", "--anchor-control"), ("distill", "--distill"),
         ("rlhf", "--rlhf"), ("curation", "--curation"))


def resume_command(args: argparse.Namespace) -> str:
    """The command that resumes this run: the same one without ``--fresh``."""
    import shlex

    words = ["posttrain", "pipeline"] + [flag for attr, flag in FLAGS if getattr(args, attr, False)]
    if args.config:
        words += ["--config", args.config]
    return " ".join(shlex.quote(w) for w in words + list(args.overrides))


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.configs.pipeline import QUICK, PipelineConfig
    from posttrain.train import run_lock

    overrides = ([f"{k}={v}" for k, v in QUICK.items()] if args.quick else []) + list(args.overrides)
    for flag, field in (("curation", "curation=true"), ("distill", "distill=true"), ("no_rlvr", "rlvr=false"),
                        ("no_rlvr", "rft_arm=false"),
                        ("rlhf", "rlhf=true"), ("anchor_control", "anchor_control=true")):
        if getattr(args, flag, False):
            overrides.append(field)
    if getattr(args, "no_controls", False):
        overrides += ["sft_arm=false", "tokens_arm=false", "rft_arm=false"]
    cfg = load_config(PipelineConfig, args.config, overrides)
    with run_lock.hold(Path(cfg.run_dir), "posttrain pipeline") as run_dir:
        if args.fresh:
            run_lock.clear(run_dir)
        print(f"[pipeline] run directory: {run_dir} (re-run the same command to resume)")
        return _run_or_say_where(cfg, run_dir, args)


def _run_or_say_where(cfg: PipelineConfig, run_dir: Path, args: argparse.Namespace) -> int:
    import sys

    from posttrain.experiments import stages
    from posttrain.experiments.pipeline import run_pipeline

    stages.RUNNING.clear()
    try:
        return run_pipeline(cfg, run_dir, resume_command(args))
    except KeyboardInterrupt:
        done = sorted(p.stem for p in (run_dir / "stages").glob("*.json"))
        where = " > ".join(stages.RUNNING) or "between stages"
        print(f"\n[pipeline] interrupted during stage {where}. Finished stages are kept in {run_dir}/stages "
              f"({', '.join(done) or 'none yet'}); an SFT or RL run resumes from its last checkpoint.\n"
              f"[pipeline] resume with: {resume_command(args)}", file=sys.stderr, flush=True)
        raise

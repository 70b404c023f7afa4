"""The ``posttrain`` command: one subcommand per stage.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``.
Only the chosen subcommand's module is imported, after argument parsing has picked it, so
``posttrain --help`` stays instant (no torch / transformers import).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name → (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "setup": ("posttrain.commands.setup", "convert the embedded model once and check the install"),
    "precision": ("posttrain.commands.precision", "this machine's bf16/fp32 matmul probe and what precision=auto picks"),
    "pipeline": ("posttrain.commands.pipeline", "run the whole recipe on the embedded model and report what it achieved"),
    "sft": ("posttrain.commands.sft", "supervised fine-tuning on conversation JSONL (packing, WSD, LoRA, resume)"),
    "rl": ("posttrain.commands.rl", "multi-environment RLVR with GRPO: curriculum, overlong/dynamic filters, masked IS, frozen MoE routers (resumable)"),
    "distill": ("posttrain.commands.distill", "multi-teacher on-policy distillation: each domain's teacher scores the student's rollouts (per-token reverse KL)"),
    "genrm": ("posttrain.commands.genrm", "train a generative reward model with GRPO on preference pairs (both orders); --mine writes pairs from verifiable environments"),
    "rlhf": ("posttrain.commands.rlhf", "RLHF: the GenRM compares each prompt's responses in a ring, plus group-relative length control"),
    "dpo": ("posttrain.commands.dpo", "direct preference optimisation on pairs JSONL (sigmoid, IPO, optional SFT term; cached reference log-probs)"),
    "dpo-pairs": ("posttrain.commands.dpo_pairs", "mine tool-hallucination DPO pairs from a model's own samples (tool call = rejected, plain answer = chosen)"),
    "tool-decisions": ("posttrain.commands.tool_decisions", "tool use where a tool fits: the model's call (or plain reply) at each turn of the banking expert's held-out episodes"),
    "profile": ("posttrain.commands.profile", "sample k rollouts per training task and write the pass-rate profile JSONL for the RL curriculum"),
    "validate": ("posttrain.commands.validate", "score a model on an RL run's held-out tasks, per task; --against: paired gain over another model"),
    "make-data": ("posttrain.commands.make_data", "write a generated SFT dataset (e.g. arithmetic with short reasoning)"),
    "curate": ("posttrain.commands.curate", "generate, verify, filter and dedup SFT data from a teacher pool (resumable; --refresh merges a new pool)"),
    "synth": ("posttrain.commands.synth", "synthetic SFT data from a config of columns: samplers, model columns, validators with retries (resumable)"),
    "profile-data": ("posttrain.commands.profile_data", "behaviour profile of an SFT JSONL: lengths, turns, tool use, co-occurrence"),
    "prune": ("posttrain.commands.prune", "structured pruning (Minitron): activation importance on calibration rows, then width/depth cut to a smaller HF checkpoint"),
    "prune-search": ("posttrain.commands.prune_search", "which axes to prune to a parameter count: candidates cut, briefly distilled and scored on held-out rows; the best by a stated rule"),
    "distill-logits": ("posttrain.commands.distill_logits", "knowledge distillation after pruning: a student learns a teacher's logits on SFT data (forward KL, top-k, temperature, cache)"),
    "quantize": ("posttrain.commands.quantize", "selective FP8 (E4M3) post-training quantization: calibration, sensitivity search, compressed-tensors export"),
    "eval": ("posttrain.commands.eval", "evaluate a model on environments: accuracy, avg@k, pass@k"),
    "envs": ("posttrain.commands.envs", "list environments or print sample tasks"),
    "redteam": ("posttrain.commands.redteam", "audit an environment's reward with reward-hacking cases (lazy replies must score 0, valid ones 1)"),
    "serve-env": ("posttrain.commands.serve_env", "serve an environment over HTTP (NeMo Gym resource-server contract)"),
    "chat": ("posttrain.commands.chat", "render a conversation with the chat template, or chat with a model"),
}

EPILOG = """\
examples:
  posttrain pipeline --quick             # the whole recipe, small, on the embedded model
  posttrain sft --config recipes/sft.yaml optim.lr=1e-4 train.steps=50
  posttrain eval --env math --model embedded --n 50 --k 4
  posttrain serve-env math --port 8000
Run `posttrain COMMAND --help` for a command's options.
"""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="Nemotron-style post-training that runs on a laptop CPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (_, help_) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_, description=help_)
    return parser, subparsers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "torch" not in sys.modules:  # OpenMP reads these once, when torch starts (models/threads.py)
        from posttrain.models.threads import set_thread_defaults

        set_thread_defaults()
    parser, subparsers = build_parser()
    # Parse the command name first; only then import that command's module for its options.
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in COMMANDS:
        module = importlib.import_module(COMMANDS[first][0])
        module.add_arguments(subparsers[first])
    args = parser.parse_args(argv)
    if args.version:
        from posttrain import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 0
    module = importlib.import_module(COMMANDS[args.command][0])
    bars = None
    if getattr(args, "no_progress", False):  # no bar means none: transformers' loading / saving bars too
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted: the last checkpoint (if any) is kept; re-run the same command to resume",
              file=sys.stderr)
        return 130
    except Exception as e:  # user-facing errors get one clear line, not a traceback
        from posttrain.errors import UserError

        if isinstance(e, UserError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    finally:
        if bars:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())

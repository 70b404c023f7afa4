"""``posttrain genrm``: train a generative reward model with GRPO on preference pairs (the RL stage
on the ``genrm`` environment; ``train/rlhf.py``). ``--mine OUT.jsonl`` instead writes preference
pairs mined from a model's own samples on verifiable environments (``envs/genrm/pairs.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posttrain.commands.recipe_args import add_recipe_arguments
from posttrain.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/genrm.yaml", "envs='[{name: genrm, args: {pairs: prefs.jsonl}}]' train.steps=20")
    p.add_argument("--mine", metavar="OUT.jsonl", help="write mined pairs instead of training (uses --envs, "
                   "--n, --k and the config's model)")
    p.add_argument("--eval", metavar="MODEL", help="measure MODEL (spec, HF directory or http:// endpoint) as a judge "
                   "on the config's held-out pairs instead of training: agreement, format errors, position bias")
    p.add_argument("--warmstart", metavar="OUT.jsonl", help="write SFT rows that teach the verdict format (train "
                   "pairs only) instead of training; then `posttrain sft data.train=OUT.jsonl` and start GRPO from it")
    p.add_argument("--verdicts", choices=("random", "truth"), default="random", help="with --warmstart: random "
                   "verdicts teach the format only (no preference, no position information); truth = supervised")
    p.add_argument("--reasoning", choices=("restate", "cue"), default="restate", help="with --warmstart --verdicts "
                   "truth: the reasoning line before the verdict: restate both answers, or name the visible defect "
                   "and the response that has it")
    p.add_argument("--split", choices=("dev", "test"), default="test", help="with --eval: the held-out pairs to judge "
                   "(dev to choose a checkpoint or a setting, test to report; never choose on test)")
    p.add_argument("--out", help="with --eval: write the figures (JSON) here and the per-task replies beside it")
    p.add_argument("--eval-temperature", type=float, default=0.0, help="with --eval: sample the judge at this "
                   "temperature (0: greedy), as an RLHF run with judge.temperature does")
    p.add_argument("--eval-samples", type=int, default=1, help="with --eval and a temperature: verdicts per task")
    p.add_argument("--envs", default="math", help="with --mine: comma-separated verifiable environments")
    p.add_argument("--n", type=int, default=32, help="with --mine: tasks per environment")
    p.add_argument("--k", type=int, default=4, help="with --mine: samples per task")


def mine(args: argparse.Namespace, cfg: object) -> int:
    from posttrain.envs.base import make_env
    from posttrain.envs.genrm.judge import make_generator
    from posttrain.envs.genrm.pairs import mine_pairs, write_pairs

    gen = make_generator(cfg.model)  # type: ignore[attr-defined]
    pairs = []
    for name in args.envs.split(","):
        env = make_env(name)
        pairs += mine_pairs(gen, env, env.tasks("train", args.n), args.k, cfg.rollout.max_new_tokens)  # type: ignore[attr-defined]
    write_pairs(pairs, args.mine)
    print(f"[genrm] {len(pairs)} pairs from {args.n} tasks per environment ({args.envs}): {args.mine}")
    return 0


def warmstart(args: argparse.Namespace, cfg: object) -> int:
    import json
    from pathlib import Path

    from posttrain.serving.build import build_envs
    from posttrain.envs.genrm.env import warmstart_conversations

    spec = cfg.envs[0]  # type: ignore[attr-defined]
    try:
        rows = warmstart_conversations(build_envs([spec])["genrm"], args.verdicts, spec.train_tasks or None,
                                       reasoning=args.reasoning)
    except ValueError as e:
        raise UserError(str(e)) from None
    out = Path(args.warmstart)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"[genrm] {len(rows)} warm-start rows ({args.verdicts} verdicts, {args.reasoning} reasoning, train pairs "
          f"only): {out}")
    return 0


def evaluate(args: argparse.Namespace, cfg: object) -> int:
    import json
    from pathlib import Path

    from posttrain.serving.build import build_envs
    from posttrain.envs.genrm.evaluate import genrm_agreement
    from posttrain.envs.genrm.judge import make_generator

    spec = cfg.envs[0]  # type: ignore[attr-defined]
    if args.eval_samples < 1 or args.eval_temperature < 0 or (args.eval_samples > 1 and args.eval_temperature == 0):
        raise UserError(f"--eval-samples {args.eval_samples} --eval-temperature {args.eval_temperature}: need "
                        "samples >= 1, temperature >= 0, and a temperature > 0 for several samples")
    gen = make_generator(None, args.eval) if args.eval.startswith(("http://", "https://")) else make_generator(args.eval)
    out = Path(args.out) if args.out else None
    figures = genrm_agreement(gen, build_envs([spec])["genrm"], args.split, spec.val_tasks or None,
                              cfg.rollout.max_new_tokens, cfg.rollout.reasoning,  # type: ignore[attr-defined]
                              out.with_suffix(".replies.jsonl") if out else None,
                              args.eval_temperature, args.eval_samples, cfg.train.seed)  # type: ignore[attr-defined]
    for k, v in figures.items():
        print(f"[genrm] {k:32s} {v:.3f}")
    if out:
        out.write_text(json.dumps({"model": args.eval, "split": args.split, "temperature": args.eval_temperature,
                                   "samples": args.eval_samples, **figures}, indent=2))
    return 0


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.train import run_lock
    from posttrain.configs.rlhf import GenRMConfig
    from posttrain.train.rlhf import train_genrm

    cfg = load_config(GenRMConfig, args.config, args.overrides)
    if args.mine:
        return mine(args, cfg)
    if args.eval:
        return evaluate(args, cfg)
    if args.warmstart:
        return warmstart(args, cfg)
    with run_lock.hold(Path(cfg.run_dir), "posttrain genrm"):  # one process per run directory
        res = train_genrm(cfg, progress=not args.no_progress)
    last, nan = res.last, float("nan")
    print(f"[genrm] {res.steps} steps in {res.seconds:.0f}s; last batch reward {last.get('reward', nan):.3f} "
          "(1 = every judgement exact, 0 = format error)")
    if res.best_step is not None:
        print(f"[genrm] best held-out reward {res.best_val_reward:.3f} at step {res.best_step}: {res.run_dir / 'best'}")
    print(f"[genrm] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

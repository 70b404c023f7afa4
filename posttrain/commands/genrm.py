"""``posttrain genrm``: train a generative reward model with GRPO on preference pairs (the RL stage
on the ``genrm`` environment; ``train/rlhf.py``). ``--mine OUT.jsonl`` instead writes preference
pairs mined from a model's own samples on verifiable environments (``envs/genrm/pairs.py``)."""

from __future__ import annotations

import argparse

from posttrain.commands.recipe_args import add_recipe_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_recipe_arguments(p, "recipes/genrm.yaml", "envs='[{name: genrm, args: {pairs: prefs.jsonl}}]' train.steps=20")
    p.add_argument("--mine", metavar="OUT.jsonl", help="write mined pairs instead of training (uses --envs, "
                   "--n, --k and the config's model)")
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


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config
    from posttrain.configs.rlhf import GenRMConfig
    from posttrain.train.rlhf import train_genrm

    cfg = load_config(GenRMConfig, args.config, args.overrides)
    if args.mine:
        return mine(args, cfg)
    res = train_genrm(cfg, progress=not args.no_progress)
    last, nan = res.last, float("nan")
    print(f"[genrm] {res.steps} steps in {res.seconds:.0f}s; last batch reward {last.get('reward', nan):.3f} "
          "(1 = every judgement exact, 0 = format error)")
    if res.best_step is not None:
        print(f"[genrm] best held-out reward {res.best_val_reward:.3f} at step {res.best_step}: {res.run_dir / 'best'}")
    print(f"[genrm] checkpoint: {res.checkpoint}  (metrics: {res.run_dir / 'metrics.jsonl'})")
    return 0

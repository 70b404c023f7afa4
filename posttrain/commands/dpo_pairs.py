"""``posttrain dpo-pairs``: mine tool-hallucination DPO pairs from a model's own samples
(``train/dpo_pairs.py``): prompts with no tools or unfitting ones; a tool-calling sample is
rejected, a plain answer chosen."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded", help="the model whose samples are mined (e.g. an SFT checkpoint)")
    p.add_argument("--out", required=True, help="pairs JSONL to write")
    p.add_argument("--envs", default="math,mcq", help="comma-separated environments whose tasks need no tool")
    p.add_argument("--split", default="train", choices=["train", "validation"])
    p.add_argument("--n", type=int, default=64, help="prompts per environment")
    p.add_argument("--k", type=int, default=8, help="samples per prompt")
    p.add_argument("--tools", default="both", choices=["none", "unfitting", "both"],
                   help="offer no tools, unfitting ones, or alternate (default)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from posttrain.envs.base import make_env
    from posttrain.envs.genrm.judge import make_generator
    from posttrain.train.dpo_pairs import tool_hallucination_pairs

    gen = make_generator(args.model)
    rows, total = [], {}
    for name in args.envs.split(","):
        env = make_env(name)
        mine, stats = tool_hallucination_pairs(gen, env, env.tasks(args.split, args.n, args.seed), args.k, args.tools,
                                               args.max_new_tokens, args.temperature, args.seed)
        rows += mine
        total = {k: total.get(k, 0) + v for k, v in stats.items()}
        print(f"[dpo-pairs] {name}: {stats}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    rate = total.get("tool_calls", 0) / max(total.get("samples", 1), 1)
    print(f"[dpo-pairs] {len(rows)} pairs; tool-call rate of the samples {rate:.1%}: {out}")
    return 0

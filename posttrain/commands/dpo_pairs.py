"""``posttrain dpo-pairs``: mine tool-hallucination DPO pairs from a model's own samples
(``train/dpo_pairs.py``): prompts with no tools or unfitting ones; a tool-calling sample is
rejected, a plain answer chosen. It prints the tool-call rate per prompt with its standard error
across prompts, overall and per tools offered; ``--rates`` writes the per-prompt rates and
``--against`` another model's rates file prints the paired change on the same prompts."""

from __future__ import annotations

import argparse

from posttrain.envs.splits import SPLITS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded", help="the model whose samples are mined (e.g. an SFT checkpoint)")
    p.add_argument("--out", required=True, help="pairs JSONL to write")
    p.add_argument("--envs", default="math,mcq", help="comma-separated environments whose tasks need no tool")
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--n", type=int, default=64, help="prompts per environment")
    p.add_argument("--k", type=int, default=8, help="samples per prompt")
    p.add_argument("--tools", default="both", choices=["none", "unfitting", "both"],
                   help="offer no tools, unfitting ones, or alternate (default)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain-fallback", action="store_true",
                   help="a prompt with unfitting tools whose samples all call one: take the chosen plain answer from k "
                        "samples of the same question without tools (train/dpo_pairs.py)")
    p.add_argument("--rates", default=None, help="write each prompt's tool-call rate (JSONL, the rows of posttrain validate)")
    p.add_argument("--against", default=None, help="another model's --rates file on the same prompts: print the paired change")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from posttrain.errors import UserError

    if args.against and not Path(args.against).is_file():
        raise UserError(f"--against {args.against}: no such file (write it first with posttrain dpo-pairs --rates)")

    from posttrain.envs.base import make_env
    from posttrain.envs.genrm.judge import make_generator
    from posttrain.eval.compare import mean_and_se
    from posttrain.train.dpo_pairs import tool_hallucination_pairs

    gen = make_generator(args.model)
    rows, total, rates = [], {}, []
    for name in args.envs.split(","):
        env = make_env(name)
        mine, stats, per_prompt = tool_hallucination_pairs(gen, env, env.tasks(args.split, args.n, args.seed), args.k,
                                                           args.tools, args.max_new_tokens, args.temperature, args.seed,
                                                           args.plain_fallback)
        rows += mine
        rates += per_prompt
        total = {k: total.get(k, 0) + v for k, v in stats.items()}
        print(f"[dpo-pairs] {name}: {stats}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    groups = {"all": rates, **{f"tools={o}": [r for r in rates if r["tools"] == o] for o in ("none", "unfitting")}}
    for label, group in groups.items():
        if group:
            mean, se = mean_and_se([r["reward"] for r in group])
            print(f"[dpo-pairs] tool-call rate ({label}): {mean:.1%} ± {se:.1%} (se across {len(group)} prompts, "
                  f"{sum(r['tool_calls'] for r in group)}/{sum(r['samples'] for r in group)} samples)")
    print(f"[dpo-pairs] {len(rows)} pairs: {out}")
    if args.rates:
        Path(args.rates).parent.mkdir(parents=True, exist_ok=True)
        Path(args.rates).write_text("".join(json.dumps(r) + "\n" for r in rates))
        print(f"[dpo-pairs] per-prompt rates: {args.rates}")
    if args.against:
        from posttrain.commands.validate import format_gains
        from posttrain.eval.compare import read_task_rewards

        now = {}
        for r in rates:
            now.setdefault(r["env"], {})[r["task_id"]] = r["reward"]
        try:
            print("tool-call rate, paired over the same prompts (before = --against):")
            print(format_gains(read_task_rewards(args.against), now))
        except ValueError as e:
            raise UserError(f"--against: {e}") from e
    return 0

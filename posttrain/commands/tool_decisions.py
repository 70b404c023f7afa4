"""``posttrain tool-decisions``: tool use where a tool fits, one turn at a time (``eval/tool_decisions.py``):
at every assistant turn of the banking expert's verified held-out episodes, does the model call a
tool when the expert does (and the same call), and write plainly when the expert does?"""

from __future__ import annotations

import argparse

from posttrain.envs.splits import SPLITS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="embedded", help="model spec or checkpoint directory")
    p.add_argument("--out", required=True, help="per-point JSONL to write (the rows of posttrain validate, plus the reply)")
    p.add_argument("--split", default="test", choices=SPLITS)
    p.add_argument("--n", type=int, default=12, help="banking tasks whose expert episodes give the points")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--against", default=None, help="another model's --out on the same points: print the paired change")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from posttrain.errors import UserError

    if args.against and not Path(args.against).is_file():
        raise UserError(f"--against {args.against}: no such file (write it first with posttrain tool-decisions --out)")

    from posttrain.commands.validate import format_gains
    from posttrain.engines.hf import HFGenerator
    from posttrain.eval.tool_decisions import banking_decision_points, per_task, score_decisions
    from posttrain.eval.compare import mean_and_se

    points = banking_decision_points(args.split, args.n, args.seed)
    rows = score_decisions(HFGenerator.from_spec(args.model), points, args.max_new_tokens)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tasks = per_task(rows)
    for env in ("banking@call", "banking@call_exact", "banking@plain"):
        mean, se = mean_and_se(list(tasks.get(env, {}).values()))
        n_points = sum(r["env"] == env for r in rows)
        print(f"[tool-decisions] {env}: {mean:.1%} ± {se:.1%} (mean of per-task means, se across "
              f"{len(tasks.get(env, {}))} tasks; {n_points} points)")
    print(f"[tool-decisions] per point: {out}")
    if args.against:
        try:
            before = per_task([json.loads(x) for x in Path(args.against).read_text().splitlines() if x.strip()])
            print("paired over the same tasks (before = --against):")
            print(format_gains(before, tasks))
        except (ValueError, KeyError) as e:
            raise UserError(f"--against {args.against}: not a tool-decisions file ({e})") from e
    return 0

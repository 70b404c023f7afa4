"""``posttrain make-data``: write a generated SFT dataset (the generators are in ``data/synthetic.py``)."""

from __future__ import annotations

import argparse

from posttrain.data.synthetic import KINDS
from posttrain.envs.splits import SPLITS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=sorted(KINDS),
                   help="arithmetic: sums / differences / products with a worked reasoning; banking: the banking "
                        "environment's scripted expert, whole verified tool-use episodes (data/tool_demos.py)")
    p.add_argument("--n", type=int, default=2000, help="number of rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=SPLITS, default="train", help="train, dev (choose settings) or test (report)")
    p.add_argument("--max-digits", type=int, default=2, help="arithmetic: largest operand size in digits")
    p.add_argument("--out", required=True, help="output JSONL path")


def run(args: argparse.Namespace) -> int:
    from posttrain.data.conversations import write_jsonl

    n = write_jsonl(KINDS[args.kind](args.n, args.seed, args.split, max_digits=args.max_digits), args.out)
    print(f"wrote {n} rows to {args.out}")
    return 0

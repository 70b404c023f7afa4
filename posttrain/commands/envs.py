"""``posttrain envs``: list the registered environments, or print sample tasks of one."""

from __future__ import annotations

import argparse

from posttrain.envs.splits import SPLITS
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="environment to show samples of (omit to list all)")
    p.add_argument("--n", type=int, default=3, help="number of sample tasks")
    p.add_argument("--split", choices=SPLITS, default="dev")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from posttrain.envs.base import ENVIRONMENTS, make_env

    if not args.name:
        make_env("math")  # registers the built-ins
        for name in ENVIRONMENTS.names():
            cls = ENVIRONMENTS.get(name)
            import sys

            doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
            print(f"{name:24s} {cls.domain:24s} {'multi-turn' if cls.multi_turn else 'single-turn':12s} {doc[0] if doc else ''}")
        return 0
    env = make_env(args.name)
    for t in env.tasks(args.split, n=args.n, seed=args.seed):
        print(f"--- {t.id} ({t.domain})")
        for m in t.messages:
            print(f"[{m['role']}] {m.get('content', '')}")
        print(f"[ground truth] {json.dumps(t.ground_truth)[:500]}")
    return 0

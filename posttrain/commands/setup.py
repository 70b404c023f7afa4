"""``posttrain setup``: convert the embedded model once and check that the install works offline."""

from __future__ import annotations

import argparse
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="re-convert the embedded model even if cached")
    p.add_argument("--skip-model", action="store_true", help="only check imports and the environments")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import cache_dir

    print(f"cache directory: {cache_dir()}  (set POSTTRAIN_CACHE to move it)")
    if not args.skip_model:
        from posttrain.models.loading import convert_embedded, embedded_dir

        t = time.time()
        cached = embedded_dir().joinpath("config.json").exists() and not args.force
        path = convert_embedded(force=args.force)
        print(f"embedded model: {path} ({'cached' if cached else f'converted in {time.time() - t:.0f}s'})")
    from posttrain.envs.base import ENVIRONMENTS, make_env

    make_env("math")  # imports and registers every built-in environment
    print(f"environments: {', '.join(ENVIRONMENTS.names())}")
    from posttrain.models.tiny import tiny_tokenizer

    tiny_tokenizer()
    from posttrain.models.precision import decide, machine_probe

    probe = machine_probe()  # measured once per machine (cached); `posttrain precision` for details
    print(decide(probe, "sft").line())
    print("setup complete")
    return 0

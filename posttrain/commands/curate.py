"""``posttrain curate``: generate, verify, filter and dedup SFT data from a teacher pool (the pipeline,
its modes and its output rows: ``data/curate.py``; docs/curation.md)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from posttrain.configs.curate import CurateConfig, DedupConfig, FiltersConfig
from posttrain.data.curate import (DEFAULT_RUBRIC, CurateError, GeneratingTeacherPool, check_output, curate,
                                   judge_verifier, make_teacher, read_prompts, routing_verifier)
from posttrain.envs.splits import SPLITS


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--env", help="take the prompts from this environment's tasks (it also verifies them)")
    src.add_argument("--prompts", help="JSONL of prompts {id, messages, tools?, ground_truth?, env?}")
    p.add_argument("--split", default="train", choices=SPLITS, help="environment split (default: train)")
    p.add_argument("--limit", type=int, default=None, help="number of environment tasks (default: the environment's)")
    p.add_argument("--teacher", action="append", required=True, metavar="[NAME=]SPEC",
                   help="a teacher: a model spec (embedded, a checkpoint dir) or http://host:port/v1[#model]; repeat for a pool")
    p.add_argument("--n", type=int, default=4, help="candidates per prompt, split across the teachers (default: 4)")
    p.add_argument("--k", type=int, default=2, help="at most this many kept rows per prompt (default: 2)")
    p.add_argument("--out", required=True, help="output SFT JSONL")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue an interrupted run")
    mode.add_argument("--refresh", action="store_true", help="merge this teacher pool's candidates into the existing output")
    p.add_argument("--reasoning-off-frac", type=float, default=0.0, help="share of rows with reasoning stripped (recipe: 0.10)")
    p.add_argument("--budget-frac", type=float, default=0.0, help="share of rows with reasoning truncated (recipe: 0.03)")
    p.add_argument("--judge", help="LLM judge spec (model spec or URL) for prompts no environment verifies")
    p.add_argument("--rubric", default=DEFAULT_RUBRIC, help="judge rubric")
    p.add_argument("--min-reward", type=float, default=None,
                   help="accept a candidate at or above this reward (default: 1.0; 0.7 when only the judge verifies)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0, help="task, sampling and transform seed")
    p.add_argument("--batch-prompts", type=int, default=8, help="prompts per generation call")
    p.add_argument("--dedup-threshold", type=float, default=0.8, help="estimated Jaccard for near-duplicates (default: 0.8)")
    p.add_argument("--no-global-dedup", action="store_true", help="dedup only within each prompt")
    p.add_argument("--block-pattern", action="append", default=[], metavar="NAME=REGEX",
                   help="an extra keyword-filter regex (repeatable)")
    p.add_argument("--filter-option", action="append", default=[], metavar="FILTER.FIELD=VALUE",
                   help="filter setting, value as JSON, e.g. length.max_words=2000 (repeatable)")


def _filters_config(args: argparse.Namespace) -> FiltersConfig:
    from posttrain.data.sft_filters import DEFAULT_PATTERNS, check_names

    options: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in args.filter_option:
        key, sep, value = item.partition("=")
        fname, dot, fld = key.partition(".")
        if not sep or not dot:
            raise CurateError(f"--filter-option {item!r}: expected FILTER.FIELD=VALUE")
        try:
            options[fname][fld] = json.loads(value)
        except json.JSONDecodeError:
            options[fname][fld] = value
    if args.block_pattern:
        patterns = dict(options["keywords"].get("patterns", DEFAULT_PATTERNS))
        for item in args.block_pattern:
            name, sep, rx = item.partition("=")
            if not sep:
                raise CurateError(f"--block-pattern {item!r}: expected NAME=REGEX")
            patterns[name] = rx
        options["keywords"]["patterns"] = patterns
    try:
        cfg = FiltersConfig(options=dict(options))
        check_names(cfg)  # before any teacher loads
        return cfg
    except (ValueError, KeyError) as e:
        raise CurateError(f"filter options: {e}") from None


def run(args: argparse.Namespace) -> int:
    from posttrain.envs.base import make_env
    from posttrain.engines.base import SamplingParams

    env = make_env(args.env) if args.env else None
    if env is not None:
        tasks = env.tasks(args.split, args.limit, args.seed)
        verify_fn = env.verify
    else:
        tasks = read_prompts(args.prompts)
        default = None
        if args.judge:
            from posttrain.envs.judge import make_judge

            default = judge_verifier(make_judge(args.judge), args.rubric)
        verify_fn = routing_verifier(default)
        if default is None and any(not t.metadata.get("env") for t in tasks):
            raise CurateError(f"{args.prompts}: some prompts name no env; pass --judge to verify them")
    min_reward = args.min_reward
    if min_reward is None:
        min_reward = 0.7 if env is None and args.judge else 1.0
    try:
        cfg = CurateConfig(
            out=Path(args.out), k=args.k, min_reward=min_reward, resume=args.resume, refresh=args.refresh,
            reasoning_off_frac=args.reasoning_off_frac, budget_frac=args.budget_frac, seed=args.seed,
            batch_prompts=args.batch_prompts, filters=_filters_config(args),
            dedup=DedupConfig(threshold=args.dedup_threshold, global_threshold=args.dedup_threshold,
                              global_dedup=not args.no_global_dedup),
        )
    except ValueError as e:
        raise CurateError(f"invalid settings: {e}") from None
    check_output(cfg)  # a wrong --out fails now, not after the teachers have loaded
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed)
    teachers = [make_teacher(s) for s in args.teacher]
    if len({n for n, _ in teachers}) != len(teachers):
        raise CurateError("two teachers share a name; name them NAME=SPEC")
    pool = GeneratingTeacherPool(teachers, args.n, params, env)
    curate(tasks, pool, verify_fn, cfg)
    return 0

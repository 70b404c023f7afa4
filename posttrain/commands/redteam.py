"""``posttrain redteam ENV``: run the reward-hacking red-team cases against an environment.

Each case (``posttrain/eval/redteam.py``) builds a crafted transcript from a task — constants,
empty replies, echoes of the prompt, format-only replies, answer lists, exit tricks, forged
result lines, always-equal objects, tag injection, extra tool calls, which must score 0, and
correct answers in unusual forms, which must score 1 — and the environment's own ``verify``
grades it. One line per case, then a summary; the exit status is 1 if any case misbehaved (a hack
earned reward, a valid answer lost it, or ``verify`` raised), so this can gate CI for your own
environments too: the generic cases apply to any registered environment.

    posttrain redteam code
    posttrain redteam code --arg reward=fraction      # see what partial credit would pay
    posttrain redteam instruction_multiturn --judge http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json

from posttrain.envs.splits import SPLITS

# Environments whose reward asks an LLM judge; without --judge they get one that approves
# everything, so the cases test what the program itself checks.
JUDGED = ("instruction_multiturn",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("env", help="environment name (see `posttrain envs`)")
    p.add_argument("--n", type=int, default=6, help="tasks per case (default 6)")
    p.add_argument("--split", choices=SPLITS, default="dev")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="environment constructor argument (value parsed as JSON if it can be), "
                        "e.g. --arg reward=fraction; repeatable")
    p.add_argument("--judge", default=None,
                   help="judge spec for judged environments (default: an approve-all stub)")
    p.add_argument("--case", action="append", default=[], metavar="NAME",
                   help="run only these cases (repeatable)")
    p.add_argument("--verbose", "-v", action="store_true", help="print every task's reward and reason")


def _env_args(pairs: list[str]) -> dict:
    from posttrain.errors import UserError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--arg expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    from posttrain.eval import redteam
    from posttrain.envs.base import ENVIRONMENTS, make_env
    from posttrain.errors import UserError

    make_env("math")  # registers the built-in environments
    if args.env not in ENVIRONMENTS.names():
        raise UserError(f"unknown environment {args.env!r}; known: {', '.join(ENVIRONMENTS.names())}")
    if args.n < 1:
        raise UserError(f"--n must be at least 1, got {args.n}")
    kwargs = _env_args(args.arg)
    judge_note = ""
    if args.env in JUDGED and "judge" not in kwargs:
        kwargs["judge"] = args.judge or redteam.ApproveAllJudge()
        judge_note = f"judge: {args.judge}" if args.judge else "judge: approve-all stub (10/10 for every judged reply)"
    try:
        env = make_env(args.env, **kwargs)
    except TypeError as e:
        raise UserError(f"bad environment arguments {kwargs}: {e}") from None
    except ValueError as e:
        raise UserError(f"bad environment arguments: {e}") from None
    cases = redteam.cases_for(args.env)
    if args.case:
        unknown = sorted(set(args.case) - {c.name for c in cases})
        if unknown:
            raise UserError(f"unknown case(s) {unknown}; known: {', '.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in args.case]
    tasks = redteam.sample_tasks(env, args.env, args.n, args.split, args.seed)
    generic_only = args.env not in redteam.CASES
    print(f"red team: {args.env}, {len(cases)} cases on {len(tasks)} {args.split} tasks (seed {args.seed})"
          + (f"; {judge_note}" if judge_note else "")
          + ("; no environment-specific cases registered, generic ones only" if generic_only else ""))
    results = redteam.audit(env, args.env, tasks, cases)
    bad = [r for r in results if not r.ok]
    unused = [r for r in results if r.applied == 0]
    for r in results:
        status = "n/a " if r.applied == 0 else ("ok  " if r.ok else "FAIL")
        rewards = [x[1] for x in r.rewards]
        span = "-" if not rewards else (f"{min(rewards):.2f}" if min(rewards) == max(rewards)
                                        else f"{min(rewards):.2f}..{max(rewards):.2f}")
        print(f"{status} {r.case.kind:5s} {r.case.name:34s} expect {r.case.expect:.0f}  "
              f"reward {span:10s} on {r.applied:2d}  {r.case.what}")
        if not r.ok or args.verbose:
            for tid, reward, reason in (r.rewards if args.verbose else r.bad):
                print(f"       {tid}: reward {reward:.2f}: {reason[:200]}")
            for tid, err in r.errors:
                print(f"       {tid}: ERROR {err}")
    hacks = sum(1 for r in results if r.case.kind == "hack")
    print(f"summary: {len(results)} cases ({hacks} hacks, {len(results) - hacks} valid answers), "
          f"{len(bad)} misbehaved, {len(unused)} applied to none of the {len(tasks)} tasks"
          + (": " + ", ".join(r.case.name for r in bad) if bad else ""))
    return 1 if bad else 0

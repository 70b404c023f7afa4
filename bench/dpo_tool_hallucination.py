"""The table of docs/results/dpo_tool_hallucination.md from its measurement files (issue 13 (c)).

    python bench/dpo_tool_hallucination.py --dir runs/dpo_ev --before sft --after dpo
    python bench/dpo_tool_hallucination.py --split test --dir runs/dpo_test/s0 --dir runs/dpo_test/s1

Several ``--dir`` (one per seed, ``bash bench/dpo_evidence.sh``): each seed's table, then per measure the
mean change over seeds with the standard error from the seeds' paired errors, and the spread between
seeds (half the range for two) beside it.

Reads, for each of the two models, the files the doc's commands write into ``--dir``:
``rates_<tag>.jsonl`` (``posttrain dpo-pairs --rates``: each held-out prompt's tool-call rate),
``decisions_<tag>.jsonl`` (``posttrain tool-decisions``: tool use where a tool fits) and
``heldout_<tag>.jsonl`` (``posttrain validate -c recipes/dpo_heldout.yaml``: math / mcq scores).
Every row of the table is paired over the same prompts or tasks (``eval/compare.py``); decision
points are averaged per task first (``eval/tool_decisions.py: per_task``). Prints the markdown table,
then ``RESULT dpo_tool_hallucination: ...``, and appends the figures to
``bench/results/dpo_tool_hallucination.jsonl``. It runs no model: the measurements are the commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from results_row import DATA_SPLITS, append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

from posttrain.eval.compare import paired_gain, read_task_rewards
from posttrain.eval.tool_decisions import per_task

ROWS = [  # (file stem, env key, what the row says)
    ("rates", "all", "tool-call rate, held-out math + mcq prompts, no tools or unfitting ones"),
    ("rates", "unfitting", "tool-call rate, unfitting tools offered"),
    ("rates", "none", "tool-call rate, no tools offered"),
    ("decisions", "banking@call", "banking: calls a tool where the expert does"),
    ("decisions", "banking@call_exact", "banking: the expert's exact call (name + arguments)"),
    ("decisions", "banking@plain", "banking: no tool call where the expert writes to the customer"),
    ("heldout", "math", "math held-out accuracy (greedy)"),
    ("heldout", "mcq", "mcq held-out accuracy (greedy)"),
]


def scores(directory: Path, stem: str, tag: str) -> dict[str, dict[str, float]]:
    """``{key: {id: score}}`` of one file; rates also pooled (``all``) and by tools offered."""
    path = directory / f"{stem}_{tag}.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: run the measurement commands of "
                         "docs/results/dpo_tool_hallucination.md first")
    if stem == "decisions":
        return per_task([json.loads(x) for x in path.read_text().splitlines() if x.strip()])
    by_env = read_task_rewards(path)
    if stem != "rates":
        return by_env
    out: dict[str, dict[str, float]] = {"all": {}}
    for env, ids in by_env.items():
        offered = env.rsplit("/", 1)[-1]
        out.setdefault(offered, {}).update({f"{env}:{i}": v for i, v in ids.items()})
        out["all"].update({f"{env}:{i}": v for i, v in ids.items()})
    return out


def table(directory: Path, before: str, after: str) -> tuple[str, list[dict[str, float | int | str]]]:
    lines = [f"| measure | n | {before} | {after} | change ± paired se |", "|---|---|---|---|---|"]
    figures = []
    for stem, key, what in ROWS:
        b, a = scores(directory, stem, before).get(key), scores(directory, stem, after).get(key)
        if not b or not a:
            continue
        g = paired_gain(b, a)
        lines.append(f"| {what} | {g.n} | {g.before:.1%} | {g.after:.1%} | {g.gain * 100:+.1f} ± {g.se * 100:.1f} points |")
        figures.append({"measure": f"{stem}/{key}", "n": g.n, "before": g.before, "after": g.after, "change": g.gain,
                        "se": g.se, "gained": g.gained, "lost": g.lost})
    return "\n".join(lines), figures


def pooled(per_dir: list[list[dict[str, float | int | str]]]) -> list[dict[str, float | int | str]]:
    """Per measure present in every seed: the mean change over seeds, its se from the paired errors,
    and the spread between seeds (half the range)."""
    from posttrain.eval.compare import mean_over_runs

    out = []
    for f in per_dir[0]:
        runs = [next((g for g in figs if g["measure"] == f["measure"]), None) for figs in per_dir]
        if any(r is None for r in runs):
            continue
        g, se = mean_over_runs([(float(r["change"]), float(r["se"])) for r in runs])  # type: ignore[index]
        ch = [float(r["change"]) for r in runs]  # type: ignore[index]
        out.append({"measure": f["measure"], "seeds": len(runs), "change": g, "se": se,
                    "half_range": (max(ch) - min(ch)) / 2, "per_seed": ch,
                    "before": sum(float(r["before"]) for r in runs) / len(runs),  # type: ignore[index]
                    "after": sum(float(r["after"]) for r in runs) / len(runs)})  # type: ignore[index]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", action="append", default=None,
                   help="where the measurement files are (default runs/dpo_ev); repeat it, one per seed, to pool seeds")
    p.add_argument("--before", default="sft", help="tag of the model before DPO")
    p.add_argument("--after", default="dpo", help="tag of the model after DPO")
    p.add_argument("--split", default="dev", choices=DATA_SPLITS,
                   help="the held-out split the measurement files were made on, for the row (the doc's commands: "
                        "dev; tool-decisions reads its own default unless given --split)")
    p.add_argument("--no-save", action="store_true", help="print only; no row in bench/results/")
    args = p.parse_args(argv)
    dirs = args.dir or ["runs/dpo_ev"]
    per_dir = []
    for d in dirs:
        text, figures = table(Path(d), args.before, args.after)
        print(f"{d}:\n{text}\n" if len(dirs) > 1 else text)
        per_dir.append(figures)
    pool = pooled(per_dir) if len(dirs) > 1 else []
    for f in pool:
        print(f"{f['measure']:28s} mean over {f['seeds']} seeds {f['change'] * 100:+.1f} ± {f['se'] * 100:.1f} points "
              f"(per seed {', '.join(f'{c * 100:+.1f}' for c in f['per_seed'])}; half the range "
              f"{f['half_range'] * 100:.1f})")
    head = next(f for f in (pool or per_dir[0]) if f["measure"] == "rates/unfitting")
    n = next(f["n"] for f in per_dir[0] if f["measure"] == "rates/unfitting")
    if not args.no_save:
        one = {"dir": dirs[0], "figures": per_dir[0]}
        many = {"dir": dirs, "per_seed": dict(zip(dirs, per_dir)), "pooled": pool}
        append_row(Path(__file__).parent / "results" / "dpo_tool_hallucination.jsonl", {
            "bench": "dpo_tool_hallucination", "before": args.before, "after": args.after,
            **(many if len(dirs) > 1 else one), **provenance(args.split)})
    seeds = f" mean of {len(dirs)} seeds," if len(dirs) > 1 else ""
    print(f"RESULT dpo_tool_hallucination: {head['before']:.1%} -> {head['after']:.1%} tool-call rate "
          f"({head['change'] * 100:+.1f} ± {head['se'] * 100:.1f} points,{seeds} paired se over "
          f"{n} held-out prompts offered unfitting tools)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

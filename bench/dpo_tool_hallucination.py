"""The table of docs/results/dpo_tool_hallucination.md from its measurement files (issue 13 (c)).

    python bench/dpo_tool_hallucination.py --dir runs/dpo_ev --before sft --after dpo

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
    ("heldout", "math", "math validation accuracy (greedy)"),
    ("heldout", "mcq", "mcq validation accuracy (greedy)"),
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="runs/dpo_ev", help="where the measurement files are")
    p.add_argument("--before", default="sft", help="tag of the model before DPO")
    p.add_argument("--after", default="dpo", help="tag of the model after DPO")
    p.add_argument("--split", default="dev", choices=DATA_SPLITS,
                   help="the held-out split the measurement files were made on, for the row (the doc's commands: "
                        "dev; tool-decisions reads its own default unless given --split)")
    p.add_argument("--no-save", action="store_true", help="print only; no row in bench/results/")
    args = p.parse_args(argv)
    text, figures = table(Path(args.dir), args.before, args.after)
    print(text)
    head = next(f for f in figures if f["measure"] == "rates/unfitting")
    if not args.no_save:
        append_row(Path(__file__).parent / "results" / "dpo_tool_hallucination.jsonl", {
            "bench": "dpo_tool_hallucination", "dir": args.dir, "before": args.before, "after": args.after,
            "figures": figures, **provenance(args.split)})
    print(f"RESULT dpo_tool_hallucination: {head['before']:.1%} -> {head['after']:.1%} tool-call rate "
          f"({head['change'] * 100:+.1f} ± {head['se'] * 100:.1f} points paired se over {head['n']} held-out prompts "
          f"offered unfitting tools)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

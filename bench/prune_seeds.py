"""Pruning + distillation over seeds: bench/prune.py's rows of one teacher and one target, one row per seed.

    python bench/prune_seeds.py --rows 1 4 5 [--params 1.0e8] [--no-record]

Each ``--rows`` line of bench/results/prune.jsonl is one ``bench/prune.py --seed S`` run (a row without a
seed is seed 0). The rows must share the teacher's test scores task for task (one teacher, one task set)
and the training settings, and differ in seed; otherwise the command stops and says which differs.

Per seed, paired over the same test tasks (points, ± paired se): distilled (the searched variant) −
SFT control, searched − width (unless the search picked the width cut), width − depth, distilled −
teacher; and each variant's pooled recovery. Over seeds: the
mean ± sqrt(Σ se²)/n from the seeds' paired errors (eval/compare.py: ``mean_over_runs``), and the
standard error between seeds (sd/√n of the seeds' figures): the second says how much the batch order
alone moves a result. The last line is ``RESULT prune_seeds: <searched recovery> % ...``; the row goes
to bench/results/prune_seeds.jsonl unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, machine, provenance, record_args  # noqa: E402  (bench/results_row.py)

SOURCE = ROOT / "bench" / "results" / "prune.jsonl"
RESULTS = ROOT / "bench" / "results" / "prune_seeds.jsonl"
# bench/prune.py's settings that must agree between the seeds' rows (seed and bookkeeping may differ)
SAME = ("distill_steps", "search_steps", "batch", "lr", "topk", "n_eval", "max_new_tokens", "envs")
COMPARISONS = (("distilled − SFT control", "searched", "sft_control"),
               ("searched − width", "searched", "width"),
               ("width − depth", "width", "depth"),
               ("distilled − teacher", "searched", "teacher"))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", required=True, help="1-based line numbers of --source, one per seed")
    ap.add_argument("--params", type=float, default=1.0e8, help="which parameter target of those rows")
    ap.add_argument("--source", default=str(SOURCE), help="bench/prune.py's results file")
    record_args(ap, RESULTS)
    return ap.parse_args()


def per_seed(rows: list[dict[str, Any]], params: float) -> list[dict[str, Any]]:
    """One entry per row: its seed, the target's per-variant task scores with the teacher's beside
    them. Refuses rows of another teacher, other settings, a missing target or a repeated seed."""
    first = rows[0]
    out = []
    for i, row in enumerate(rows):
        diff = [k for k in SAME if row["args"].get(k) != first["args"].get(k)]
        if diff:
            raise SystemExit(f"row {i + 1} of --rows has other {', '.join(diff)} than the first: not the same experiment")
        if row["teacher"]["tasks"] != first["teacher"]["tasks"]:
            raise SystemExit(f"row {i + 1} of --rows scored another teacher (its test scores differ task by task)")
        target = next((t for t in row["targets"] if abs(t["params_target"] - params) < 1), None)
        if target is None:
            raise SystemExit(f"row {i + 1} of --rows has no ≤ {params:.3g} target")
        seed = target.get("seed", row["args"].get("seed", 0))
        if any(o["seed"] == seed for o in out):
            raise SystemExit(f"seed {seed} appears twice in --rows")
        scores = {v: s["tasks"] for v, s in target["scores"].items()}
        out.append({"seed": seed, "searched": target["searched"], "tasks": {**scores, "teacher": row["teacher"]["tasks"]},
                    "recovery": {v: s["recovery"]["pooled"] for v, s in target["scores"].items()},
                    "nll": {**{v: s["nll"] for v, s in target["scores"].items()}, "teacher": row["teacher"]["nll"]}})
    return out


def summarise(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per comparison and per variant's recovery: each seed's figure, their mean ± the seeds' own
    errors combined, and ± the spread between seeds."""
    from posttrain.eval.compare import mean_and_se, mean_over_runs, paired_gain

    def over(figs: list[tuple[float, float]]) -> dict[str, Any]:
        mean, se = mean_over_runs(figs)
        return {"per_seed": figs, "mean": mean, "se": se, "between_se": mean_and_se([g for g, _ in figs])[1]}

    out: dict[str, Any] = {"seeds": [s["seed"] for s in seeds], "comparisons": {}, "recovery": {}}
    for name, a, b in COMPARISONS:
        # searched − width is left out where the search picked the width cut (the same run twice)
        if all(a in s["tasks"] and b in s["tasks"] for s in seeds) and any(s["tasks"][a] != s["tasks"][b] for s in seeds):
            gains = [paired_gain(s["tasks"][b], s["tasks"][a]) for s in seeds]
            out["comparisons"][name] = over([(100 * g.gain, 100 * g.se) for g in gains])
    for v in seeds[0]["recovery"]:
        if all(v in s["recovery"] for s in seeds):
            out["recovery"][v] = over([tuple(s["recovery"][v]) for s in seeds])
    return out


def table(seeds: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    def cell(x: dict[str, Any]) -> str:
        return f"{x['mean']:+.1f} ± {x['se']:.1f} (± {x['between_se']:.1f})"

    head = "| | " + " | ".join(f"seed {s}" for s in summary["seeds"]) + " | mean ± paired se (± between seeds) |"
    lines = [head, "|---" * (len(seeds) + 2) + "|"]
    for name, x in summary["comparisons"].items():
        lines.append(f"| {name} (points) | " + " | ".join(f"{g:+.1f} ± {se:.1f}" for g, se in x["per_seed"])
                     + f" | {cell(x)} |")
    for v, x in summary["recovery"].items():
        lines.append(f"| recovery, {v} (%) | " + " | ".join(f"{g:.1f} ± {se:.1f}" for g, se in x["per_seed"])
                     + f" | {cell(x).lstrip('+')} |")
    return "\n".join(lines)


def main() -> None:
    args = parse()
    lines = Path(args.source).read_text().splitlines()
    bad = [r for r in args.rows if not 1 <= r <= len(lines)]
    if bad:
        raise SystemExit(f"{args.source} has {len(lines)} rows; no row {bad[0]}")
    rows = [json.loads(lines[r - 1]) for r in args.rows]
    seeds = per_seed(rows, args.params)
    summary = summarise(seeds)
    print(table(seeds, summary))
    if not args.no_record:
        append_row(Path(args.results), {"bench": "prune_seeds", "source": str(Path(args.source).name), "rows": args.rows,
                                        "params_target": args.params, **summary,
                                        **provenance("test", machine(os.getloadavg()[0], os.getloadavg()[0]))})
    rec, comp = summary["recovery"].get("searched"), summary["comparisons"]
    parts = [f"{name} {x['mean']:+.1f} ± {x['se']:.1f} (± {x['between_se']:.1f} between seeds)" for name, x in comp.items()]
    head = (f"{rec['mean']:.1f} % (± {rec['se']:.1f}; ± {rec['between_se']:.1f} between seeds; searched "
            f"{seeds[0]['searched']}" if rec else "n/a (no searched variant")
    print(f"RESULT prune_seeds: {head} at ≤ {args.params:.3g} params, {len(seeds)} seeds "
          f"{', '.join(str(s) for s in summary['seeds'])}: recovery of the teacher's test accuracy; "
          + "; ".join(parts) + " points, paired)")


if __name__ == "__main__":
    main()

"""``posttrain profile-data``: the behaviour profile of SFT JSONL files (what is measured, and why:
``data/behaviour_profile.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", nargs="+", help="SFT JSONL file(s)")
    p.add_argument("--tokenizer", help="count tokens with this model's tokenizer (e.g. embedded); default: words")
    p.add_argument("--out", help="output directory (default: <first file stem>_profile beside it)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--synth-summary", help="a `posttrain synth` run's summary JSON (default: <first stem>.summary.json "
                   "beside it when it is synth's): adds acceptance by validator")
    p.add_argument("--topic-column", help="a synth column (in each row's `columns`) whose coverage to report, e.g. topic")
    p.add_argument("--cluster-threshold", type=float, default=0.5,
                   help="MinHash Jaccard at which two rows share a diversity cluster (default: 0.5)")
    p.add_argument("--many-calls", type=int, default=10, help="a trajectory with this many tool calls is long (default: 10)")


def run(args: argparse.Namespace) -> int:
    from posttrain.data.conversations import read_conversations
    from posttrain.data.behaviour_profile import Thresholds, counter_for, format_table, plot, profile_stats, row_stats

    rows, report = read_conversations(args.data, on_error="skip")
    if report.bad:
        print(f"note: {report.summary()}", file=sys.stderr)
    count, unit = counter_for(args.tokenizer)
    th = Thresholds(many_calls=args.many_calls)
    stats = [row_stats(r, count) for r in rows]
    p = profile_stats(stats, unit, th)
    first = Path(args.data[0])
    out_dir = Path(args.out) if args.out else first.with_name(first.stem + "_profile")
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = _synth_summary(args, first)
    if summary is not None or args.topic_column or any(r.get("provenance", {}).get("source") == "synth" for r in rows[:50]):
        from posttrain.data.behaviour_profile import synth_profile

        p["synth"] = synth_profile(rows, summary, args.topic_column, args.cluster_threshold)
    print(format_table(p))
    if "synth" in p:
        print("synth: " + json.dumps(p["synth"], ensure_ascii=False))
    (out_dir / "profile.json").write_text(json.dumps(p, indent=2, ensure_ascii=False), encoding="utf-8")
    written = [out_dir / "profile.json"]
    if not args.no_plots and rows:
        written += plot(p, {
            f"assistant output ({unit})": [s.assistant_len for s in stats],
            f"reasoning ({unit})": [s.reasoning_len for s in stats],
            "assistant turns": [s.turns for s in stats],
            "tool calls per trajectory": [len(s.tool_calls) for s in stats],
        }, out_dir)
        if "synth" in p:
            from posttrain.data.behaviour_profile import plot_synth

            written += plot_synth(p["synth"], out_dir)
    print("\nwrote " + ", ".join(str(w) for w in written))
    return 0


def _synth_summary(args: argparse.Namespace, first: Path) -> dict | None:
    path = Path(args.synth_summary) if args.synth_summary else first.with_name(first.stem + ".summary.json")
    if not path.exists():
        if args.synth_summary:
            from posttrain.errors import UserError

            raise UserError(f"synth summary not found: {path}")
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary if isinstance(summary, dict) and "failures" in summary else None  # curate's has none

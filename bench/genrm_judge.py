"""Issue 35 (item 2): how well each judge judges, from its held-out replies, against the targets.

    posttrain genrm --config recipes/genrm_visible.yaml --eval MODEL --out runs/genrm_v/eval_NAME.json
    python bench/genrm_judge.py --config recipes/genrm_visible.yaml --judge NAME=runs/genrm_v/eval_NAME.json ...

Reads each judge's per-judgement replies (``eval_NAME.replies.jsonl``, written by ``posttrain genrm
--eval --out``; every test pair in both orders, greedy, no retries) and recomputes from them:

* the agreement figures of ``envs/genrm/evaluate.py`` (ranking side right, format errors, position
  bias = share preferring response 1, order consistency), overall and per pair kind;
* the targets (``judge_targets``: side ≥ 70%, bias within 50 ± 10%, consistency ≥ 60%, format
  errors ≤ 2%, n ≥ 200): met or not;
* each judge against the first one named, paired over the same judgements (side right, 0/1), with
  its paired standard error;
* the shortcut judges of the same test pairs ("longer wins", "shorter wins"), overall and per kind.

Ends with ``RESULT genrm_judge: <side %> (...)`` for the last judge named and appends one row to
``bench/results/genrm_judge.jsonl`` (``--no-row``: print only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

from posttrain.configs import load_config
from posttrain.configs.rlhf import GenRMConfig
from posttrain.envs.genrm.evaluate import agreement_from_rows, judge_targets
from posttrain.eval.compare import paired_gain

ROOT = Path(__file__).resolve().parents[1]


def replies(eval_json: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta = json.loads(eval_json.read_text())
    rows = [json.loads(x) for x in eval_json.with_suffix(".replies.jsonl").read_text().splitlines() if x.strip()]
    return meta, rows


def side(rows: list[dict[str, Any]]) -> dict[str, float]:
    """task id → 1 if the verdict names the better response (a format error is 0)."""
    return {r["task_id"]: float(r.get("rank_sign_ok", 0.0)) if not r["format_error"] else 0.0 for r in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="recipes/genrm_visible.yaml", help="the recipe whose test pairs were judged")
    ap.add_argument("--judge", action="append", required=True, metavar="NAME=EVAL.json",
                    help="a judge's `posttrain genrm --eval --out` file; the first is the reference of the paired gains")
    ap.add_argument("--no-row", action="store_true")
    args = ap.parse_args()

    from posttrain.serving.build import build_envs
    from posttrain.envs.genrm.visible_pairs import shortcut_accuracy

    cfg = load_config(GenRMConfig, args.config, [])
    env = build_envs([cfg.envs[0]])["genrm"]
    pairs = env.pairs("test")
    shortcuts = shortcut_accuracy(pairs)
    judges: dict[str, Any] = {}
    ref_side = None
    for spec in args.judge:
        name, _, path = spec.partition("=")
        meta, rows = replies(Path(path))
        if meta.get("split", "test") != "test":
            raise SystemExit(f"{path}: judged the {meta['split']} pairs; this bench reports test judgements only")
        if {r["pair_id"] for r in rows} != {p.id for p in pairs}:
            raise SystemExit(f"{path}: its judgements are not of {args.config}'s test pairs")
        fig = agreement_from_rows(rows)
        s = side(rows)
        entry = {"model": meta["model"], "eval": str(path), "figures": fig, "targets": judge_targets(fig)}
        if ref_side is not None:
            g = paired_gain(ref_side, s)
            entry["vs_first"] = {"gain": g.gain, "se": g.se}
        ref_side = ref_side or s
        judges[name] = entry

    first = next(iter(judges))
    print(f"{len(pairs)} test pairs, {2 * len(pairs)} judgements (both orders), greedy, no retries")
    print(f"{'judge':14s} {'format err':>10s} {'side right':>10s} {'prefers 1':>9s} {'consistent':>10s}  "
          f"{'vs ' + first:>16s}  targets met")
    for name, j in judges.items():
        f, t = j["figures"], j["targets"]
        vs = f"{100 * j['vs_first']['gain']:+.1f} ± {100 * j['vs_first']['se']:.1f}" if "vs_first" in j else "—"
        missed = [k for k, ok in t.items() if not ok]
        print(f"{name:14s} {100 * f['format_error_rate']:9.1f}% {100 * f['rank_side_acc']:9.1f}% "
              f"{100 * f['prefers_first']:8.1f}% {100 * f['order_consistency']:9.1f}%  {vs:>16s}  "
              f"{len(t) - len(missed)}/{len(t)}" + (f" (missed: {', '.join(missed)})" if missed else ""))
    kinds = sorted({p.metadata["kind"] for p in pairs})
    print("\nranking side right per kind (judgements of each kind), and the shortcut judges")
    print(f"{'kind':12s} " + " ".join(f"{n:>12s}" for n in judges) + f" {'longer wins':>12s} {'shorter wins':>12s}")
    for k in kinds:
        cells = [judges[n]["figures"].get(f"by/visible/{k}/rank_side_acc", float("nan")) for n in judges]
        print(f"{k:12s} " + " ".join(f"{100 * c:11.1f}%" for c in cells)
              + f" {100 * shortcuts[f'{k}/longer_wins']:11.1f}% {100 * shortcuts[f'{k}/shorter_wins']:11.1f}%")
    last = list(judges)[-1]
    fl = judges[last]["figures"]
    result = (f"RESULT genrm_judge: {100 * fl['rank_side_acc']:.1f} % ({last}: ranking side right on "
              f"{int(fl['n'])} test judgements, both orders; prefers response 1 {100 * fl['prefers_first']:.1f}%, "
              f"order-consistent {100 * fl['order_consistency']:.1f}%, format errors {100 * fl['format_error_rate']:.1f}%; "
              f"targets met {sum(judges[last]['targets'].values())}/{len(judges[last]['targets'])})")
    print(result)
    if not args.no_row:
        append_row(ROOT / "bench" / "results" / "genrm_judge.jsonl",
                   {"name": "genrm_judge", "config": args.config, "pairs": len(pairs), "judges": judges,
                    "shortcuts": shortcuts, "result": result, **provenance("test")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 35: does the judge's *expected* verdict carry the preference its written verdict loses?

    python bench/genrm_expected.py --split dev      # choose the verdict mode for RLHF on dev
    python bench/genrm_expected.py --split test     # report the chosen mode once

The supervised restate judge (docs/results/genrm.md) writes ``5 / 1 / Ranking 1`` for every parsed
comparison of the policy's own replies, so a ring of its written verdicts gives every response the
same base reward. ``judge.verdict: expected`` (``envs/genrm/judge.py``) replaces each written number
by its mean under the judge's own token distribution. This bench measures both modes from the same
greedy judge replies (``GenRMJudge.both_verdicts``: one pass, no retries) on two sets of pairs:

* **visible**: the held-out visible pairs of ``--config`` (five kinds, both orders, ``--split``);
* **policy**: pairs of the *policy's own* replies, as RLHF will show them: ``--policy`` samples
  ``--k`` replies (T = 1, ``--max-new-tokens``, reasoning off, as ``recipes/rlhf_judge_evidence.yaml``)
  to ``--n-policy`` instruction tasks of ``--split``; the instruction verifier grades them and the best
  and the worst form a pair where their scores differ (``envs/genrm/pairs.py``), judged in both orders.

Per mode and set: parsed share; single-order ranking side right (the sign of the score margin of
response 1 over response 2 after the tie-break; an exact tie counts half); the share preferring
response 1; and **both-orders accuracy**, what a ring uses: the better response's margin summed
over its two positions is positive (an exact tie counts half; a comparison that does not parse
counts as a tie, as the neutral fallback does). Expected − text is paired over the same pairs.

Ends with ``RESULT genrm_expected: <both-orders accuracy of the expected mode on the policy pairs>``
and appends a row to ``bench/results/genrm_expected.jsonl`` (``--no-row``: print only).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import astuple
import sys
import time
from pathlib import Path
from typing import Any

from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

import posttrain.envs  # noqa: F401  (registers the environments)
from posttrain.algos.genrm import tie_break
from posttrain.configs import load_config
from posttrain.configs.rlhf import GenRMConfig
from posttrain.envs.base import make_env
from posttrain.envs.genrm.format import build_genrm_prompt, split_prompt
from posttrain.envs.genrm.judge import GenRMJudge, make_generator
from posttrain.envs.genrm.pairs import mine_pairs
from posttrain.eval.compare import paired_gain
from posttrain.serving.build import build_envs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "genrm_expected.jsonl"
JUDGE = "runs/genrm_supervised/sft_restate_more/checkpoints/step_000040"


def margin(v: Any) -> float:
    """Score of response 1 minus response 2 after the tie-break; 0 for no verdict (the fallback)."""
    if v is None:
        return 0.0
    s1, s2 = tie_break(v.h1, v.h2, v.rank)
    return s1 - s2


def sign_score(x: float) -> float:
    return 1.0 if x > 0 else 0.5 if x == 0 else 0.0


def figures(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """rows: one per pair, with ``{mode}_given`` / ``{mode}_swapped`` margins (response 1 − 2) and
    ``better`` (1 or 2: the better response in the given order)."""
    single, first, both, parsed, n_j = [], [], [], 0, 0
    for r in rows:
        good_margin = 0.0
        for order in ("given", "swapped"):
            m, ok = r[f"{mode}_{order}"], r[f"{mode}_{order}_parsed"]
            better_is_1 = (r["better"] == 1) == (order == "given")
            n_j += 1
            parsed += ok
            single.append(sign_score(m if better_is_1 else -m))
            first.append(1.0 if m > 0 else 0.0)
            good_margin += m if better_is_1 else -m
        both.append(sign_score(good_margin))
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"pairs": len(rows), "judgements": n_j, "parsed": parsed / max(n_j, 1), "side_right": mean(single),
            "prefers_1": mean(first), "both_orders": mean(both), "both_orders_each": both}


def judge_pairs(judge: GenRMJudge, items: list[tuple[str, list[Any], Any, Any, int, str]]) -> list[dict[str, Any]]:
    """items: (pair id, prompt messages, response a, response b, better (1 = a), kind); both orders."""
    prompts = []
    for _, msgs, a, b, _, _ in items:
        history, turn = split_prompt(msgs)
        prompts += [build_genrm_prompt(history, turn, a, b), build_genrm_prompt(history, turn, b, a)]
    verdicts = judge.both_verdicts(prompts)
    rows = []
    for k, (pid, _, _, _, better, kind) in enumerate(items):
        row: dict[str, Any] = {"pair_id": pid, "kind": kind, "better": better}
        for order, (text, soft) in zip(("given", "swapped"), verdicts[2 * k: 2 * k + 2]):
            row[f"text_{order}"], row[f"text_{order}_parsed"] = margin(text), text is not None
            row[f"expected_{order}"], row[f"expected_{order}_parsed"] = margin(soft), soft is not None
            row[f"verdict_{order}"] = [None if text is None else list(astuple(text)),
                                       None if soft is None else [round(x, 3) for x in astuple(soft)]]
        rows.append(row)
    return rows


def visible_items(config: str, split: str) -> list[tuple[str, list[Any], Any, Any, int, str]]:
    cfg = load_config(GenRMConfig, config, [])
    env = build_envs([cfg.envs[0]])["genrm"]
    items = []
    for p in env.pairs(split):
        better = 1 if p.truth.rank < 3.5 else 2
        items.append((p.id, p.messages, p.response_1, p.response_2, better, p.source.split("/")[-1]))
    return items


def policy_items(policy: str, split: str, n: int, k: int, max_new_tokens: int, seed: int
                 ) -> tuple[list[tuple[str, list[Any], Any, Any, int, str]], dict[str, Any]]:
    env = make_env("instruction", min_constraints=1, max_constraints=2)
    pairs = mine_pairs(make_generator(policy), env, env.tasks(split, n, seed=seed), k, max_new_tokens,
                       temperature=1.0, seed=seed, reasoning=False)
    items = [(p.id, p.messages, p.response_1, p.response_2, 1, "policy") for p in pairs]  # mined: 1 is the better
    return items, {"tasks": n, "samples": n * k, "pairs": len(items)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("dev", "test"), required=True)
    ap.add_argument("--judge", default=JUDGE)
    ap.add_argument("--config", default="recipes/genrm_visible_large.yaml", help="the visible held-out pairs")
    ap.add_argument("--policy", default="embedded")
    ap.add_argument("--n-policy", type=int, default=96, help="instruction tasks the policy answers")
    ap.add_argument("--k", type=int, default=8, help="samples per task (the best and the worst form the pair)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="the policy's replies")
    ap.add_argument("--judge-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="per-pair records (default runs/genrm_expected/<split>.json)")
    ap.add_argument("--no-row", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    judge = GenRMJudge(make_generator(args.judge), max_new_tokens=args.judge_tokens, retries=0, verdict="expected")
    sets = {"visible": visible_items(args.config, args.split)}
    sets["policy"], mined = policy_items(args.policy, args.split, args.n_policy, args.k, args.max_new_tokens, args.seed)
    summary: dict[str, Any] = {"mined": mined}
    records = {}
    for name, items in sets.items():
        if not items:
            raise SystemExit(f"no {name} pairs on {args.split}: every policy sample scored alike (raise --n-policy)")
        rows = judge_pairs(judge, items)
        records[name] = rows
        summary[name] = {}
        for mode in ("text", "expected"):
            f = figures(rows, mode)
            each = f.pop("both_orders_each")
            summary[name][mode] = f | {"per_kind": {kind: figures([r for r in rows if r["kind"] == kind], mode)["both_orders"]
                                                    for kind in sorted({r["kind"] for r in rows})}}
            summary[name][f"{mode}_each"] = each
        g = paired_gain(dict(enumerate(summary[name].pop("text_each"))), dict(enumerate(summary[name].pop("expected_each"))))
        summary[name]["expected_minus_text"] = {"gain": g.gain, "se": g.se}
        for mode in ("text", "expected"):
            f = summary[name][mode]
            print(f"{name:8s} {mode:9s} pairs {f['pairs']:4d} parsed {f['parsed']:.1%} side {f['side_right']:.1%} "
                  f"prefers-1 {f['prefers_1']:.1%} both-orders {f['both_orders']:.1%}  {f['per_kind']}")
        print(f"{name:8s} expected − text both-orders {g.gain:+.1%} ± {g.se:.1%}")
    out = Path(args.out or f"runs/genrm_expected/{args.split}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "records": records}, indent=1))
    pol, vis = summary["policy"], summary["visible"]
    result = (f"{pol['expected']['both_orders']:.1%} both-orders accuracy of expected verdicts on "
              f"{pol['expected']['pairs']} pairs of the policy's own replies (text verdicts "
              f"{pol['text']['both_orders']:.1%}, expected − text {pol['expected_minus_text']['gain']:+.1%} ± "
              f"{pol['expected_minus_text']['se']:.1%}; visible pairs {vis['expected']['both_orders']:.1%} vs "
              f"{vis['text']['both_orders']:.1%}; split {args.split})")
    print(f"RESULT genrm_expected: {result}")
    if not args.no_row:
        append_row(RESULTS, {"bench": "genrm_expected", **provenance(args.split), "judge": args.judge,
                             "policy": args.policy, "settings": {k: v for k, v in vars(args).items() if k != "no_row"},
                             "summary": summary, "result": result, "seconds": round(time.time() - t0, 1)})


if __name__ == "__main__":
    sys.exit(main())

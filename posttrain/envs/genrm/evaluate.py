"""How well a model judges: agreement with the ground truth on held-out pairs, per position order.

:func:`genrm_agreement` asks a generator (greedy, one reply each, **no retries**: a format error is
part of what is measured; or ``samples`` replies each at ``temperature``, for a judge that is used
sampled) for a verdict on each held-out task of the ``genrm`` environment (every
pair in both orders) and returns:

* ``format_error_rate`` — replies that do not parse;
* ``rank_side_acc`` — the predicted ranking names the better response (r ≤ 3 vs r ≥ 4 agrees with
  the ground truth), over all replies (a format error counts as wrong), and ``rank_side_acc_parsed``
  over the parseable ones;
* ``h_abs_err`` — mean |P_h − G_h| over both scores, ``rank_abs_err`` — mean |P_r − G_r| (parseable);
* ``reward`` — mean 1 + R/23 (the training reward; 0 for a format error);
* per order (``given/…``, ``swapped/…``) the same, and **position bias**: ``prefers_first`` = share
  of parseable verdicts that rank response 1 better (a balanced both-orders set makes 0.5 the
  unbiased value) and ``order_consistency`` = share of pairs, both replies parseable, whose two
  verdicts prefer the same underlying response;
* per pair source (``by/<source>/rank_side_acc``, e.g. ``by/visible/truncated/…``), where the
  held-out set mixes several: the share right of that source's replies.

:func:`judge_targets` checks the figures against the judge-quality targets (``TARGETS``: issue 35):
ranking side right ≥ 70%, position bias (``prefers_first``) within 50 ± 10%, order consistency
≥ 60%, format errors ≤ 2%, over at least 200 judgements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posttrain.algos.genrm import Judgement
from posttrain.engines.base import SamplingParams
from posttrain.envs.genrm.env import score_judgement
from posttrain.envs.genrm.format import ParseFailure, parse_judgement


def _summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    n = max(len(rows), 1)
    ok = [r for r in rows if not r["format_error"]]
    m = max(len(ok), 1)
    return {"n": float(len(rows)), "format_error_rate": sum(r["format_error"] for r in rows) / n,
            "rank_side_acc": sum(r.get("rank_sign_ok", 0.0) for r in ok) / n,
            "rank_side_acc_parsed": sum(r["rank_sign_ok"] for r in ok) / m if ok else float("nan"),
            "h_abs_err": sum(r["h1_err"] + r["h2_err"] for r in ok) / (2 * m) if ok else float("nan"),
            "rank_abs_err": sum(r["rank_err"] for r in ok) / m if ok else float("nan"),
            "reward": sum(r["reward"] for r in rows) / n,
            "prefers_first": sum(r["pred_rank"] <= 3 for r in ok) / m if ok else float("nan")}


TARGETS: dict[str, tuple[float, float]] = {  # figure → the closed interval it must sit in
    "rank_side_acc": (0.70, 1.0), "prefers_first": (0.40, 0.60), "order_consistency": (0.60, 1.0),
    "format_error_rate": (0.0, 0.02), "n": (200, float("inf")),
}


def judge_targets(figures: dict[str, float]) -> dict[str, bool]:
    """Each target of ``TARGETS`` met (True) or not; a missing or NaN figure is not met."""
    out = {}
    for k, (lo, hi) in TARGETS.items():
        v = figures.get(k, float("nan"))
        out[k] = bool(v == v and lo <= v <= hi)
    return out


def agreement_from_rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The figures of the module docstring from per-task rows (``task_id``, ``swapped``, ``pair_id``,
    ``reward``, the verify components, ``pred_rank``)."""
    out = _summary(rows)
    for order in ("given", "swapped"):
        out.update({f"{order}/{k}": v for k, v in _summary([r for r in rows if r["swapped"] == (order == "swapped")]).items()})
    by_pair: dict[tuple[str, int], dict[bool, dict[str, Any]]] = {}
    for r in rows:  # sampled: the j-th verdict of the given order with the j-th of the swapped one
        by_pair.setdefault((r["pair_id"], r.get("sample", 0)), {})[r["swapped"]] = r
    both = [p for p in by_pair.values() if len(p) == 2 and not p[False]["format_error"] and not p[True]["format_error"]]
    # consistent: the swapped verdict prefers position 2 exactly when the given one prefers position 1
    consistent = [(p[False]["pred_rank"] <= 3) != (p[True]["pred_rank"] <= 3) for p in both]
    out["order_consistency"] = sum(consistent) / len(consistent) if consistent else float("nan")
    sources = sorted({r["source"] for r in rows if r.get("source")})
    if len(sources) > 1:
        for src in sources:
            mine = _summary([r for r in rows if r.get("source") == src])
            out.update({f"by/{src}/{k}": mine[k] for k in ("n", "rank_side_acc", "prefers_first", "format_error_rate")})
    return out


def genrm_agreement(generator: Any, env: Any, split: str = "test", n: int | None = None,
                    max_new_tokens: int = 256, reasoning: bool = False, records: Path | None = None,
                    temperature: float = 0.0, samples: int = 1, seed: int = 0) -> dict[str, float]:
    """Judge every held-out task ``samples`` times (once, greedily, by default); the agreement
    figures (module docstring), means over every reply."""
    if samples < 1 or temperature < 0 or (samples > 1 and temperature == 0):
        raise ValueError(f"need samples >= 1 and temperature >= 0 (> 0 for several samples), got {samples}, {temperature}")
    tasks = env.tasks(split, n)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=samples, seed=seed,
                            reasoning=reasoning)
    outs = generator.generate([t.messages for t in tasks], params)
    rows = []
    for t, comps in zip(tasks, outs):
        gt = t.ground_truth
        for j, c in enumerate(comps[:samples]):
            res = score_judgement(c.text, Judgement(gt["h1"], gt["h2"], gt["rank"]))
            pred = parse_judgement(c.text)
            rows.append({"task_id": t.id, "pair_id": t.metadata["pair_id"], "swapped": t.metadata["swapped"],
                         "sample": j, "source": t.metadata.get("source", ""), "reward": res.reward, "reason": res.reason, **res.components,
                         "pred_rank": None if isinstance(pred, ParseFailure) else pred.rank, "reply": c.text})
    if records is not None:
        records.parent.mkdir(parents=True, exist_ok=True)
        records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return agreement_from_rows(rows)

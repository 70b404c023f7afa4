"""Issue 35 item 3: RLHF with the supervised judge, with vs without length control — the test table.

    bash bench/rlhf_judge.sh 0 1 2          # the six runs (runs/rlhf_judge/{on,off}_S), then this
    python bench/rlhf_judge.py --dir runs/rlhf_judge

For the start model and each finished run's last checkpoint (a run is finished when ``DONE`` is in
its directory), greedy replies (``--max-new-tokens``, reasoning off, as the runs sampled) to ``--n``
instruction tasks of the **test** split (the ``ifeval`` benchmark's tasks: ``InstructionEnv()``'s,
not the training recipe's constraint counts), each graded twice, constraint by constraint: by our
instruction verifier and by the IFEval reference checkers of ``if-verifiable``
(``eval/benchmarks/ifeval.py``). A model's replies are written once to ``eval_<name>.json`` and read
back on a re-run (resumable). Per model: prompt-level strict accuracy (ours on every constraint;
both graders on the mapped ones), instruction-level accuracy (share of constraints kept, per task),
answer length in tokens; per run: end − start paired over the tasks; on − off paired per seed, and
the mean over seeds with the standard error of that mean from the per-seed paired errors. Appends a
row to ``bench/results/rlhf_judge.jsonl`` and ends with ``RESULT rlhf_judge: ...``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from results_row import append_row, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

from posttrain.eval.compare import mean_and_se, mean_over_runs, paired_gain

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "rlhf_judge.jsonl"


def evaluate(model: str, out: Path, n: int, max_new_tokens: int) -> dict[str, Any]:
    """Greedy replies of ``model`` to n test instruction tasks, graded by both graders (cached in ``out``)."""
    if out.exists():
        return json.loads(out.read_text())
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.eval.benchmarks.base import BenchmarkOptions
    from posttrain.eval.benchmarks.ifeval import grade_replies

    gen = HFGenerator.from_spec(model, batch_size=32)
    lengths: dict[str, int] = {}

    def replies(tasks: list[Any]) -> list[str]:
        outs = gen.generate([t.messages for t in tasks],
                            SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1, seed=0, reasoning=False))
        for t, c in zip(tasks, outs):
            lengths[t.id] = len(c[0].token_ids)
        return [c[0].text for c in outs]

    t0 = time.time()
    res = grade_replies("ifeval", BenchmarkOptions(split="test", n=n, max_new_tokens=max_new_tokens), replies)
    items = [i | {"tokens": lengths[i["task_id"]]} for i in res.items if i["source"] == "model"]
    doc = {"model": model, "n": n, "max_new_tokens": max_new_tokens, "seconds": round(time.time() - t0, 1),
           "items": items}
    out.write_text(json.dumps(doc))
    return doc


def per_task(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Task id → its figures: ours (every constraint kept) and its instruction-level share kept; the
    reference checkers' prompt- and instruction-level figures on the mapped constraints (None where
    none is mapped); reply tokens."""
    out = {}
    for i in doc["items"]:
        rows = i["constraints"]
        mapped = [r for r in rows if r["reference"] is not None]
        out[i["task_id"]] = {
            "ours": float(all(r["ours"] for r in rows)),
            "ours_inst": sum(r["ours"] for r in rows) / len(rows),
            "ref_mapped": float(all(r["reference"] for r in mapped)) if mapped else None,
            "ref_inst": sum(bool(r["reference"]) for r in mapped) / len(mapped) if mapped else None,
            "tokens": float(i["tokens"]),
        }
    return out


KEYS = ("ours", "ours_inst", "ref_mapped", "ref_inst", "tokens")


def column(tasks: dict[str, dict[str, float]], key: str) -> dict[str, float]:
    return {t: v[key] for t, v in tasks.items() if v[key] is not None}


def run_lengths(run: Path) -> dict[str, float]:
    m = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    m = [r for r in m if "answer_len_mean" in r]
    return {"answer_len_first": m[0]["answer_len_mean"], "answer_len_last": m[-1]["answer_len_mean"],
            "answer_len_last3": sum(r["answer_len_mean"] for r in m[-3:]) / len(m[-3:]),
            "flat_frac_mean": sum(r["reward_base_flat_frac"] for r in m) / len(m),
            "base_std_mean": sum(r["reward_base_group_std"] for r in m) / len(m),
            "fallback_frac_mean": sum(r["genrm_fallback_frac"] for r in m) / len(m), "steps": m[-1]["step"]}


def between_seeds(gains: list[float]) -> float | None:
    """sd / sqrt(n) of the per-seed gains: the error the paired se (within-seed, over tasks) leaves out
    (None for one seed)."""
    return mean_and_se(gains)[1] if len(gains) > 1 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="runs/rlhf_judge")
    ap.add_argument("--start", default="embedded", help="the runs' start model")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-row", action="store_true")
    args = ap.parse_args()
    d = Path(args.dir)
    runs = sorted(p.parent for p in d.glob("*/DONE"))
    docs = {"start": evaluate(args.start, d / "eval_start.json", args.n, args.max_new_tokens)}
    for run in runs:
        last = sorted((run / "checkpoints").glob("step_*"))[-1]
        docs[run.name] = evaluate(str(last), d / f"eval_{run.name}.json", args.n, args.max_new_tokens)
    tasks = {k: per_task(v) for k, v in docs.items()}
    summary: dict[str, Any] = {"models": {}, "gains": {}, "on_minus_off": {}}
    print(f"{'model':10s} " + " ".join(f"{k:>16s}" for k in KEYS))
    for name, t in tasks.items():
        row = {k: mean_se(list(column(t, k).values())) for k in KEYS}
        summary["models"][name] = {k: {"mean": m, "se": s, "n": len(column(t, k))} for k, (m, s) in row.items()}
        if name != "start":
            summary["models"][name]["train"] = run_lengths(d / name)
        print(f"{name:10s} " + " ".join(f"{m:8.3f} ± {s:5.3f}" for m, s in row.values()))
    for name in tasks:
        if name == "start":
            continue
        summary["gains"][name] = {k: vars(paired_gain(column(tasks["start"], k), column(tasks[name], k))) for k in KEYS}
    seeds = sorted({n.removeprefix("on_") for n in tasks if n.startswith("on_")}
                   & {n.removeprefix("off_") for n in tasks if n.startswith("off_")})  # seeds with both arms
    for k in KEYS:
        per = {s: paired_gain(column(tasks[f"off_{s}"], k), column(tasks[f"on_{s}"], k)) for s in seeds}
        if per:
            g, se = mean_over_runs([(p.gain, p.se) for p in per.values()])
            summary["on_minus_off"][k] = {"per_seed": {s: {"gain": p.gain, "se": p.se} for s, p in per.items()},
                                          "mean": g, "se": se, "se_between_seeds": between_seeds([p.gain for p in per.values()])}
    for arm in ("on", "off"):
        for k in KEYS:
            gs = [summary["gains"][f"{arm}_{s}"][k] for s in seeds]
            if gs:
                g, se = mean_over_runs([(x["gain"], x["se"]) for x in gs])
                summary.setdefault(f"{arm}_minus_start", {})[k] = {
                    "mean": g, "se": se, "seeds": len(gs), "se_between_seeds": between_seeds([x["gain"] for x in gs])}
    for key in ("on_minus_start", "off_minus_start", "on_minus_off"):
        for k, v in summary.get(key, {}).items():
            print(f"{key:16s} {k:10s} {v['mean']:+.3f} ± {v['se']:.3f}")
    om = summary["on_minus_off"]
    res = (f"{om['ref_inst']['mean'] * 100:+.1f} ± {om['ref_inst']['se'] * 100:.1f} points (test, {len(seeds)} seeds: "
           f"RLHF with length control − without, IFEval reference checkers, instruction-level; ours "
           f"{om['ours_inst']['mean'] * 100:+.1f} ± {om['ours_inst']['se'] * 100:.1f}; answer tokens "
           f"{om['tokens']['mean']:+.1f} ± {om['tokens']['se']:.1f}; {args.n} tasks)") if seeds and om else "no paired seeds yet"
    print(f"RESULT rlhf_judge: {res}")
    if not args.no_row and seeds:
        append_row(RESULTS, {"bench": "rlhf_judge", **provenance("test"), "dir": args.dir, "seeds": seeds,
                             "settings": {k: v for k, v in vars(args).items() if k != "no_row"},
                             "summary": summary, "result": res})


if __name__ == "__main__":
    main()

"""Environment accuracy recovery of FP8 exports against their BF16 reference, paired on the same tasks.

Issue 14, evidence (a) on a model that scores (docs/results/quantization.md). The scoring is
``posttrain eval`` (the ``arithmetic`` environment: the pipeline's held-out problems, reasoning-on
prompt, the math verifier); this script only compares its ``--out`` files:

    python bench/quant_accuracy.py runs/quant_acc/eval/bf16.json \
        all=runs/quant_acc/eval/all.json recipe=runs/quant_acc/eval/recipe.json ... \
        [--md table.md] [--bench-row]

For every mode found in the files (greedy; sampled avg@k) and every FP8 model:

* accuracy ± se: greedy, the binomial ``sqrt(p(1-p)/n)``; sampled, the se of the per-task avg@k;
* the **paired** difference against BF16 on the same tasks ± its paired se, and the tasks gained /
  lost (``eval/compare.paired_gain``, the helper the pipeline's stage gains use);
* a ``NAME=JSON`` may also be a stage JSON of the pipeline's ``measure()`` (its ``per_task`` list):
  the float32 checkpoint as the pipeline measured it, to check that ``posttrain eval`` grades the
  same problems the same way;
* **recovery = FP8 / BF16**, with two intervals: the delta-method se of a ratio of two paired
  means (``var(a/b) ≈ (var a − 2R cov(a,b) + R² var b) / (n b²)`` over per-task scores), and a
  paired bootstrap over tasks (10,000 resamples of the task set, percentile 95% interval, seed 0).

One environment only, so the "median over environments" is that environment's recovery; the
script says so rather than pretending to a median. ``--bench-row`` appends the table to
``bench/results/quant_accuracy.jsonl`` and prints the ``RESULT`` line. Load averages: each
``NAME.json`` may have a ``NAME.load`` beside it (``before after`` 1-minute load averages, written by
``bench/quant_evidence.sh accuracy``), reported in the table.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from posttrain.eval.compare import paired_gain
from posttrain.eval.report import load_results
from posttrain.experiments.pipeline_report import binomial_se
from results_row import DATA_SPLITS  # bench/results_row.py


def per_task(paths: str) -> dict[str, dict[str, float]]:
    """``{mode: {task_id: mean reward over its samples}}``; mode is ``greedy`` or ``avg@k t=T``.
    ``paths``: one file, or several separated by commas (a greedy and a sampled run, say)."""
    out: dict[str, dict[str, float]] = {}
    for path in paths.split(","):
        for mode, scores in _per_task(path).items():
            if mode in out:
                raise SystemExit(f"{paths}: {mode} appears twice")
            out[mode] = scores
    return out


def _per_task(path: str) -> dict[str, dict[str, float]]:
    doc = json.loads(Path(path).read_text())
    doc = doc.get("result", doc)
    if "per_task" in doc:  # the pipeline's measure() (experiments/stages.py): greedy, {id, correct}
        return {"greedy": {t["id"]: float(t["correct"]) for t in doc["per_task"]}}
    out: dict[str, dict[str, float]] = {}
    for r in load_results(path):
        mode = "greedy" if r.temperature == 0 and r.k == 1 else f"avg@{r.k} t={r.temperature:g}"
        if r.wording != 0:
            mode += f" wording {r.wording}"
        scores = out.setdefault(mode, {})
        for t in r.tasks:
            scores[t.task_id] = sum(s.reward for s in t.samples) / len(t.samples)
    return out


def eval_split(paths: list[str]) -> str | None:
    """The one split the ``posttrain eval`` files were scored on, for the bench row (a pipeline stage
    JSON names none and is skipped); None when they name none or several."""
    found = set()
    for path in (p for item in paths for p in item.split(",")):
        doc = json.loads(Path(path).read_text())
        if "per_task" not in doc.get("result", doc):
            found |= {r.split for r in load_results(path)}
    return found.pop() if len(found) == 1 else None


def seconds_of(paths: str) -> dict[str, float]:
    return {m: s for p in paths.split(",") for m, s in _seconds_of(p).items()}


def _seconds_of(path: str) -> dict[str, float]:
    doc = json.loads(Path(path).read_text())
    doc = doc.get("result", doc)
    if "per_task" in doc:
        return {"greedy": doc.get("seconds")}
    out = {}
    for r in load_results(path):
        mode = "greedy" if r.temperature == 0 and r.k == 1 else f"avg@{r.k} t={r.temperature:g}"
        out[mode] = r.seconds
    return out


def load_of(paths: str, mode: str) -> list[float] | None:
    """1-minute load average before and after the run that scored ``mode`` (``NAME.load`` beside
    ``NAME.json``)."""
    for path in paths.split(","):
        f = Path(path).with_suffix(".load")
        if mode in _seconds_of(path) and f.exists():
            return [float(x) for x in f.read_text().split()[:2]]
    return None


def by_digits(scores: dict[str, float]) -> dict[str, float]:
    """Accuracy per operand size, read from the ``arithmetic`` task ids (``arith-<a><op><b>``)."""
    groups: dict[str, list[float]] = {}
    for task_id, x in scores.items():
        m = re.fullmatch(r"arith-(\d+)[-+*](\d+)", task_id)
        if m:
            groups.setdefault(str(max(len(m[1]), len(m[2]))), []).append(x)
    return {d: sum(v) / len(v) for d, v in sorted(groups.items())}


def accuracy_se(scores: list[float], binary: bool) -> float:
    """Greedy (0/1 scores): the binomial se the pipeline reports; sampled: the se of the per-task avg@k."""
    n = len(scores)
    p = sum(scores) / n
    if binary:
        return binomial_se(p, n)
    return math.sqrt(sum((x - p) ** 2 for x in scores) / (n - 1) / n)


def ratio_delta_se(a: list[float], b: list[float]) -> float:
    """Delta-method se of mean(a) / mean(b) for paired per-task scores a (FP8), b (BF16)."""
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    r = ma / mb
    va = sum((x - ma) ** 2 for x in a) / (n - 1)
    vb = sum((y - mb) ** 2 for y in b) / (n - 1)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    return math.sqrt(max(0.0, va - 2 * r * cov + r * r * vb) / n) / mb


def ratio_bootstrap(a: list[float], b: list[float], reps: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of mean(a) / mean(b), resampling tasks (pairs kept together)."""
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        sb = sum(b[i] for i in idx)
        if sb > 0:
            ratios.append(sum(a[i] for i in idx) / sb)
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]


def compare(base_path: str, others: list[tuple[str, str]]) -> list[dict[str, Any]]:
    base = per_task(base_path)
    rows = []
    for mode, b_map in base.items():
        ids = sorted(b_map)
        b = [b_map[i] for i in ids]
        binary = mode == "greedy"
        rows.append({"mode": mode, "model": "bf16", "n": len(ids), "accuracy": sum(b) / len(b),
                     "se": accuracy_se(b, binary), "by_digits": by_digits(b_map), "seconds": seconds_of(base_path).get(mode),
                     "load": load_of(base_path, mode)})
        for name, path in others:
            o_map = per_task(path).get(mode)
            if o_map is None:
                continue
            if set(o_map) != set(b_map):
                raise SystemExit(f"{path}: {mode} was scored on other tasks than {base_path}")
            a = [o_map[i] for i in ids]
            g = paired_gain(b_map, o_map)
            lo, hi = ratio_bootstrap(a, b)
            rows.append({"mode": mode, "model": name, "n": len(ids), "accuracy": g.after, "se": accuracy_se(a, binary),
                         "by_digits": by_digits(o_map), "diff": g.gain, "diff_se": g.se, "gained": g.gained, "lost": g.lost,
                         "recovery": g.after / g.before, "recovery_se": ratio_delta_se(a, b),
                         "recovery_ci95": [lo, hi], "seconds": seconds_of(path).get(mode), "load": load_of(path, mode)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        lines += [f"**{mode}** ({rows[0]['n']} problems)", "",
                  ("| model | accuracy ± se | Δ vs BF16 ± paired se (points) | gained / lost | "
                   "recovery FP8/BF16 ± delta se | paired bootstrap 95% | by operand digits | eval wall s (load) |"),
                  "|---|---:|---:|---:|---:|---:|---|---:|"]
        for r in rows:
            if r["mode"] != mode:
                continue
            load = f"{r['load'][0]:.1f}→{r['load'][1]:.1f}" if r.get("load") else "?"
            wall = f"{r['seconds']:.0f} ({load})" if r.get("seconds") else "?"
            digits = " ".join(f"{d}: {100 * x:.0f}%" for d, x in r["by_digits"].items())
            if r["model"] == "bf16":
                lines.append(f"| BF16 | {100 * r['accuracy']:.1f}% ± {100 * r['se']:.1f} | — | — | — | — | {digits} | {wall} |")
                continue
            lo, hi = r["recovery_ci95"]
            lines.append(f"| {r['model']} | {100 * r['accuracy']:.1f}% ± {100 * r['se']:.1f} | "
                         f"{100 * r['diff']:+.1f} ± {100 * r['diff_se']:.1f} | {r['gained']} / {r['lost']} | "
                         f"{100 * r['recovery']:.1f}% ± {100 * r['recovery_se']:.1f} | "
                         f"{100 * lo:.1f}–{100 * hi:.1f}% | {digits} | {wall} |")
        lines.append("")
    lines.append("One environment (`arithmetic`): the median recovery over environments is this "
                 "environment's recovery.")
    return "\n".join(lines)


def export_reports(root: str | None, names: list[str]) -> dict[str, Any]:
    keep = ("calibration_texts", "calibration_tokens", "seconds_calibrate", "calibration_scales_reused",
            "seconds_search", "seconds_export", "checkpoint_bytes", "bf16_bytes", "bf16_heldout", "fp8_heldout")
    out = {}
    for name in names:
        f = Path(root or "-") / name / "quant_report.json"
        if root and f.exists():
            rep = json.loads(f.read_text())
            out[name] = {k: rep[k] for k in keep if k in rep} | {"bf16_units": rep["plan"].get("bf16_units")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="posttrain eval --out JSON of the BF16 reference")
    ap.add_argument("others", nargs="+", metavar="NAME=JSON",
                    help="posttrain eval --out JSON of each FP8 export (several files: JSON,JSON)")
    ap.add_argument("--md", help="also write the table here")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--bench-row", action="store_true", help="append to bench/results/quant_accuracy.jsonl")
    ap.add_argument("--split", choices=DATA_SPLITS, default=None,
                    help="with --bench-row: the split the eval files scored (default: the one they record)")
    ap.add_argument("--exports", metavar="DIR",
                    help="with --bench-row: DIR/<NAME>/quant_report.json of each model goes into the row "
                         "(calibration and search seconds, checkpoint size, held-out loss / KL)")
    args = ap.parse_args()
    others = []
    for item in args.others:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"expected NAME=JSON, got {item!r}")
        others.append((name, path))
    rows = compare(args.base, others)
    text = markdown(rows)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.bench_row:
        from results_row import append_row, machine, provenance

        loads = [x for r in rows if r.get("load") for x in r["load"]]
        split = args.split or eval_split([args.base, *(p for _, p in others)])
        if split not in DATA_SPLITS:
            raise SystemExit(f"--bench-row: the eval files record split {split!r}, not one of train, dev, test: "
                             "give --split")
        append_row(ROOT / "bench" / "results" / "quant_accuracy.jsonl",
                   {"bench": "quant_accuracy", "base": args.base, "others": dict(others),
                    "rows": rows, "exports": export_reports(args.exports, ["bf16"] + [n for n, _ in others]),
                    **provenance(split, machine(min(loads) if loads else -1.0, max(loads) if loads else -1.0,
                                                threads=1))})
        greedy = [r for r in rows if r["mode"] == "greedy" and r["model"] not in ("bf16", "fp32")]
        best = max(greedy, key=lambda r: r["recovery"])
        worst = min(greedy, key=lambda r: r["recovery"])
        print(f"RESULT quant_accuracy_recovery: {100 * worst['recovery']:.1f}-{100 * best['recovery']:.1f} % "
              f"(greedy FP8/BF16 on {best['n']} arithmetic problems; {worst['model']} lowest, {best['model']} "
              f"highest; delta se {100 * worst['recovery_se']:.1f}/{100 * best['recovery_se']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Curated vs unfiltered self-generated SFT data on the embedded model (posttrain/experiments/curation.py).

    python bench/curation_vs_unfiltered.py                      # ~20 min on 2 quiet cores
    python bench/curation_vs_unfiltered.py --model tiny-llama --n-prompts 8 --steps 2 --n-eval 8 --out-dir /tmp/x --no-save

The model samples replies to arithmetic training problems; ``curate()`` keeps the verified ones
(≤ k per prompt); an equal number of candidates is drawn at random before any check. The same base
model is fine-tuned on each set with identical settings and all three are measured greedily on
held-out problems. Writes ``<out-dir>/curation_vs_unfiltered.{json,png,md}``; the run directory
holds the data, checkpoints and cached stages (re-running the same command resumes). Appends one row
to bench/results/curation_vs_unfiltered.jsonl (the accuracies are on the test split, which
``experiments/stages.measure`` reads; ``--no-save``: none) and ends with ``RESULT curation_vs_unfiltered``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

NAMES = ("base", "unfiltered", "curated")
RESULTS = Path(__file__).resolve().parent / "results" / "curation_vs_unfiltered.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded", help="model spec: the base model and the sampler (default: embedded)")
    p.add_argument("--run-dir", default="runs/curation_vs_unfiltered", help="data, checkpoints, cached stages")
    p.add_argument("--out-dir", default="docs/results", help="where the JSON, PNG and markdown report go")
    p.add_argument("--n-prompts", type=int, default=160, help="arithmetic training problems to sample on")
    p.add_argument("--n-candidates", type=int, default=4, help="samples per problem")
    p.add_argument("--k", type=int, default=2, help="curate keeps at most k verified samples per problem")
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--max-new-tokens", type=int, default=64, help="sampling length limit")
    p.add_argument("--min-reward", type=float, default=1.0, help="verifier reward a sample needs to be kept (1: right answer)")
    p.add_argument("--max-digits", type=int, default=2, help="operand digits 1..N, training and held-out")
    p.add_argument("--steps", type=int, default=12, help="SFT steps, the same for both runs")
    p.add_argument("--batch-size", type=int, default=8, help="SFT conversations per step")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--n-eval", type=int, default=64, help="held-out problems (greedy)")
    p.add_argument("--eval-max-new-tokens", type=int, default=80)
    p.add_argument("--seed", type=int, default=0, help="problems, sampling, the unfiltered draw, SFT order")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--no-save", action="store_true", help="append no row to bench/results/")
    return p.parse_args(argv)


def se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def table(result: dict[str, Any]) -> list[str]:
    digits = sorted({d for n in NAMES for d in result[n]["accuracy_by_digits"]}, key=int)
    n = result["base"]["n_eval"]
    rows = [("answer accuracy (greedy)", lambda m: f"{m['accuracy']:.1%} ± {se(m['accuracy'], n):.1%}")]
    rows += [(f"  {d}-digit operands", lambda m, d=d: f"{m['accuracy_by_digits'].get(d, float('nan')):.1%}") for d in digits]
    rows += [("uses the answer format", lambda m: f"{m['answer_format_rate']:.1%}"),
             ("held-out SFT loss (gold solutions)", lambda m: f"{m['heldout_loss']:.3f}"),
             ("mean reply tokens", lambda m: f"{m['mean_reply_tokens']:.1f}")]
    out = ["| metric | base | SFT on unfiltered | SFT on curated |", "|---|---:|---:|---:|"]
    out += [f"| {label.strip()} | " + " | ".join(fmt(result[k]) for k in NAMES) + " |" for label, fmt in rows]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    digits = sorted(result["base"]["accuracy_by_digits"], key=int)
    labels = ["all"] + [f"{d}-digit" for d in digits] + ["answer format"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, name in enumerate(NAMES):
        m = result[name]
        ys = [m["accuracy"]] + [m["accuracy_by_digits"].get(d, 0) for d in digits] + [m["answer_format_rate"]]
        ax.bar([x + (i - 1) * 0.27 for x in range(len(labels))], ys, 0.27, label=name if name == "base" else f"SFT {name}")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, 1)
    ax.set_title(f"held-out greedy accuracy ({result['base']['n_eval']} problems)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args: argparse.Namespace, stage: dict[str, Any], result: dict[str, Any], minutes: float) -> str:
    n = result["base"]["n_eval"]
    dropped = "\n".join(f"| {r} | {c} |" for r, c in stage["dropped"].items())
    rejected = ", ".join(f"{r} ({c})" for r, c in stage["rejected_reasons"].items()) or "none"
    command = "python bench/curation_vs_unfiltered.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return "\n".join([
        "# Curated vs unfiltered self-generated SFT data",
        "",
        "Does rejection sampling with the verifier (``curate()``) beat training on the same model's raw samples?",
        f"Model: `{args.model}`. Generated by `bench/curation_vs_unfiltered.py` "
        "(orchestration in `posttrain/experiments/curation.py`).",
        "",
        "```",
        command.strip(),
        "```",
        "",
        "## Setup",
        "",
        f"* Sampling: {args.n_prompts} arithmetic training problems (operands 1–{args.max_digits} digits, +, −, ×) × "
        f"{args.n_candidates} samples, temperature {args.temperature}, top-p 1, ≤ {args.max_new_tokens} new tokens, seed {args.seed}.",
        f"* Curated: curate's default filters, then the math verifier (reward ≥ {args.min_reward}), near-duplicate removal, "
        f"at most k = {args.k} per problem → {stage['rows_curated']} rows.",
        f"* Unfiltered: {stage['rows_unfiltered']} rows drawn uniformly at random (seed {args.seed}) from all "
        f"{stage['candidates_logged']} candidates before any check ({stage['empty_candidates']} empty replies excluded).",
        f"* SFT (identical for both): {args.steps} steps × {args.batch_size} conversations "
        f"= {result['examples_seen_per_run']} examples each, lr {args.lr}, same seed and data order rule "
        "(`experiments/stages.run_sft`).",
        f"* Evaluation (`experiments/stages.measure`): {n} held-out problems (seed {args.seed + 2}, disjoint from training by "
        f"construction), greedy, ≤ {args.eval_max_new_tokens} new tokens, graded by the math verifier.",
        f"* Wall time: {minutes:.1f} min, torch threads = {args.threads}.",
        "",
        "## Result",
        "",
        *table(result),
        "",
        "![accuracy](curation_vs_unfiltered.png)",
        "",
        "## Curation counts",
        "",
        f"{stage['candidates']} candidates; raw pass rate of the samples (verifier reward 1): "
        f"{stage['candidate_accuracy']:.1%}; accepted (kept) {stage['accepted']}; "
        f"problems with at least one kept row: {stage['prompts_with_rows']} of {args.n_prompts}.",
        "",
        "| dropped because | candidates |",
        "|---|---:|",
        dropped,
        "",
        f"Verifier rejection reasons: {rejected}.",
        "",
        "## Noise",
        "",
        f"One seed, one sample of training problems, {n} evaluation problems. The standard error of an accuracy "
        f"p on n = {n} problems is sqrt(p(1−p)/n): ±{se(0.3, n):.1%} at p = 0.3, ±{se(0.5, n):.1%} at p = 0.5 "
        "(shown after each overall accuracy). Per-digit cells rest on about half as many problems and are "
        "noisier still. Differences smaller than about two standard errors are not evidence either way; "
        "several seeds and a larger evaluation set would be needed to call a small gap.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from posttrain.experiments.curation import compare, curation_stage

    torch.set_num_threads(args.threads)
    t0 = time.time()
    stage = curation_stage(args.model, args.run_dir, args.n_prompts, args.n_candidates, args.k, args.temperature,
                           args.max_new_tokens, args.seed, max_digits=args.max_digits, min_reward=args.min_reward, num_threads=args.threads)
    print(f"[curation] {stage['candidates']} candidates, {stage['accepted']} accepted, "
          f"{stage['rows_curated']} rows in each file", flush=True)
    if stage["rows_curated"] == 0:
        print("no candidate passed the verifier: nothing to train on (more prompts or easier problems?)")
        return 1
    result = compare(args.model, args.run_dir, stage, args.steps, args.batch_size, args.lr, args.n_eval, args.seed,
                     max_digits=args.max_digits, max_new_tokens=args.eval_max_new_tokens)
    minutes = (time.time() - t0) / 60
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curation_vs_unfiltered.json").write_text(json.dumps(
        {"args": vars(args), "curation": stage, "comparison": result, "minutes": round(minutes, 1)}, indent=2))
    plot(result, out / "curation_vs_unfiltered.png")
    text = report(args, stage, result, minutes)
    (out / "curation_vs_unfiltered.md").write_text(text)
    print(text)
    from posttrain.experiments.pipeline import curation_pairs

    gains = curation_pairs(result)
    if not args.no_save:
        from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

        keep = ("n_eval", "accuracy", "accuracy_by_digits", "answer_format_rate", "heldout_loss", "mean_reply_tokens")
        counts = ("candidates", "accepted", "rows_curated", "rows_unfiltered", "candidate_accuracy")
        append_row(RESULTS, {"bench": "curation_vs_unfiltered", "args": vars(args), "minutes": round(minutes, 1),
                             "curation": {k: stage[k] for k in counts if k in stage},
                             "models": {n: {k: result[n][k] for k in keep if k in result[n]} for n in NAMES},
                             "gains": gains,
                             **provenance("test")})  # measure()'s held-out accuracy: reported, nothing chosen on it
    g = gains.get("curated − unfiltered")
    paired = f" {g['gain']:+.3f} ± {g['se']:.3f} paired;" if g else ""
    print(f"RESULT curation_vs_unfiltered: {result['curated']['accuracy'] - result['unfiltered']['accuracy']:+.3f} "
          f"accuracy (SFT on curated − SFT on unfiltered, greedy, {result['base']['n_eval']} held-out problems;"
          f"{paired} base {result['base']['accuracy']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

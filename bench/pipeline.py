"""The main job's figures: ``posttrain pipeline`` runs, their wall/CPU time and their gains with noise.

    python bench/pipeline.py --quick --seeds 0 1 2        # three fresh --quick runs, one after another
    python bench/pipeline.py --config recipes/pipeline_evidence.yaml --seeds 0 1 2   # the RL-vs-control evidence
    python bench/pipeline.py --run-dir runs/pipeline      # record a finished run (e.g. the default one)
    python bench/pipeline.py --row 76 --row 77 --run-dir runs/pipeline-s2   # pool with rows already recorded

Each run's row has, per measured model (before / after SFT / after RL / longer SFT), the greedy
answer accuracy and answer-format rate on the held-out problems with their binomial standard
errors, each stage's paired gain ± paired standard error (eval/compare.py), the summed stage wall
time, the CPU time of the run's process and the load average at each stage's start and end (the CPU
may be shared: wall time alone says little), and the test table of the RLVR stage against its two
equal-compute SFT controls (experiments/evidence.py). Every figure it reads is on the ``test`` split,
which nothing was chosen on (the row says ``split``). Appends one JSON line per run to
bench/results/pipeline.jsonl and ends with ``RESULT pipeline...: ...`` lines: the SFT gain, and for
runs with the controls ``RESULT pipeline_rl_vs_control``: RL − SFT for the same time, pooled over the
test tasks of every RLVR environment, mean over the runs ± the standard error of that mean from the
runs' paired standard errors; for fresh ``--quick`` runs also ``RESULT pipeline_quick_time``, the
slowest run's wall time with process start (the target is 4 minutes on 2 idle cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, commit, cpu_facts, speed_env  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pipeline.jsonl"


def summarize(run_dir: Path) -> dict:
    """The row of one finished run, from its report.json and stage results."""
    from posttrain.experiments.pipeline_report import binomial_se

    rep = json.loads((run_dir / "report.json").read_text())
    stages = {p.stem: json.loads(p.read_text()) for p in (run_dir / "stages").glob("*.json")}
    n = rep["before"]["n_eval"]
    models = {}
    for key in ("before", "after", "after_rl", "after_sft_arm"):
        m = rep.get(key)
        if m:
            models[key] = {"accuracy": m["accuracy"], "accuracy_se": round(binomial_se(m["accuracy"], n), 4),
                           "answer_format_rate": m["answer_format_rate"],
                           "answer_format_se": round(binomial_se(m["answer_format_rate"], n), 4),
                           "heldout_loss": round(m["heldout_loss"], 4), "accuracy_by_digits": m["accuracy_by_digits"]}
            if "sampled_accuracy" in m:  # pass@1 of sampled_k answers a problem (the SFT/RL/arm checkpoints)
                models[key].update({f: m[f] for f in ("sampled_accuracy", "sampled_k", "sampled_temperature")})
    gains = {name: {k: {f: g[k][f] for f in ("gain", "se", "gained", "lost", "n")}
                    for k in ("accuracy", "format", "sampled") if k in g}
             for name, g in rep.get("gains", {}).items()}
    cfg = {}
    if (run_dir / "pipeline.yaml").exists():
        import yaml

        cfg = yaml.safe_load((run_dir / "pipeline.yaml").read_text())
    return {
        "run_dir": str(run_dir), "seed": cfg.get("seed"), "n_eval": n, "models": models, "gains": gains,
        "wall_s": round(sum(s.get("seconds", 0.0) for s in stages.values()), 1),
        "cpu_s": round(sum(s.get("cpu_seconds", 0.0) for s in stages.values()), 1),
        "stages": {k: {f: s.get(f) for f in ("seconds", "cpu_seconds", "load_avg")} for k, s in stages.items()},
        "config": cfg, "split": (rep.get("test") or {}).get("split", "test"),
        "test": rep.get("test"),  # scores and paired comparisons per domain (evidence.table)
        "sft_precision": _read_json(run_dir / "sft" / "precision.json"),
        "sections": sections(run_dir),
    }


def sections(run_dir: Path) -> dict[str, Any]:
    """The optional sections' figures with their noise: curation's accuracies and paired gains, the
    distill student's and the RLHF run's validation gains over their start (as report.md shows them)."""
    from posttrain.experiments.pipeline import curation_pairs
    from posttrain.experiments.pipeline_report import validation_gains

    out: dict[str, Any] = {}
    cur = {n: _read_json(run_dir / "curation" / "stages" / f"{n}.json") for n in ("base", "unfiltered", "curated")}
    if all("per_task" in m for m in cur.values()):
        out["curation"] = {"accuracy": {n: m["accuracy"] for n, m in cur.items()}, "gains": curation_pairs(cur)}
    for name, sub in (("distill", "mopd"), ("rlhf", "rlhf")):
        stage = _read_json(run_dir / "stages" / f"{sub}.json")
        if stage.get("steps"):
            out[name] = validation_gains(run_dir / sub, stage["steps"])
    return out


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def kind(run_dir: Path) -> tuple[str, dict[str, Any]]:
    """(``quick`` when the run's resolved config has ``--quick``'s sizes (whatever its directory name),
    else ``default``; the settings in which it differs from that kind's current defaults). A row with
    differences is not a run of today's command: its ``differs`` says what it ran instead."""
    import yaml

    from posttrain.configs.pipeline import QUICK, PipelineConfig

    cfg_path = run_dir / "pipeline.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    sizes = ("n_train", "sft_steps", "rl_steps", "n_eval")
    name = "quick" if cfg and all(cfg.get(k) == QUICK[k] for k in sizes) else "default"
    ref = PipelineConfig(**(QUICK if name == "quick" else {})).model_dump()
    skip = {"run_dir", "seed", "sft_arm", "tokens_arm", "test_base", "anchor_control", "distill", "rlhf", "curation",
            "rlvr"}  # where and which stages: not settings
    differs = {k: v for k, v in cfg.items() if k not in skip and k in ref and ref[k] != v}
    return name, differs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="run fresh `posttrain pipeline --quick` runs")
    p.add_argument("--config", help="run fresh `posttrain pipeline --config FILE` runs (e.g. recipes/pipeline_evidence.yaml)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--run-dir", action="append", default=[], help="record a finished run (repeatable)")
    p.add_argument("--row", type=int, action="append", default=[],
                   help="pool with the run recorded in this line of bench/results/pipeline.jsonl (1-based; "
                        "repeatable): its figures enter the RESULT lines, no row is appended for it again")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the runs (sets OMP_NUM_THREADS, which also makes the runs' threads wait "
                        "PASSIVE); default: none set, the newcomer's command as it is (one thread per idle core, "
                        "models/threads.py)")
    p.add_argument("--no-save", action="store_true", help="print only, append no row")
    p.add_argument("overrides", nargs="*", help="extra PipelineConfig overrides for the --quick runs, e.g. sft_freeze_layers=0; "
                                                "give them before --seeds, which takes every word after it")
    args = p.parse_args()
    if not (args.quick or args.config) and not args.run_dir and not args.row:
        p.error("give --quick or --config (run), --run-dir (record) or --row (pool recorded runs)")
    recorded = RESULTS.read_text().splitlines()
    for n in args.row:
        if not 1 <= n <= len(recorded):
            p.error(f"--row {n}: {RESULTS.name} has {len(recorded)} lines")
    old_rows = [json.loads(recorded[n - 1]) for n in args.row]

    runs: list[Path] = [Path(d) for d in args.run_dir]
    process_s: dict[Path, float] = {}  # wall of each fresh run, process start included
    if args.quick or args.config:
        for seed in args.seeds:
            tag = "quick" if args.quick else Path(args.config).stem
            d = ROOT / "runs" / f"{tag}-s{seed}"
            how = ["--quick"] if args.quick else ["--config", args.config]
            cmd = [sys.executable, "-m", "posttrain.cli", "pipeline", *how, "--fresh", f"seed={seed}",
                   f"run_dir={d}", *args.overrides]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            if args.threads is not None:  # else whatever the CLI picks, as a newcomer's run would
                env["OMP_NUM_THREADS"] = str(args.threads)
            t = time.time()
            print("$ " + " ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, env=env, cwd=ROOT)
            process_s[d] = round(time.time() - t, 1)
            print(f"[bench] seed {seed}: {process_s[d]:.0f} s wall including process start", flush=True)
            runs.append(d)

    rows = []
    for d in runs:
        run_kind, differs = kind(d)
        row = {"bench": "pipeline", "kind": run_kind, "differs": differs, "command": " ".join(sys.argv),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit(), "cpus": os.cpu_count(), "cpu": cpu_facts(),
               "threads": args.threads if args.threads is not None else "cli-default", "env": speed_env(),
               "loadavg_end": [round(x, 2) for x in os.getloadavg()],
               "python": platform.python_version(), **summarize(d)}
        if d in process_s:
            row["process_wall_s"] = process_s[d]
        rows.append(row)
        print(f"{d}: wall {row['wall_s'] / 60:.1f} min, CPU {row['cpu_s'] / 60:.1f} min")
        for name, g in row["gains"].items():
            a, f = g["accuracy"], g["format"]
            print(f"  {name:28s} accuracy {a['gain']:+.1%} ± {a['se']:.1%}   format {f['gain']:+.1%} ± {f['se']:.1%}")
    new_rows, rows = rows, old_rows + rows
    lines = result_lines(rows)
    if not args.no_save:
        for i, row in enumerate(new_rows):
            if i == len(new_rows) - 1 and len(rows) > 1:  # the pooled figures live in the last new row
                row["pooled"] = {"rows": args.row, "runs": [r["run_dir"] for r in rows], "results": lines}
            append_row(RESULTS, row)
        print(f"appended {len(new_rows)} rows to {RESULTS}")
    for line in lines:
        print(line)


def result_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The RESULT lines over the rows (recorded and new): SFT gain, --quick time, RL − control."""
    from posttrain.eval.compare import mean_over_runs

    out = []
    key = "SFT (after SFT − before)"
    sft = [r["gains"][key]["accuracy"] for r in rows if key in r["gains"]]
    rl = [r["gains"]["RL (after RL − after SFT)"]["accuracy"] for r in rows if "RL (after RL − after SFT)" in r["gains"]]
    name = "pipeline_quick" if all(r["kind"] == "quick" for r in rows) else "pipeline"
    if sft:
        z = min(g["gain"] / g["se"] if g["se"] else float("inf") for g in sft)
        mean = sum(g["gain"] for g in sft) / len(sft)
        extra = ""
        if rl and name == "pipeline":  # RL over its SFT start: mean over the runs ± the se of that mean
            g, se = mean_over_runs([(x["gain"], x["se"]) for x in rl])
            extra = f"; RL {g * 100:+.1f} ± {se * 100:.1f} points"
            sampled = [r["gains"]["RL (after RL − after SFT)"].get("sampled") for r in rows
                       if "RL (after RL − after SFT)" in r["gains"]]
            if sampled and all(sampled):
                g, se = mean_over_runs([(x["gain"], x["se"]) for x in sampled])
                extra += f", sampled accuracy {g * 100:+.1f} ± {se * 100:.1f}"
        out.append(f"RESULT {name}: {mean * 100:+.1f} points (test answer accuracy gain of SFT, mean of {len(sft)} "
                   f"run(s), smallest gain/paired-se {z:.1f}{extra})")
    walls = [r["process_wall_s"] for r in rows if "process_wall_s" in r]
    if name == "pipeline_quick" and walls:
        out.append(f"RESULT pipeline_quick_time: {max(walls):.0f} s (the slowest of {len(walls)} fresh `posttrain "
                   f"pipeline --quick` runs, process start included; each: {', '.join(f'{w:.0f}' for w in walls)} s; "
                   f"load at the end {os.getloadavg()[0]:.2f}; target 240 s)")
    line = rl_vs_control_line([r["test"] for r in rows if r.get("test")])
    if line:
        out.append(line)
    return out


def rl_vs_control_line(tables: list[dict[str, Any]]) -> str | None:
    """``RESULT pipeline_rl_vs_control`` from the runs' test tables: the pooled RL − SFT same time per
    run, their mean ± sqrt(sum se²)/n (independent runs, each a paired se) and the standard error
    between runs (sd/√n of the runs' gains), RL − SFT same tokens the same way (and RL − RFT same
    rollouts, pooled and per domain, where every run has it), the rows (domains, wordings) beyond +2
    and below −1 paired se in every run, the domains where RL is no better than a constant answer, and
    RL − SFT same time on each math family's questions that no shortcut answers (evidence.shortcut_answers)."""
    from posttrain.eval.compare import mean_and_se, mean_over_runs
    from posttrain.experiments import evidence

    per = {c: [evidence.headline(t, c) for t in tables] for c in ("RL − SFT same time", "RL − SFT same tokens")}
    time_g = [g for g in per["RL − SFT same time"] if g]
    if not time_g:
        return None

    def pooled(gs: list[dict[str, Any]]) -> str:
        mean, se = mean_over_runs([(g["gain"], g["se"]) for g in gs])
        if len(gs) < 2:
            return f"{mean * 100:+.1f} ± {se * 100:.1f}"
        # the paired se is within runs (over tasks); how much the runs differ is the other half of the noise
        between = mean_and_se([g["gain"] for g in gs])[1]
        return f"{mean * 100:+.1f} ± {se * 100:.1f} (± {between * 100:.1f} between runs)"

    seeds = ", ".join(f"{g['gain'] * 100:+.1f} ± {g['se'] * 100:.1f}" for g in time_g)
    rows = [set(t["comparisons"].get("RL − SFT same time", {})) for t in tables]
    common = sorted(set.intersection(*rows)) if rows else []
    above = [r for r in common if all((t["comparisons"]["RL − SFT same time"][r]["gain"]
                                       > 2 * t["comparisons"]["RL − SFT same time"][r]["se"]) for t in tables)]
    below = [r for r in common if any((t["comparisons"]["RL − SFT same time"][r]["gain"]
                                       < -t["comparisons"]["RL − SFT same time"][r]["se"]) for t in tables)]
    tok = [g for g in per["RL − SFT same tokens"] if g]
    ext = [t["external"]["comparisons"].get("RL − SFT same time", {}).get(evidence.EXTERNAL_ENV)
           for t in tables if t.get("external")]
    ext_text = (f"; {evidence.EXTERNAL_ENV} graded by IFEval's checkers, RL − SFT same time {pooled(ext)}"
                if ext and all(ext) and len(ext) == len(tables) else "")
    domains = [r for r in common if " · " not in r and r not in ("all", "all without flagged")]
    by_domain = ("; per domain, mean of runs: " + ", ".join(
        f"{d} {pooled([t['comparisons']['RL − SFT same time'][d] for t in tables])}" for d in domains)
        if len(domains) > 1 else "")
    rft = [t["comparisons"].get("RL − RFT same rollouts", {}) for t in tables]
    rft_rows = [r for r in ("all", *domains) if rft and all(r in c for c in rft)]
    rft_text = ("; RL − RFT same rollouts " + ", ".join(f"{r} {pooled([c[r] for c in rft])}" for r in rft_rows)
                if rft_rows else "")
    num = [t["math_verify"]["comparisons"].get("RL − SFT same time", {}) for t in tables if t.get("math_verify")]
    num_rows = sorted(set.intersection(*map(set, num))) if num and len(num) == len(tables) else []
    num_text = ("; graded by Math-Verify, RL − SFT same time " + ", ".join(
        f"{d} {pooled([n[d] for n in num])}" for d in num_rows if " · " not in d) if num_rows else "")
    flagged = [{env for env, c in t.get("constant_answer", {}).items() if c["models"].get("rl", {}).get("flagged")}
               for t in tables]
    lazy_text = ("; RL no better than one constant answer in some run: " + ", ".join(
        f"{env} ({sum(env in f for f in flagged)} of {len(tables)} runs)" for env in sorted(set().union(*flagged)))
        if any(flagged) else "")
    cuts = [t.get("shortcuts", {}) for t in tables]
    families = sorted(set.intersection(*map(set, cuts))) if cuts else []
    cut_text = "".join(
        f"; {fam} questions no shortcut answers ({', '.join(sorted(cuts[0][fam]['pays']))}; "
        f"{'/'.join(str(c[fam]['n_beyond']) for c in cuts)} tasks), RL − SFT same time "
        f"{pooled([c[fam]['beyond_comparisons']['RL − SFT same time'] for c in cuts])}"
        for fam in families if all("RL − SFT same time" in c[fam]["beyond_comparisons"] for c in cuts))
    return (f"RESULT pipeline_rl_vs_control: {pooled(time_g)} points (test, RL − SFT for the same time, pooled over "
            f"the RLVR environments' test tasks, mean of {len(time_g)} run(s): {seeds}; RL − SFT same tokens "
            f"{pooled(tok) if tok else 'n/a'}{by_domain}{rft_text}; beyond +2 se in every run: {', '.join(above) or 'none'}; "
            f"below −1 se in some run: {', '.join(below) or 'none'}{lazy_text}{cut_text}{ext_text}{num_text})")


if __name__ == "__main__":
    main()

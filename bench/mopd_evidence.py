"""MOPD's two claims over three student seeds, on test: the report of bench/mopd_evidence.sh's runs.

    bash bench/mopd_evidence.sh                      # the runs (resumable)
    python bench/mopd_evidence.py [--runs runs/mopd3] [--seeds 0 1 2] [--no-record]

Scores on the **test** split (96 tasks per domain, greedy, the runs' 128-token budget) the base
model, both teachers, and per seed the MOPD student (step 10) and the GRPO student at equal student
rollouts (step 10) and at equal training time (the first saved step whose summed step time reaches
the MOPD run's; picked from the runs' step times, never from a score). Missing scores are written
once by ``posttrain validate --split test`` into ``<runs>/test/`` and reused; the instruction
answers are graded again by IFEval's reference checkers (``experiments.evidence.external_records``).

The rules, fixed before any figure (issue 35 item 4):
* teachers: each ``--pick-teacher`` picks its run's checkpoint with the best **dev** score on its own
  domain (ties: the later step); on test it must sit >= 3 paired se above the base on that domain;
* (a) consolidation: on each domain the student's three-seed mean is within 1 se of that domain's
  teacher, or above it; and above the GRPO student of equal time on at least one domain (beyond 2
  paired se: row 1-2 of the results file counted any positive mean, which called math's
  +0.3 ± 2.6 "above");
* (b) efficiency: MOPD − GRPO at equal rollouts and at equal time, pooled, and the dev curves
  (the runs' own validation, every 5 steps) of held-out score against student rollouts.
Chooses nothing: every comparison is printed whatever its sign. The last line is
``RESULT mopd_evidence: <MOPD − GRPO equal time, pooled> points (...)``; the row goes to
bench/results/mopd_evidence.jsonl unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, provenance, record_args  # noqa: E402  (bench/results_row.py)

RESULTS = ROOT / "bench" / "results" / "mopd_evidence.jsonl"
RECIPE = "recipes/mopd_evidence_rl.yaml"
DOMAINS = ("math", "instruction")
TEACHERS = {"math": ["teacher_math"], "instruction": ["teacher_instruction", "teacher_instruction_sft"]}
"""Each domain's teacher candidates in the registered order (bench/mopd_evidence.sh)."""
MOPD_STEPS = 10  # bench/mopd_evidence.sh: the MOPD run's length, and the GRPO step of equal rollouts


def metrics(run: Path) -> list[dict[str, Any]]:
    from posttrain.train.metrics import read_metrics

    return read_metrics(run)


def checkpoint(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def best_dev_checkpoint(run: Path, domain: str) -> Path:
    """The RL run's checkpoint with the best dev score on ``domain`` (ties: the later step), among the
    steps it validated with records (every validated step is saved: eval_every is a multiple of
    save_every in both recipes; a candidate not picked may have had its checkpoints deleted)."""
    scored = [(r[f"val_reward/{domain}"], r["step"]) for r in metrics(run)
              if f"val_reward/{domain}" in r and r["step"] > 0
              and (run / "validation" / f"step_{r['step']:06d}.jsonl").is_file()]
    if not scored:
        raise SystemExit(f"{run}: no validated step with a dev score on {domain}: has the run finished?")
    return checkpoint(run, max(scored)[1])


def dev_records(runs: Path, model: Path | str, name: str) -> Path:
    """Dev records of ``model`` on the recipe's validation tasks (the RL runs' own, for RL checkpoints)."""
    if isinstance(model, Path) and model.parent.name == "checkpoints":
        own = model.parent.parent / "validation" / f"{model.name}.jsonl"
        if own.is_file():
            return own
    out = runs / "dev" / f"{name}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "posttrain.cli", "validate", "-c", RECIPE, "--model", str(model),
                        "--split", "dev", "--out", str(out), "--threads", "1", "--no-progress"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def pick_teacher(runs: Path, domain: str, candidates: list[str]) -> Path:
    """The first candidate (in the registered order) whose checkpoint sits >= 3 paired se above the base
    on ``domain``'s **dev** tasks; an RL run's checkpoint is its best dev step, an SFT run's its last.
    None passing: the first, and the report says the bar is not met. Prints each candidate's figure."""
    from posttrain.eval.compare import paired_gain, read_task_rewards

    base = read_task_rewards(dev_records(runs, "embedded", "base"))[domain]
    first = None
    for name in candidates:
        run = runs / name
        ckpt = (best_dev_checkpoint(run, domain) if (run / "validation").is_dir()
                else checkpoint(run, max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))))
        g = paired_gain(base, read_task_rewards(dev_records(runs, ckpt, name))[domain])
        ok = g.se > 0 and g.gain >= 3 * g.se
        print(f"{name}: {ckpt.name} {domain} dev {g.before:.3f} -> {g.after:.3f}, {g.gain:+.3f} ± {g.se:.3f} "
              f"({'meets' if ok else 'misses'} the 3-se bar)", file=sys.stderr)
        first = first or ckpt
        if ok:
            return ckpt
    return first


def train_seconds(run: Path) -> dict[int, float]:
    """Summed step time (sampling, scoring, update; validation excluded) after each step."""
    total, out = 0.0, {}
    for r in metrics(run):
        if "step_s" in r:
            total += r["step_s"]
            out[r["step"]] = total
    return out


def equal_time_step(grpo: Path, mopd_seconds: float) -> int:
    """The first saved GRPO step whose summed step time reaches ``mopd_seconds`` (else the last)."""
    saved = sorted(int(p.name.split("_")[1]) for p in (grpo / "checkpoints").glob("step_*"))
    seconds = train_seconds(grpo)
    return next((s for s in saved if seconds.get(s, 0.0) >= mopd_seconds), saved[-1])


def score(model: Path | str, out: Path, config_dir: Path) -> Path:
    """Test records of ``model`` (written once, then reused), with the IFEval grades beside them
    (``config_dir``: a run of the recipe, whose config.yaml names the instruction tasks)."""
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "posttrain.cli", "validate", "-c", RECIPE, "--model", str(model),
                        "--split", "test", "--out", str(out), "--threads", "1", "--no-progress"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    ifeval = out.with_suffix(".ifeval.jsonl")
    if not ifeval.is_file():
        from posttrain.experiments.evidence import external_records

        external_records(config_dir, out, "test", 96)
    return out


def gains(before: Path, after: Path) -> dict[str, dict[str, float]]:
    """Per domain, pooled, and IFEval's grade of instruction: after − before, paired over tasks."""
    from posttrain.eval.compare import paired_gain, read_task_rewards

    def row(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        g = paired_gain(x, y)
        return {"before": g.before, "after": g.after, "gain": g.gain, "se": g.se, "n": g.n}

    a, b = read_task_rewards(before), read_task_rewards(after)
    out = {d: row(a[d], b[d]) for d in DOMAINS}
    out["pooled"] = row(*({f"{d}/{k}": v for d in DOMAINS for k, v in m[d].items()} for m in (a, b)))
    ia, ib = before.with_suffix(".ifeval.jsonl"), after.with_suffix(".ifeval.jsonl")
    if ia.is_file() and ib.is_file():
        out["instruction (IFEval)"] = row(read_task_rewards(ia)["instruction"], read_task_rewards(ib)["instruction"])
    return out


def over_seeds(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean over seeds ± sqrt(Σ se²)/n (the seeds' paired errors) and ± sd/√n between seeds."""
    out = {}
    for key in per_seed[0]:
        gs = [p[key]["gain"] for p in per_seed]
        out[key] = {"gain": sum(gs) / len(gs), "se": math.sqrt(sum(p[key]["se"] ** 2 for p in per_seed)) / len(gs),
                    "between": statistics.stdev(gs) / math.sqrt(len(gs)) if len(gs) > 1 else 0.0,
                    "per_seed": gs}
    return out


def dev_curve(run: Path, rollouts_per_step: int = 36) -> list[dict[str, float]]:
    """The run's own dev validation: student rollouts, summed step seconds, score per domain."""
    seconds = train_seconds(run)
    return [{"step": r["step"], "rollouts": r["step"] * rollouts_per_step, "seconds": seconds.get(r["step"], 0.0),
             **{d: r[f"val_reward/{d}"] for d in DOMAINS}} for r in metrics(run) if "val_reward/math" in r]


def off_topic(records: Path) -> int:
    """Instruction answers our verifier fails for leaving the prompt's topic (its substance rule, which
    IFEval's checkers do not have): where the two graders part."""
    from posttrain.eval.compare import read_task_reasons

    return sum("substance" in reason for reason in read_task_reasons(records).get("instruction", []))


def teacher_gap(run: Path) -> dict[str, list[float]]:
    """Per domain, the MOPD run's sampled reverse KL to the teacher (``mopd_gap/<env>``, nat per token)
    at its first and last step: how far the student is from each teacher, and whether it closed."""
    rows = [r for r in metrics(run) if any(k.startswith("mopd_gap/") for k in r)]
    return {d: [rows[0].get(f"mopd_gap/{d}", float("nan")), rows[-1].get(f"mopd_gap/{d}", float("nan"))]
            for d in DOMAINS} if rows else {}


def plot(curves: dict[str, list[dict[str, float]]], out: Path) -> None:
    """Dev score against student rollouts, one panel per domain, every seed's MOPD and GRPO curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DOMAINS), figsize=(10, 3.6), sharey=True)
    for ax, d in zip(axes, DOMAINS):
        for name, pts in curves.items():
            kind = name.split("_")[0]
            ax.plot([p["rollouts"] for p in pts], [p[d] for p in pts], marker="o", ms=3, alpha=0.8,
                    color="tab:blue" if kind == "mopd" else "tab:orange", label=name)
        ax.set_title(f"{d} (dev, 96 tasks, greedy)")
        ax.set_xlabel("student rollouts")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out reward")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def fmt(g: dict[str, float]) -> str:
    star = "*" if g["se"] and abs(g["gain"]) > 2 * g["se"] else ""
    return f"{100 * g['gain']:+.1f} ± {100 * g['se']:.1f}{star}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="runs/mopd3", help="bench/mopd_evidence.sh's run folder (MOPD_DIR)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--pick-teacher", nargs="+", metavar="DOMAIN RUN",
                    help="DOMAIN RUN [RUN ...]: print the teacher checkpoint for DOMAIN, the first RUN (under "
                         "--runs) that meets the dev bar, and exit")
    record_args(ap, RESULTS)
    args = ap.parse_args()
    runs = (ROOT / args.runs).resolve() if not Path(args.runs).is_absolute() else Path(args.runs)
    if args.pick_teacher:
        domain, *candidates = args.pick_teacher
        print(pick_teacher(runs, domain, candidates).relative_to(ROOT))
        return 0

    test = runs / "test"
    teachers = {d: pick_teacher(runs, d, c) for d, c in TEACHERS.items()}
    jobs: dict[str, Path | str] = {"base": "embedded", **{f"teacher_{d}": p for d, p in teachers.items()}}
    plan = {}
    for s in args.seeds:
        mopd, grpo = runs / f"mopd_mix_s{s}", runs / f"grpo_mix_s{s}"
        mopd_s, grpo_s = train_seconds(mopd)[MOPD_STEPS], train_seconds(grpo)
        eq = equal_time_step(grpo, mopd_s)
        plan[s] = {"mopd_seconds": mopd_s, "grpo_equal_time_step": eq, "grpo_equal_time_seconds": grpo_s[eq],
                   "grpo_equal_rollouts_seconds": grpo_s[MOPD_STEPS]}
        jobs[f"mopd_s{s}"] = checkpoint(mopd, MOPD_STEPS)
        jobs[f"grpo_rollouts_s{s}"] = checkpoint(grpo, MOPD_STEPS)
        jobs[f"grpo_time_s{s}"] = checkpoint(grpo, eq)
    with ThreadPoolExecutor(2) as pool:  # two validations at a time, one thread each
        grpo = runs / f"grpo_mix_s{args.seeds[0]}"  # a run of RECIPE: its config.yaml names the test tasks
        files = dict(zip(jobs, pool.map(lambda kv: score(kv[1], test / f"{kv[0]}.jsonl", grpo), jobs.items())))

    teacher_vs_base = {d: gains(files["base"], files[f"teacher_{d}"]) for d in DOMAINS}
    seeds = {}
    for s in args.seeds:
        m = files[f"mopd_s{s}"]
        seeds[s] = {"MOPD − base": gains(files["base"], m),
                    "MOPD − teacher math": gains(files["teacher_math"], m),
                    "MOPD − teacher instruction": gains(files["teacher_instruction"], m),
                    "MOPD − GRPO equal rollouts": gains(files[f"grpo_rollouts_s{s}"], m),
                    "MOPD − GRPO equal time": gains(files[f"grpo_time_s{s}"], m),
                    "GRPO equal time − base": gains(files["base"], files[f"grpo_time_s{s}"])}
    mean = {c: over_seeds([seeds[s][c] for s in args.seeds]) for c in seeds[args.seeds[0]]}

    print("teachers (test, paired over 96 tasks):")
    bar_teachers = {}
    for d in DOMAINS:
        g = teacher_vs_base[d][d]
        bar_teachers[d] = g["gain"] >= 3 * g["se"] > 0
        print(f"  {teachers[d].relative_to(ROOT)}: {d} {g['before']:.3f} -> {g['after']:.3f}, {fmt(g)} points "
              f"({g['gain'] / g['se'] if g['se'] else float('nan'):.1f} se; bar >= 3 se: {'met' if bar_teachers[d] else 'not met'})")
    keys = ["math", "instruction", "instruction (IFEval)", "pooled"]
    print("\n| test, points, ± paired se (* beyond 2 se) | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for c, per in mean.items():
        print(f"| {c}, seeds {' / '.join(map(str, args.seeds))} | "
              + " | ".join(" / ".join(fmt(seeds[s][c][k]) for s in args.seeds) if k in per else "–" for k in keys) + " |")
        print(f"| {c}, mean (± between seeds) | "
              + " | ".join(f"{fmt(per[k])} ({100 * per[k]['between']:.1f})" if k in per else "–" for k in keys) + " |")
    within = {d: mean[f"MOPD − teacher {d}"][d]["gain"] >= -mean[f"MOPD − teacher {d}"][d]["se"] for d in DOMAINS}
    # "above" = beyond 2 paired se: a mean a fraction of its error above zero is level, not above
    above = {d: (g := mean["MOPD − GRPO equal time"][d])["gain"] > 2 * g["se"] for d in DOMAINS}
    print(f"\n(a) student within 1 se of each teacher or above: "
          + ", ".join(f"{d} {'yes' if within[d] else 'no'}" for d in DOMAINS)
          + "; beyond 2 se above GRPO of equal time on: " + (", ".join(d for d in DOMAINS if above[d]) or "neither"))
    print("equal time: " + "; ".join(f"seed {s}: MOPD {p['mopd_seconds']:.0f} s, GRPO step {p['grpo_equal_time_step']} "
                                      f"{p['grpo_equal_time_seconds']:.0f} s (step 10: {p['grpo_equal_rollouts_seconds']:.0f} s)"
                                      for s, p in plan.items()))
    gaps = {s: teacher_gap(runs / f"mopd_mix_s{s}") for s in args.seeds}
    print("reverse KL to the teacher, first -> last MOPD step (nat/token): " + "; ".join(
        f"seed {s}: " + ", ".join(f"{d} {g[0]:.3f} -> {g[1]:.3f}" for d, g in gap.items()) for s, gap in gaps.items()))
    substance = {name: off_topic(path) for name, path in files.items()}
    print("instruction answers off the topic (our substance rule), of 96: "
          + ", ".join(f"{k} {v}" for k, v in substance.items()))
    curves = {f"{kind}_s{s}": dev_curve(runs / f"{kind}_mix_s{s}") for s in args.seeds for kind in ("mopd", "grpo")}
    print("\ndev curves (the runs' own validation; rollouts: score math / instruction):")
    for name, pts in curves.items():
        print(f"  {name}: " + ", ".join(f"{p['rollouts']}: {p['math']:.3f}/{p['instruction']:.3f}" for p in pts))

    eq = mean["MOPD − GRPO equal time"]["pooled"]
    line = (f"RESULT mopd_evidence: {100 * eq['gain']:+.1f} points (test, MOPD − GRPO of equal training time, pooled "
            f"over math and instruction, mean of {len(args.seeds)} student seeds ± {100 * eq['se']:.1f} paired "
            f"(± {100 * eq['between']:.1f} between seeds); equal rollouts "
            f"{fmt(mean['MOPD − GRPO equal rollouts']['pooled'])}; MOPD − teacher math "
            f"{fmt(mean['MOPD − teacher math']['math'])}, instruction {fmt(mean['MOPD − teacher instruction']['instruction'])}; "
            f"teachers − base {fmt(teacher_vs_base['math']['math'])} / {fmt(teacher_vs_base['instruction']['instruction'])})")
    print(line)
    if not args.no_record:
        plot(curves, ROOT / "docs" / "results" / "mopd_seeds.png")
        append_row(Path(args.results), {
            "bench": "mopd_evidence", "seeds": args.seeds, "runs": str(runs.relative_to(ROOT)),
            "teachers": {d: str(p.relative_to(ROOT)) for d, p in teachers.items()},
            "teacher_vs_base": teacher_vs_base, "teacher_bar_met": bar_teachers, "per_seed": seeds, "mean": mean,
            "student_within_1se": within, "student_above_grpo_equal_time": above, "equal_time": plan, "teacher_gap": gaps, "off_topic": substance,
            "dev_curves": curves, "result": line, **provenance("test")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tables and plots for docs/results/rlvr.md and docs/results/mopd.md from bench/rl_evidence.sh's runs.

    python bench/rl_evidence_report.py [--runs runs/evidence] [--out docs/results] [--no-save]

Held-out score = the run's own validation (greedy, n validation-split tasks per environment, the
same tasks in every run with the same n), read from metrics.jsonl at step 0 (the base model) and at
the last step. A score is a mean over n tasks, so its standard error is about sqrt(p(1-p)/n):
0.04-0.07 for the n = 48 scores here, 0.03-0.05 for the n = 96 ones of (a)'s final runs.
Appends the summary (rl_evidence.json without the curves) to bench/results/rl_evidence.jsonl: the
runs' validation, i.e. their dev tasks (``--no-save``: no row).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ENVS = ["math", "mcq", "instruction"]


def read(run: Path) -> list[dict]:
    f = run / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def val_at(rows: list[dict], step: int | None = None) -> dict[str, float]:
    """val_reward/<env> at ``step`` (None: the last step with validation)."""
    have = [r for r in rows if any(k.startswith("val_reward/") for k in r)]
    if not have:
        return {}
    row = have[-1] if step is None else next((r for r in have if r["step"] == step), {})
    return {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("val_reward/")}


def se(p: float, n: int = 48) -> float:
    """Binomial standard error of a mean of n 0/1 rewards."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def fmt(p: float | None) -> str:
    return "–" if p is None else f"{p:.3f} ± {se(p):.3f}"


def curve(rows: list[dict], env: str, per_step: int) -> list[tuple[int, float, float]]:
    """(rollouts so far, rollout tokens so far, val score) at each validation of ``env``."""
    out, rollouts, tokens = [], 0, 0.0
    for r in rows:
        if r["step"] > 0 and "response_tokens_mean" in r:
            rollouts += per_step
            tokens += per_step * r["response_tokens_mean"]
        if f"val_reward/{env}" in r:
            out.append((rollouts, tokens, r[f"val_reward/{env}"]))
    return out


FINAL = ["mix_final_seed0", "mix_final_seed1"]  # (a) final: 256 tokens, instruction share 2, 24 steps


def paired_final(val_dir: Path) -> dict:
    """Paired gains over the base on the same tasks (``posttrain validate`` files base / seed0 /
    seed1.jsonl): per seed, and for the seed mean (each task's reward averaged over the seeds)."""
    from posttrain.eval.compare import paired_gain, read_task_rewards

    files = {n: val_dir / f"{n}.jsonl" for n in ("base", "seed0", "seed1")}
    if not all(f.exists() for f in files.values()):
        return {}
    r = {n: read_task_rewards(f) for n, f in files.items()}
    out: dict = {}
    print("\npaired gain over the base (same tasks; ± = standard error of the per-task differences)\n")
    print("| | " + " | ".join(ENVS) + " |")
    print("|---|" + "---|" * len(ENVS))
    for label in ("seed0", "seed1", "seed mean"):
        row = {}
        for e in ENVS:
            after = (r[label][e] if label != "seed mean" else
                     {t: (r["seed0"][e][t] + r["seed1"][e][t]) / 2 for t in r["seed0"][e]})
            g = paired_gain(r["base"][e], after)
            row[e] = {"before": g.before, "after": g.after, "gain": g.gain, "se": g.se, "gained": g.gained,
                      "lost": g.lost, "n": g.n}
        out[label] = row
        print(f"| {label} | " + " | ".join(f"{row[e]['gain']:+.3f} ± {row[e]['se']:.3f} ({row[e]['gained']}↑ "
                                          f"{row[e]['lost']}↓)" for e in ENVS) + " |")
    return out


def final_a(runs: Path, out: Path, summary: dict) -> None:
    """(a)'s final runs: per-domain base vs each seed and the seed mean, with the standard error of
    the seed-mean gain (base and the two runs counted as independent binomial means: conservative,
    since all three are scored on the same tasks); writes rlvr_a.png."""
    data = {n: read(runs / n) for n in FINAL if read(runs / n)}
    if not data:
        return
    import yaml

    n_val = min(e["val_tasks"] for e in yaml.safe_load((runs / next(iter(data)) / "config.yaml").read_text())["envs"])
    base = next(iter(val_at(rows, 0) for rows in data.values()))
    finals = {n: val_at(rows) for n, rows in data.items()}
    steps = {n: rows[-1]["step"] for n, rows in data.items()}
    print(f"\n(a) final: held-out score over {n_val} validation tasks per domain, steps {steps}\n")
    print("| | " + " | ".join(ENVS) + " | mean |")
    print("|---|" + "---|" * (len(ENVS) + 1))
    table = [("base (step 0)", base)] + list(finals.items())
    mean_f = {e: sum(f[e] for f in finals.values()) / len(finals) for e in ENVS}
    table.append(("mean of seeds", mean_f))
    for label, f in table:
        print(f"| {label} | " + " | ".join(f"{f[e]:.3f} ± {se(f[e], n_val):.3f}" for e in ENVS)
              + f" | {sum(f[e] for e in ENVS) / len(ENVS):.3f} |")
    gain = {e: mean_f[e] - base[e] for e in ENVS}
    gain_se = {e: math.sqrt(se(base[e], n_val) ** 2 + sum(se(f[e], n_val) ** 2 for f in finals.values())
                            / len(finals) ** 2) for e in ENVS}
    print("| gain (mean − base) | " + " | ".join(f"{gain[e]:+.3f} ± {gain_se[e]:.3f}" for e in ENVS) + " | |")
    paired = paired_final(runs / "final_val")
    summary["final_a"] = {"paired": paired, "n_val": n_val, "base": base, "final": finals, "mean": mean_f, "gain": gain,
                          "gain_se": gain_se, "steps": steps,
                          "minutes": {n: round((rows[-1]["time"] - rows[0]["time"]) / 60, 1)
                                      for n, rows in data.items()}}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [("base", base)] + [(n.replace("mix_final_", ""), f) for n, f in finals.items()]
    w = 0.8 / len(labels)
    for i, (label, f) in enumerate(labels):
        vals = [f[e] for e in ENVS]
        axes[0].bar([j + i * w for j in range(len(ENVS))], vals, w, label=label,
                    yerr=[se(v, n_val) for v in vals], capsize=2)
    axes[0].set_xticks([j + 0.4 - w / 2 for j in range(len(ENVS))], ENVS)
    axes[0].set_ylabel(f"held-out score ({n_val} tasks)")
    axes[0].set_title("(a) three-domain RLVR vs base")
    axes[0].legend(fontsize=7)
    for n, rows in data.items():  # batch pass rate per domain over steps (3-step moving mean)
        for e in ENVS:
            pts = [(r["step"], r[f"pass_rate/{e}"]) for r in rows if f"pass_rate/{e}" in r]
            ys = [sum(p[1] for p in pts[max(0, i - 2):i + 1]) / len(pts[max(0, i - 2):i + 1]) for i in range(len(pts))]
            axes[1].plot([p[0] for p in pts], ys, label=f"{e} {n.replace('mix_final_', '')}",
                         ls="-" if n.endswith("0") else "--", color=f"C{ENVS.index(e)}")
    target = [(r["step"], r["curriculum_target"]) for r in next(iter(data.values())) if "curriculum_target" in r]
    if target:  # the curriculum moves to harder tasks, so the batch pass rate is meant to fall
        axes[1].plot(*zip(*target), color="black", lw=1, ls=":", label="curriculum target")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("batch pass rate (3-step mean)")
    axes[1].set_title("training batches")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "rlvr_a.png", dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="runs/evidence")
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--per-step", type=int, default=36, help="rollouts per step (P x G)")
    ap.add_argument("--no-save", action="store_true", help="append no row to bench/results/rl_evidence.jsonl")
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    names = ["mix_curriculum", "mix_random", "math_only", "instruction_only", "mopd_mix", "mopd_math",
             "mix_curriculum_seed1", "mix_random_seed1"]
    data = {n: read(runs / n) for n in names}
    base = next((val_at(rows, 0) for rows in data.values() if val_at(rows, 0)), {})
    final = {n: val_at(rows) for n, rows in data.items() if rows}
    summary = {"base": base, "final": final,
               "steps": {n: rows[-1]["step"] for n, rows in data.items() if rows},
               "minutes": {n: round((rows[-1]["time"] - rows[0]["time"]) / 60, 1) for n, rows in data.items()
                           if len(rows) > 1}}

    print("held-out score (greedy, 48 validation tasks per domain; ± = binomial standard error)\n")
    print("| run | " + " | ".join(ENVS) + " | mean |")
    print("|---|" + "---|" * (len(ENVS) + 1))
    for n, f in [("base (step 0)", base)] + [(n, final[n]) for n in names if n in final]:
        vals = [f.get(e) for e in ENVS]
        mean = sum(v for v in vals if v is not None) / max(sum(v is not None for v in vals), 1)
        print(f"| {n} | " + " | ".join(fmt(v) for v in vals) + f" | {mean:.3f} |")

    curves = {n: {e: curve(data[n], e, args.per_step) for e in ENVS} for n in names if data[n]}
    summary["curves"] = curves
    for n in names:
        if data[n]:
            rows = [r for r in data[n] if "groups_dropped" in r]
            if rows:
                summary.setdefault("groups_dropped_mean", {})[n] = sum(r["groups_dropped"] for r in rows) / len(rows)
                summary.setdefault("batch_pass_rate_mean", {})[n] = sum(r["pass_rate"] for r in rows) / len(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_evidence.json").write_text(json.dumps(summary, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, runs_: list[tuple[str, dict]], title: str) -> None:
        w = 0.8 / len(runs_)
        for i, (label, f) in enumerate(runs_):
            xs = [j + i * w for j in range(len(ENVS))]
            vals = [f.get(e, 0.0) for e in ENVS]
            ax.bar(xs, vals, w, label=label, yerr=[se(v) for v in vals], capsize=2)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(ENVS))], ENVS)
        ax.set_title(title)
        ax.set_ylabel("held-out score")
        ax.legend(fontsize=7)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    bars(axes[0], [("base", base)] + [(n, final[n]) for n in ("mix_curriculum", "mix_random") if n in final],
         "(a) multi-environment RLVR vs base (20 steps)")
    at10 = [(f"{n} (step 10)", val_at(data[n], 10)) for n in ("mix_curriculum", "mix_random") if val_at(data[n], 10)]
    bars(axes[1], [("base", base)] + at10 + [(n, final[n]) for n in ("math_only", "instruction_only") if n in final],
         "(b) single environment vs mix, at step 10")
    bars(axes[2], [("base", base)] + [(n, final[n]) for n in ("mix_curriculum", "mix_random",
                                                              "mix_curriculum_seed1", "mix_random_seed1")
                                      if n in final], "(c) curriculum vs random, 20 steps")
    fig.tight_layout()
    fig.savefig(out / "rlvr.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    bars(axes[0], [("base", base)] + [(label, final[n]) for n, label in (
        ("math_only", "teacher: math_only"), ("instruction_only", "teacher: instruction_only"),
        ("mopd_mix", "student: mopd_mix")) if n in final], "MOPD: base, teachers, student (10 steps)")
    for ax, xi, xlabel in ((axes[1], 0, "rollouts"), (axes[2], 1, "rollout tokens")):
        for n in ("math_only", "mopd_math"):
            if n in curves:
                pts = curves[n]["math"]
                ax.plot([p[xi] for p in pts], [p[2] for p in pts], marker="o",
                        label={"math_only": "GRPO (math_only)", "mopd_math": "MOPD (mopd_math)"}[n])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("math held-out score")
        ax.set_title("sample efficiency on math")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "mopd.png", dpi=100)
    plt.close(fig)
    final_a(runs, out, summary)
    (out / "rl_evidence.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwrote {out / 'rl_evidence.json'}, {out / 'rlvr.png'}, {out / 'mopd.png'}")
    if not args.no_save:
        from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

        append_row(Path(__file__).resolve().parent / "results" / "rl_evidence.jsonl", {
            "bench": "rl_evidence", "runs": str(runs), **{k: v for k, v in summary.items() if k != "curves"},
            **provenance("dev")})  # every score is an RL run's validation: its dev tasks
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

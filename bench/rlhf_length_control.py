"""Issue 13 evidence (b): RLHF with vs without group length control — the tables from the runs.

    bash bench/rlhf_length_control.sh 0 1             # the four runs (runs/lc/{on,off}_{seed})
    python bench/rlhf_length_control.py runs/lc        # this: markdown tables + a results row

Reads each run's ``metrics.jsonl`` (rollout lengths, judge fallbacks, base-reward spread) and its
validation records ``validation/step_N.jsonl`` (greedy replies to held-out tasks, verifier reward,
reasoning and answer tokens), and prints per seed and over seeds:

* rollout reasoning / answer tokens at the first and last step (means over 16 rollouts; no se:
  the per-step metric is a mean only) and over the last three steps;
* held-out reply reasoning / answer tokens at the start and the end, mean ± se over tasks;
* the share of held-out replies cut at the token limit (no answer to grade);
* held-out verifier reward per domain, start → end, gain ± *paired* se (``eval.compare``), and at
  the end on − off, paired over the same tasks;
* judge fallback rate, within-group base-reward std and flat-group share, wall time, load.

Appends one row to ``bench/results/rlhf_length_control.jsonl`` (``--no-row``: print only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from results_row import append_row, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

from posttrain.eval.compare import paired_gain, read_task_rewards


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def val_rows(run: Path, step: int) -> list[dict[str, Any]]:
    p = run / "validation" / f"step_{step:06d}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def length_stats(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return mean_se(vals) if vals else (math.nan, math.nan)


def paired_len(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """Mean of b − a over the same tasks, with its paired se (``eval.compare.paired_gain``)."""
    ka, kb = ({f"{r['env']}/{r['task_id']}": float(r[key]) for r in rows if r.get(key) is not None} for rows in (a, b))
    if not ka.keys() & kb.keys():
        return math.nan, math.nan
    g = paired_gain(ka, kb)
    return g.gain, g.se


def summarize(run: Path) -> dict[str, Any]:
    m = [r for r in metrics(run) if "think_len_mean" in r]
    steps = sorted(int(p.stem.split("_")[1]) for p in (run / "validation").glob("step_*.jsonl"))
    first, last = steps[0], steps[-1]
    v0, v1 = val_rows(run, first), val_rows(run, last)
    tail = m[-3:]
    out: dict[str, Any] = {
        "run": run.name, "steps": len(m), "val_steps": [first, last],
        "roll_think_first": m[0]["think_len_mean"], "roll_think_last": m[-1]["think_len_mean"],
        "roll_answer_first": m[0]["answer_len_mean"], "roll_answer_last": m[-1]["answer_len_mean"],
        "roll_think_last3": sum(r["think_len_mean"] for r in tail) / len(tail),
        "roll_answer_last3": sum(r["answer_len_mean"] for r in tail) / len(tail),
        "fallback_frac": sum(r["genrm_fallback_frac"] for r in m) / len(m),
        "base_group_std": sum(r.get("reward_base_group_std", math.nan) for r in m) / len(m),
        "base_flat_frac": sum(r.get("reward_base_flat_frac", math.nan) for r in m) / len(m),
        "step_s": sum(r["step_s"] for r in m) / len(m),
        "judge_s": sum(r["time_judge_s"] for r in m) / len(m),
    }
    for key in ("reasoning_tokens", "answer_tokens"):
        out[f"val_{key}_start"] = length_stats(v0, key)
        out[f"val_{key}_end"] = length_stats(v1, key)
        out[f"val_{key}_change"] = paired_len(v0, v1, key)
    for name, rows in (("start", v0), ("end", v1)):  # replies cut at max_new_tokens (no answer to grade)
        out[f"val_truncated_{name}"] = sum(r.get("finish_reason") == "length" for r in rows) / max(len(rows), 1)
    r0 = read_task_rewards(run / "validation" / f"step_{first:06d}.jsonl")
    r1 = read_task_rewards(run / "validation" / f"step_{last:06d}.jsonl")
    out["val"] = {}
    for env in r1:
        g = paired_gain(r0[env], r1[env])
        out["val"][env] = {"n": g.n, "start": g.before, "end": g.after, "gain": g.gain, "se": g.se,
                           "gained": g.gained, "lost": g.lost}
    done = run / "DONE"
    if done.is_file():
        out.update(json.loads(done.read_text()))
    return out


def fmt(ms: tuple[float, float], digits: int = 1) -> str:
    return f"{ms[0]:.{digits}f} ± {ms[1]:.{digits}f}"


def seed_table(on: dict[str, Any], off: dict[str, Any], on_dir: Path, off_dir: Path) -> str:
    rows = ["| | length control on | off |", "|---|---|---|"]
    for label, key in [("rollout reasoning tokens, step 1 → last", "think"),
                       ("rollout answer tokens, step 1 → last", "answer")]:
        rows.append(f"| {label} | {on[f'roll_{key}_first']:.1f} → {on[f'roll_{key}_last']:.1f} | "
                    f"{off[f'roll_{key}_first']:.1f} → {off[f'roll_{key}_last']:.1f} |")
        rows.append(f"| … mean of the last 3 steps | {on[f'roll_{key}_last3']:.1f} | {off[f'roll_{key}_last3']:.1f} |")
    for label, key in [("held-out reasoning tokens", "reasoning_tokens"), ("held-out answer tokens", "answer_tokens")]:
        rows.append(f"| {label}, start | {fmt(on[f'val_{key}_start'])} | {fmt(off[f'val_{key}_start'])} |")
        rows.append(f"| {label}, end | {fmt(on[f'val_{key}_end'])} | {fmt(off[f'val_{key}_end'])} |")
        rows.append(f"| … change (paired se) | {fmt(on[f'val_{key}_change'])} | {fmt(off[f'val_{key}_change'])} |")
    for env in on["val"]:
        a, b = on["val"][env], off["val"][env]
        rows.append(f"| held-out {env} reward (n={a['n']}), start → end | {a['start']:.3f} → {a['end']:.3f} "
                    f"({a['gain']:+.3f} ± {a['se']:.3f}) | {b['start']:.3f} → {b['end']:.3f} ({b['gain']:+.3f} ± {b['se']:.3f}) |")
    rows.append(f"| held-out replies cut at the token limit, start → end | {on['val_truncated_start']:.0%} → "
                f"{on['val_truncated_end']:.0%} | {off['val_truncated_start']:.0%} → {off['val_truncated_end']:.0%} |")
    rows.append(f"| judge fallback rate | {on['fallback_frac']:.1%} | {off['fallback_frac']:.1%} |")
    rows.append(f"| within-group base-reward std / flat groups | {on['base_group_std']:.2f} / {on['base_flat_frac']:.0%} | "
                f"{off['base_group_std']:.2f} / {off['base_flat_frac']:.0%} |")
    rows.append(f"| s per step (judge s) | {on['step_s']:.0f} ({on['judge_s']:.0f}) | {off['step_s']:.0f} ({off['judge_s']:.0f}) |")
    rows.append(f"| wall s, load at the end | {on.get('wall_s', '—')}, {on.get('load_end', '—')} | "
                f"{off.get('wall_s', '—')}, {off.get('load_end', '—')} |")
    # on − off at the end, paired over the same held-out tasks
    end_on = read_task_rewards(on_dir / "validation" / f"step_{on['val_steps'][1]:06d}.jsonl")
    end_off = read_task_rewards(off_dir / "validation" / f"step_{off['val_steps'][1]:06d}.jsonl")
    for env in end_on:
        g = paired_gain(end_off[env], end_on[env])
        rows.append(f"| **on − off at the end, {env} reward** | {g.gain:+.3f} ± {g.se:.3f} (paired, {g.gained} / {g.lost} tasks) | |")
    v_on = val_rows(on_dir, on["val_steps"][1])
    v_off = val_rows(off_dir, off["val_steps"][1])
    for key in ("reasoning_tokens", "answer_tokens"):
        rows.append(f"| **on − off at the end, held-out {key.replace('_', ' ')}** | {fmt(paired_len(v_off, v_on, key))} (paired) | |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="directory with the runs on_<seed>, off_<seed>")
    ap.add_argument("--plot", type=Path, default=None, help="write rollout lengths per step (PNG) here")
    ap.add_argument("--no-row", action="store_true", help="do not append to bench/results/rlhf_length_control.jsonl")
    args = ap.parse_args()
    seeds = sorted(int(p.name.split("_")[1]) for p in args.root.glob("on_*") if p.is_dir()
                   and (args.root / f"off_{p.name.split('_')[1]}").is_dir())
    if not seeds:
        raise SystemExit(f"{args.root}: no pair of runs on_<seed>, off_<seed>")
    record: dict[str, Any] = {"bench": "rlhf_length_control", "seeds": {}}
    for s in seeds:
        on_dir, off_dir = args.root / f"on_{s}", args.root / f"off_{s}"
        on, off = summarize(on_dir), summarize(off_dir)
        print(f"\n### seed {s}\n\n{seed_table(on, off, on_dir, off_dir)}")
        record["seeds"][str(s)] = {"on": on, "off": off}
    # over seeds: the mean of the per-seed figures and half their spread (n = 2 seeds)
    print("\n### mean over seeds (± half the difference between the seeds when there are two)\n")
    print("| | on | off |\n|---|---|---|")

    def over(arm: str, get: Any) -> str:
        vals = [get(record["seeds"][str(s)][arm]) for s in seeds]
        mean = sum(vals) / len(vals)
        spread = (max(vals) - min(vals)) / 2 if len(vals) > 1 else math.nan
        return f"{mean:.3f} ± {spread:.3f}" if abs(mean) < 5 else f"{mean:.1f} ± {spread:.1f}"

    lines = [("rollout reasoning tokens, last 3 steps", lambda r: r["roll_think_last3"]),
             ("rollout answer tokens, last 3 steps", lambda r: r["roll_answer_last3"]),
             ("held-out reasoning tokens, end", lambda r: r["val_reasoning_tokens_end"][0]),
             ("held-out answer tokens, end", lambda r: r["val_answer_tokens_end"][0]),
             ("held-out reasoning tokens, change", lambda r: r["val_reasoning_tokens_change"][0]),
             ("held-out answer tokens, change", lambda r: r["val_answer_tokens_change"][0])]
    envs = list(record["seeds"][str(seeds[0])]["on"]["val"])
    for env in envs:
        lines.append((f"held-out {env} reward, end", lambda r, e=env: r["val"][e]["end"]))
        lines.append((f"held-out {env} reward, gain", lambda r, e=env: r["val"][e]["gain"]))
    lines.append(("held-out replies cut at the token limit, end", lambda r: r["val_truncated_end"]))
    lines.append(("judge fallback rate", lambda r: r["fallback_frac"]))
    for label, get in lines:
        print(f"| {label} | {over('on', get)} | {over('off', get)} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        for s in seeds:
            for arm, style in (("on", "-"), ("off", "--")):
                m = [r for r in metrics(args.root / f"{arm}_{s}") if "think_len_mean" in r]
                for ax, key in zip(axes, ("think_len_mean", "answer_len_mean")):
                    ax.plot([r["step"] for r in m], [r[key] for r in m], style, label=f"{arm}, seed {s}")
        for ax, title in zip(axes, ("rollout reasoning tokens", "rollout answer tokens")):
            ax.set_title(title)
            ax.set_xlabel("step")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)
        print(f"\nwrote {args.plot}")
    on_end = [record["seeds"][str(s)]["on"]["val_reasoning_tokens_end"][0] for s in seeds]
    off_end = [record["seeds"][str(s)]["off"]["val_reasoning_tokens_end"][0] for s in seeds]
    change = 100 * (sum(on_end) / sum(off_end) - 1)
    print(f"\nRESULT rlhf_length_control: {change:+.0f} % (held-out reasoning tokens at the end, length control on "
          f"vs off, {len(seeds)} seed(s))")
    if not args.no_row:
        append_row(Path(__file__).resolve().parent / "results" / "rlhf_length_control.jsonl",
                   record | provenance("dev"))  # the runs' validation records: their dev tasks
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

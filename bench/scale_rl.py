"""The same small GRPO run in process, on Ray (synchronous) and on Ray asynchronous; docs/scale.md.

    PYTHONPATH=$PWD python bench/scale_rl.py                       # tiny Llama, stand-in env, 3 seeds
    PYTHONPATH=$PWD python bench/scale_rl.py --model embedded --env math --seeds 0 --steps 4 \
        --max-new-tokens 48 --prompts 4

Per seed, interleaved (in process, Ray sync, then each async setting), so load drift on the shared
machine hits every variant alike. Checks and figures:

* in process vs Ray sync: every metric of every step equal (wall times aside) and the final
  weights bit-identical — printed as ``identical`` or the first difference;
* steps per minute over the training steps alone (sum of ``step_s``: sampling or waiting for the
  batch, scoring, the update; Ray actor start-up, validation and checkpoints are reported apart);
* the staleness of every trained batch (histogram), stale batches dropped, the masked-IS fraction
  and mean IS ratio over trained tokens;
* held-out reward (greedy validation after the last step) beside the sampled tokens it cost
  (dropped stale batches included).

Runs use one torch thread per role (trainer 1 CPU, one rollout worker 0.5 CPU, one verifier
0.25 CPU), ``ray.init(num_cpus=2)``. Ends with one ``RESULT`` line per figure and appends one JSON
row per variant to ``bench/results/scale_rl.jsonl``; the plot goes to ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from results_row import append_row, machine, provenance  # noqa: E402  bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = ROOT / "bench" / "results" / "scale_rl.jsonl"


def variants(asyncs: list[str]) -> list[tuple[str, list[str]]]:
    out = [("inprocess", []), ("ray_sync", ["scale.backend=ray"])]
    for spec in asyncs:  # "AHEAD:K"
        ahead, k = spec.split(":")
        out.append((f"ray_async_a{ahead}_k{k}", ["scale.backend=ray", f"scale.ahead={ahead}",
                                                  f"scale.max_staleness={k}"]))
    return out


def run_one(args, name: str, seed: int, over: list[str], root: Path) -> dict:
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.scale.controller import run_rl

    run_dir = root / f"{name}_s{seed}"
    if run_dir.exists():  # a run directory left from before would be resumed, not re-run
        raise SystemExit(f"{run_dir} exists: pass a new --out")
    env = (f"{{name: test_vowel_share_ray, train_tasks: 64, val_tasks: {args.val_tasks}}}" if args.env == "vowels"
           else f"{{name: {args.env}, train_tasks: 64, val_tasks: {args.val_tasks}}}")
    cfg = load_config(RLConfig, None, [
        f"model={args.model}", f"run_dir={run_dir}", f"train.steps={args.steps}", f"train.eval_every={args.steps}",
        "train.save_every=0", f"train.seed={seed}", "train.plot=false", "train.threads=1",
        f"rollout.prompts_per_step={args.prompts}", "rollout.group_size=4", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.batch_size={args.prompts * 4}", "algo.overlong_filter=false", f"optim.lr={args.lr}", f"envs=[{env}]",
        "scale.worker_imports=[tests.integration.scale_env]", *args.extra, *over])
    t0 = time.perf_counter()
    run_rl(cfg, progress=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    steps = [r for r in rows if "loss" in r or "update_skipped" in r]
    loop_s = sum(r["step_s"] for r in steps)  # the steps alone: no actor start-up, validation, checkpoints
    trained = [r for r in steps if "is_masked_frac" in r]
    w = [r["tokens_in_batch"] for r in trained]
    return {
        "variant": name, "seed": seed, "run_dir": str(run_dir), "wall_s": round(wall, 2),
        "loop_s": round(loop_s, 2), "steps_per_min": round(60 * len(steps) / loop_s, 3),
        "step_s_mean": round(statistics.mean(r["step_s"] for r in steps), 3),
        "staleness": [r.get("policy_staleness", 0.0) for r in steps],
        "stale_batches_dropped": sum(r.get("stale_batches_dropped", 0.0) for r in steps),
        "tokens_sampled": sum(r["tokens_sampled"] for r in steps),
        "is_masked_frac": sum(r["is_masked_frac"] * x for r, x in zip(trained, w)) / max(sum(w), 1),
        "is_ratio_mean": sum(r["is_ratio_mean"] * x for r, x in zip(trained, w)) / max(sum(w), 1),
        "train_reward_mean": statistics.mean(r["reward"] for r in steps),
        "val_reward_start": rows[0].get("val_reward"), "val_reward_end": rows[-1].get("val_reward"),
        "metrics": rows,
    }


def same_run(a: dict, b: dict) -> str:
    """'identical', or the first metric (or weight) that differs."""
    from safetensors.torch import load_file

    drop = ("time", "step_s", "policy_staleness", "stale_batches_dropped", "stale_tokens_dropped")
    for i, (x, y) in enumerate(zip(a["metrics"], b["metrics"])):
        for k in sorted(set(x) | set(y)):
            if not k.startswith(drop) and x.get(k) != y.get(k):
                return f"line {i}: {k} {x.get(k)!r} != {y.get(k)!r}"
    ck = sorted((Path(a["run_dir"]) / "checkpoints").glob("step_*"))[-1].name
    wa = load_file(str(Path(a["run_dir"]) / "checkpoints" / ck / "model.safetensors"))
    wb = load_file(str(Path(b["run_dir"]) / "checkpoints" / ck / "model.safetensors"))
    bad = [k for k in wa if not (wa[k] == wb[k]).all()]
    return f"weights differ: {bad[:3]}" if bad else "identical"


def mean_se(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.3f} (n=1)"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) / len(xs) ** 0.5:.3f} (n={len(xs)})"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["variant"] for r in results if r["variant"] != "inprocess"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(names)
    max_k = max([int(s) for r in results for s in r["staleness"]] + [0])
    for i, n in enumerate(names):
        st = [int(s) for r in results if r["variant"] == n for s in r["staleness"]]
        drop = sum(r["stale_batches_dropped"] for r in results if r["variant"] == n)
        ks = list(range(max_k + 2))
        counts = [st.count(k) for k in ks[:-1]] + [drop]
        ax1.bar([k + i * width for k in ks], counts, width, label=n)
    ax1.set_xticks([k + width * (len(names) - 1) / 2 for k in range(max_k + 2)],
                   [str(k) for k in range(max_k + 1)] + ["dropped"])
    ax1.set_xlabel("staleness of trained batches (policy versions), and stale batches dropped")
    ax1.set_ylabel("batches (all seeds)")
    ax1.legend(fontsize=8)
    ax1.set_title("staleness histogram")
    for n in names + ["inprocess"]:
        runs = [r for r in results if r["variant"] == n]
        for j, r in enumerate(runs):
            steps = [m for m in r["metrics"] if "tokens_sampled" in m]
            cum, xs = 0.0, []
            for m in steps:
                cum += m["tokens_sampled"]
                xs.append(cum)
            ax2.plot(xs, [m["reward"] for m in steps], alpha=0.6, label=n if j == 0 else None,
                     color=f"C{(names + ['inprocess']).index(n)}")
    ax2.set_xlabel("tokens sampled (dropped batches included)")
    ax2.set_ylabel("batch reward")
    ax2.legend(fontsize=8)
    ax2.set_title("training reward by sampled tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--env", default="vowels", help="vowels (stand-in, tests/integration/scale_env.py) or an env name")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--async", dest="asyncs", nargs="+", default=["1:1", "2:1"], help="AHEAD:MAX_STALENESS")
    p.add_argument("--val-tasks", type=int, default=32)
    p.add_argument("--extra", nargs="*", default=[], help="more config overrides, e.g. rollout.reasoning=false")
    p.add_argument("--out", default=f"/tmp/scale_rl_{int(time.time())}")
    p.add_argument("--plot", default=str(ROOT / "docs" / "results" / "scale_async.png"))
    args = p.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in [os.environ.get("PYTHONPATH")] if x])
    import tests.integration.scale_env  # noqa: F401  (the stand-in environment, in this process too)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    load0 = os.getloadavg()
    results = []
    for seed in args.seeds:
        for name, over in variants(args.asyncs):
            r = run_one(args, name, seed, over, Path(args.out))
            results.append(r)
            print(f"[{name} seed {seed}] {r['wall_s']:.1f}s, {r['steps_per_min']:.2f} steps/min, staleness "
                  f"{r['staleness']}, dropped {r['stale_batches_dropped']:.0f}, IS masked {r['is_masked_frac']:.4f}, "
                  f"val reward {r['val_reward_end']}, load {os.getloadavg()[0]:.2f}", flush=True)
    ray.shutdown()
    load1 = os.getloadavg()
    plot(results, Path(args.plot))

    what = (f"{args.model}, env {args.env}, {args.steps} steps x {args.prompts}x4 rollouts, lr {args.lr:g}, "
            f"{len(args.seeds)} seeds")
    for seed in args.seeds:
        a = next(r for r in results if r["variant"] == "inprocess" and r["seed"] == seed)
        b = next(r for r in results if r["variant"] == "ray_sync" and r["seed"] == seed)
        print(f"in process vs Ray sync, seed {seed}: {same_run(a, b)}")
    n_same = sum(same_run(next(r for r in results if r["variant"] == "inprocess" and r["seed"] == s),
                          next(r for r in results if r["variant"] == "ray_sync" and r["seed"] == s)) == "identical"
                 for s in args.seeds)
    print(f"RESULT scale_sync_identical: {n_same}/{len(args.seeds)} seeds (in process vs Ray sync: every metric "
          f"and the final weights equal; {what})")
    for name, _ in variants(args.asyncs):
        rs = [r for r in results if r["variant"] == name]
        print(f"RESULT scale_{name}_steps_per_min: {mean_se([r['steps_per_min'] for r in rs])} steps/min ({what}; "
              f"load {load0[0]:.1f}->{load1[0]:.1f})")
        print(f"RESULT scale_{name}_val_reward: {mean_se([r['val_reward_end'] for r in rs])} reward (greedy "
              f"held-out after the last step; tokens sampled {mean_se([r['tokens_sampled'] for r in rs])}; {what})")
        if name.startswith("ray_async"):
            print(f"RESULT scale_{name}_is_masked_frac: {mean_se([r['is_masked_frac'] for r in rs])} fraction "
                  f"(tokens dropped by masked IS; mean IS ratio {mean_se([r['is_ratio_mean'] for r in rs])}; "
                  f"stale batches dropped {sum(r['stale_batches_dropped'] for r in rs):.0f}; {what})")
    for r in results:
        append_row(RESULTS, {k: v for k, v in r.items() if k not in ("metrics", "run_dir")} | {
            "bench": "scale_rl", "model": args.model, "env": args.env, "steps": args.steps, "prompts": args.prompts,
            "max_new_tokens": args.max_new_tokens, "lr": args.lr, "extra": args.extra, "load_avg_1m_start": round(load0[0], 2),
            "load_avg_1m_end": round(load1[0], 2),
            # steps/min, and the greedy validation reward on the RL run's dev tasks
            **provenance("dev", machine(load0[0], load1[0], threads=1))})


if __name__ == "__main__":
    main()

"""Two versions of posttrain side by side: the posttrain halves of ``grpo_vs_trl.py`` and
``sft_throughput.py``, run from a git revision and from this working tree, alternating, in one run.

Why: a refactor must not change speed. The machine is shared and noisy, so the two versions run
interleaved (old, new, old, new, ...) in fresh subprocesses, each with one torch thread, and the
figures are means with their standard errors over the repeats.

Each repeat, per version:

Wall time and CPU time (``time.process_time``) are both recorded: with one thread the CPU time of
a run is far less disturbed by other work on the machine than its wall time.

* **GRPO**: ``grpo_vs_trl.run_posttrain`` (the embedded model, 8 prompts × 4 rollouts, 48 new
  tokens, fp32; one warm-up step, then ``--grpo-steps`` timed steps): mean s/step.
* **SFT**: ``sft_throughput.posttrain_step`` on the embedded model (16 conversations a step, rows
  of 512; one warm-up step, then ``--sft-steps`` timed steps): tokens/s.

Both functions are called from the version's own ``bench/`` folder, so each side runs its own code.

Run: ``python bench/ab_versions.py --old d8809f1 [--repeats 2]``. Prints a table and one RESULT
line per bench; appends a JSON row to ``bench/results/ab_versions.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ab_versions.jsonl"

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
tree, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/bench"]
import torch
torch.set_num_threads(1)
import posttrain
assert posttrain.__file__.startswith(tree), posttrain.__file__
if kind == "grpo":
    import grpo_vs_trl
    with tempfile.TemporaryDirectory() as d:
        c0 = time.process_time()
        r = grpo_vs_trl.run_posttrain("embedded", steps, Path(d) / "run")
        cpu = time.process_time() - c0  # the whole run: load, warm-up step, timed steps
    print(json.dumps({"s_per_step": r["s_per_step"], "rollouts_trained": r["rollouts_trained"], "cpu_s": cpu}))
else:
    import sft_throughput as s
    from posttrain.models.loading import load_model
    torch.manual_seed(0)
    loaded = load_model("embedded")
    model, tok = loaded.model, loaded.tokenizer
    model.train(); model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    batches = [s.make_examples(tok, 16, seed=i) for i in range(steps + 1)]
    pad = tok.pad_token_id or 0
    s.posttrain_step(model, opt, batches[0], pad, 512, "fp32")
    t, c, n = time.perf_counter(), time.process_time(), 0
    for ex in batches[1:]:
        n += s.posttrain_step(model, opt, ex, pad, 512, "fp32")
    print(json.dumps({"tokens_per_s": n / (time.perf_counter() - t), "tokens_per_cpu_s": n / (time.process_time() - c)}))
"""


def run(tree: Path, kind: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), kind, str(steps)], env=env, check=True,
                         capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="git revision to compare against (e.g. the commit before a refactor)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--grpo-steps", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=3)
    args = ap.parse_args()

    old_tree = Path(tempfile.mkdtemp(prefix="posttrain-ab-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), args.old], check=True,
                   capture_output=True)
    load = [os.getloadavg()[0]]
    keys = ("grpo", "grpo_cpu", "sft", "sft_cpu")
    figures: dict[str, dict[str, list[float]]] = {v: {k: [] for k in keys} for v in ("old", "new")}
    try:
        for rep in range(args.repeats):
            for name, tree in (("old", old_tree), ("new", ROOT)):
                g = run(tree, "grpo", args.grpo_steps)
                s = run(tree, "sft", args.sft_steps)
                for k, v in (("grpo", g["s_per_step"]), ("grpo_cpu", g["cpu_s"]), ("sft", s["tokens_per_s"]),
                             ("sft_cpu", s["tokens_per_cpu_s"])):
                    figures[name][k].append(v)
                print(f"repeat {rep} {name}: grpo {g['s_per_step']:.1f} s/step ({g['rollouts_trained']:.1f} trained; "
                      f"{g['cpu_s']:.0f} CPU-s in all), sft {s['tokens_per_s']:.1f} tokens/s "
                      f"({s['tokens_per_cpu_s']:.1f} per CPU-s)", flush=True)
                load.append(os.getloadavg()[0])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], capture_output=True)
    summary = {v: {k: mean_se(xs) for k, xs in f.items()} for v, f in figures.items()}
    print(f"\n{'':6s}" + "".join(f"{h:>20s}" for h in ("GRPO s/step", "GRPO CPU-s/run", "SFT tokens/s",
                                                          "SFT tokens/CPU-s"))
          + f"   (mean ± se over {args.repeats} repeats, 1 thread)")
    for v in ("old", "new"):
        print(f"{v:6s}" + "".join(f"{summary[v][k][0]:12.1f} ± {summary[v][k][1]:5.1f}" for k in keys))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    append_row(RESULTS, {"bench": "ab_versions", "old": args.old, "new": rev + "+worktree", "figures": figures,
                         "load": load, "args": vars(args),
                         **provenance("none", machine(load[0], load[-1], threads=1))})  # speed only: nothing graded
    ratio = {k: summary["new"][k][0] / summary["old"][k][0] for k in keys}
    print(f"RESULT ab_grpo: {ratio['grpo']:.3f} new/old s-per-step (posttrain GRPO step, wall; CPU-time ratio "
          f"{ratio['grpo_cpu']:.3f}; {args.old} vs this tree)")
    print(f"RESULT ab_sft: {ratio['sft']:.3f} new/old tokens-per-s (posttrain SFT step, wall; per-CPU-s ratio "
          f"{ratio['sft_cpu']:.3f}; {args.old} vs this tree)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Choose ``pipeline --quick``'s SFT length on dev: can fewer steps keep its gain, for the 4-minute target?

    python bench/quick_sft_dev.py --seeds 0 1 2

``--quick`` measured 282 s on 2 idle cores after its greedy measurements moved to bf16 (target 240 s);
its SFT stage is the largest part (~100 s for 24 steps). This bench trains ``--quick``'s SFT stage
(same data, rows, frozen blocks, schedule shape) at each candidate (steps, peak lr) and scores the
SFT checkpoint and the base model greedily on 96 problems of the **dev** split, in the precision
``--quick`` measures in. Nothing here reads test.

The rule, fixed before any figure: keep 24 steps at 2e-4 unless a shorter candidate's mean dev gain
over the seeds is within 2 points of it; then take the shortest such one (ties: the lower lr).
Appends one row to bench/results/quick_sft_dev.jsonl and ends with ``RESULT quick_sft_dev``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, provenance  # noqa: E402

from posttrain.configs.pipeline import QUICK, PipelineConfig  # noqa: E402
from posttrain.eval.compare import mean_and_se  # noqa: E402
from posttrain.experiments.stages import eval_dtype, make_data, run_sft  # noqa: E402

CANDIDATES = [(24, 2e-4), (18, 2e-4), (16, 3e-4)]
RESULTS = ROOT / "bench" / "results" / "quick_sft_dev.jsonl"


def dev_correct(cfg: PipelineConfig, model: str, n: int | None = None, dtype: str | None = None) -> list[float]:
    """Greedy rewards on the first ``n`` (default ``n_eval``) dev problems (the headline measure's tasks,
    dev split), decoded in ``dtype`` (default: the test table's, ``eval_dtype``)."""
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.envs.base import make_env

    tasks = arithmetic_tasks(n or cfg.n_eval, cfg.seed + 2, "dev", max_digits=cfg.max_digits)
    gen = HFGenerator.from_spec(model, batch_size=cfg.eval_batch_size, dtype=dtype or eval_dtype(cfg), greedy_in_dtype=True)
    comps = gen.generate([t.messages for t in tasks], SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0))
    env = make_env("math")
    return [env.verify(t, [{"role": "assistant", "content": c[0].text}]).reward for t, c in zip(tasks, comps)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--work", default=str(ROOT / "runs" / "quick_sft_dev"))
    args = p.parse_args()
    gains: dict[str, list[tuple[float, float]]] = {}
    seconds: dict[str, list[float]] = {}
    for seed in args.seeds:
        cfg = PipelineConfig(**{**QUICK, "seed": seed})
        work = Path(args.work) / f"s{seed}"
        data = make_data(cfg, work)
        base = dev_correct(cfg, cfg.model)
        for steps, lr in CANDIDATES:
            name = f"{steps}x{lr:g}"
            t = time.time()
            out = run_sft(cfg, work, data, steps=steps, lr=lr, name=f"sft-{name}")
            seconds.setdefault(name, []).append(round(time.time() - t, 1))
            g = mean_and_se([y - x for x, y in zip(base, dev_correct(cfg, out["checkpoint"]))])  # paired per problem
            gains.setdefault(name, []).append(g)
            print(f"[bench] seed {seed} {name}: dev gain {g[0] * 100:+.1f} ± {g[1] * 100:.1f} points, "
                  f"SFT {seconds[name][-1]:.0f} s", flush=True)
            shutil.rmtree(work / f"sft-{name}" / "checkpoints", ignore_errors=True)
    mean = {k: sum(g for g, _ in v) / len(v) for k, v in gains.items()}
    se = {k: math.sqrt(sum(s * s for _, s in v)) / len(v) for k, v in gains.items()}
    ref = f"{CANDIDATES[0][0]}x{CANDIDATES[0][1]:g}"
    ok = [(s, lr) for s, lr in CANDIDATES[1:] if mean[f"{s}x{lr:g}"] >= mean[ref] - 0.02]
    pick = min(ok, key=lambda c: (c[0], c[1])) if ok else CANDIDATES[0]
    chosen = f"{pick[0]}x{pick[1]:g}"
    row = {"bench": "quick_sft_dev", **provenance("dev"), "seeds": args.seeds,
           "gains": {k: [[round(g, 4), round(s, 4)] for g, s in v] for k, v in gains.items()},
           "mean": {k: round(v, 4) for k, v in mean.items()}, "se": {k: round(v, 4) for k, v in se.items()},
           "sft_seconds": seconds, "chosen": chosen, "rule": "shortest within 2 points of 24x0.0002 (dev mean)"}
    append_row(RESULTS, row)
    table = ", ".join(f"{k} {mean[k] * 100:+.1f} ± {se[k] * 100:.1f} ({sum(seconds[k]) / len(seconds[k]):.0f} s)"
                      for k in mean)
    print(f"RESULT quick_sft_dev: {chosen} (steps x peak lr of --quick's SFT chosen on dev, {len(args.seeds)} seeds, "
          f"96 dev problems each; mean dev gain ± se and SFT wall: {table})")


if __name__ == "__main__":
    main()

"""Size ``pipeline --quick``'s headline held-out set on dev: how many problems make its SFT gain clear?

    python bench/quick_heldout_size_dev.py --seeds 0 1 2

Issue 33 asks ``--quick`` for an SFT gain beyond 2 paired standard errors on each of three seeds. On
96 test problems seed 0 read +8.3 ± 4.8 (1.7 se; bench/results/pipeline.jsonl#L73), while the same stage
gained 14.6-25.0 points on 96 *dev* problems (bench/results/quick_sft_dev.jsonl#L1): the gain is there,
the measurement is too small to show it on every seed. A larger set shrinks the paired se as 1/sqrt(n)
and costs decode time in the two fp32 headline measurements. This bench sizes it on dev, so that no
test figure chooses it.

Per seed: ``--quick``'s SFT stage exactly as the pipeline runs it, then the base model and the SFT
checkpoint decode the first 192 problems of the **dev** split greedily in fp32 (the headline's
precision, ``experiments.stages.measure``); the paired gain and its se are read on the first 96, 144
and 192 of them, and the wall time of the two measurements at 192 is recorded.

The rule, fixed before any figure: the smallest n of 96, 144, 192 at which every seed's dev gain is
at least 3 paired se (one se of margin for a dev-to-test drop such as seed 0's); if none, 192.
Appends one row to bench/results/quick_heldout_size_dev.jsonl; ends with ``RESULT quick_heldout_size_dev``.
"""

from __future__ import annotations

import argparse
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
from posttrain.experiments.stages import make_data, run_sft  # noqa: E402
from quick_sft_dev import dev_correct  # noqa: E402

SIZES = (96, 144, 192)
RESULTS = ROOT / "bench" / "results" / "quick_heldout_size_dev.jsonl"


def pick(gains: dict[int, list[tuple[float, float]]]) -> int:
    """The rule: the smallest size at which every seed's gain is >= 3 se (a zero se counts as clear when the gain is > 0)."""
    for n in SIZES:
        if all(g > 0 and (s == 0 or g / s >= 3) for g, s in gains[n]):
            return n
    return SIZES[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--work", default=str(ROOT / "runs" / "quick_heldout_size_dev"))
    args = p.parse_args()
    gains: dict[int, list[tuple[float, float]]] = {n: [] for n in SIZES}
    measure_s: list[float] = []
    for seed in args.seeds:
        cfg = PipelineConfig(**{**QUICK, "seed": seed})
        work = Path(args.work) / f"s{seed}"
        data = make_data(cfg, work)
        sft = run_sft(cfg, work, data)
        t = time.time()
        # fp32, as the headline measurement decodes (experiments.stages.measure)
        base, after = (dev_correct(cfg, m, SIZES[-1], "fp32") for m in (cfg.model, sft["checkpoint"]))
        measure_s.append(round(time.time() - t, 1))
        for n in SIZES:
            gains[n].append(mean_and_se([y - x for x, y in zip(base[:n], after[:n])]))  # paired per problem
        print(f"[bench] seed {seed}: " + ", ".join(f"n={n} {gains[n][-1][0] * 100:+.1f} ± {gains[n][-1][1] * 100:.1f}"
                                                   for n in SIZES) + f"; both measurements at 192: {measure_s[-1]:.0f} s",
              flush=True)
        shutil.rmtree(work / "sft" / "checkpoints", ignore_errors=True)
    chosen = pick(gains)
    row = {"bench": "quick_heldout_size_dev", **provenance("dev"), "seeds": args.seeds,
           "gains": {str(n): [[round(g, 4), round(s, 4)] for g, s in v] for n, v in gains.items()},
           "measure_s_at_192": measure_s, "chosen": chosen,
           "rule": "smallest n of 96/144/192 with every seed's dev gain >= 3 paired se; else 192"}
    append_row(RESULTS, row)
    table = "; ".join(f"n={n}: " + ", ".join(f"{g * 100:+.1f} ± {s * 100:.1f}" for g, s in v) for n, v in gains.items())
    print(f"RESULT quick_heldout_size_dev: {chosen} problems (--quick's headline set sized on dev, "
          f"{len(args.seeds)} seeds, SFT gain ± paired se per seed: {table})")


if __name__ == "__main__":
    main()

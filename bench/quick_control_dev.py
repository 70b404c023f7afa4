"""Choose ``pipeline --quick``'s same-time control learning rate on dev.

    python bench/quick_control_dev.py --seeds 0 1 2

With ``--quick``'s SFT at 16 x 3e-4 (bench/quick_sft_dev.py) the same-time control, whose peak lr
follows ``sft_lr`` unless ``control_lr`` is set, continued SFT for 6 steps at 3e-4 and on one test
seed fell from its start's 0.312 to 0.042: a control that breaks its start is no control. That lr
was never chosen. This bench trains ``--quick``'s data and SFT stage per seed, then the same-time
control as the pipeline runs it (6 steps, the budget ``--quick``'s RL stage bought in rows 67-69 of
bench/results/pipeline.jsonl, seed + 1 data order, a new warmup-stable-decay cycle) at each
candidate peak lr, and scores the SFT checkpoint and every control greedily on 48 **dev** tasks of
the RLVR stage's environment (the test table's measure, on dev). Nothing here reads test.

The rule, as for every control (configs/pipeline.py: ``control_lr``), fixed before any figure: the
lr under which the control scores best on dev, mean over the seeds (ties: the smaller lr).
Appends one row to bench/results/quick_control_dev.jsonl and ends with ``RESULT quick_control_dev``.
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
from posttrain.experiments import evidence  # noqa: E402
from posttrain.experiments.pipeline import rl_overrides, rlvr_envs  # noqa: E402
from posttrain.experiments.stages import eval_dtype, make_data, run_sft  # noqa: E402

CANDIDATES = [3e-4, 2e-4, 2e-5]
ARM_STEPS = 6
RESULTS = ROOT / "bench" / "results" / "quick_control_dev.jsonl"


def rl_config_dir(cfg: PipelineConfig, work: Path) -> Path:
    """A directory holding the RLVR stage's config.yaml (its environments, prompt and token budget),
    which ``evidence.score_records`` reads; no RL run is needed to score on its tasks."""
    import yaml

    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig

    out = work / "rl_config"
    rl_cfg = load_config(RLConfig, None, rl_overrides(cfg, out, cfg.model, cfg.rl_steps, rlvr_envs(cfg), rlvr_stage=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(rl_cfg.model_dump(mode="json")))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--work", default=str(ROOT / "runs" / "quick_control_dev"))
    args = p.parse_args()
    scores: dict[str, list[float]] = {}
    for seed in args.seeds:
        cfg = PipelineConfig(**{**QUICK, "seed": seed})
        work = Path(args.work) / f"s{seed}"
        data = make_data(cfg, work)
        rl_dir = rl_config_dir(cfg, work)
        sft = run_sft(cfg, work, data)

        def score(model: str, name: str) -> float:
            out = evidence.score_records(rl_dir, model, work / "dev" / f"{name}.jsonl", cfg.rl_test_tasks,
                                         cfg.eval_batch_size, "dev", eval_dtype(cfg))
            return out["mean"]["arithmetic"]

        scores.setdefault("sft", []).append(score(sft["checkpoint"], "sft"))
        for lr in CANDIDATES:
            t = time.time()
            arm = run_sft(cfg, work, data, model=sft["checkpoint"], steps=ARM_STEPS, name=f"arm-{lr:g}",
                          seed=cfg.seed + 1, lr=lr)
            scores.setdefault(f"{lr:g}", []).append(score(arm["checkpoint"], f"arm-{lr:g}"))
            print(f"[bench] seed {seed} control at {lr:g}: dev {scores[f'{lr:g}'][-1]:.3f} "
                  f"(its start {scores['sft'][-1]:.3f}; {time.time() - t:.0f} s)", flush=True)
            shutil.rmtree(work / f"arm-{lr:g}" / "checkpoints", ignore_errors=True)
        shutil.rmtree(work / "sft" / "checkpoints", ignore_errors=True)
    mean = {k: sum(v) / len(v) for k, v in scores.items()}
    best = max(CANDIDATES, key=lambda lr: (mean[f"{lr:g}"], -lr))
    row = {"bench": "quick_control_dev", **provenance("dev"), "seeds": args.seeds, "arm_steps": ARM_STEPS,
           "dev_tasks": QUICK["rl_test_tasks"], "scores": scores, "mean": {k: round(v, 4) for k, v in mean.items()},
           "chosen": best, "rule": "best mean dev score of the control (ties: the smaller lr)"}
    append_row(RESULTS, row)
    table = ", ".join(f"{k} {v:.3f}" for k, v in mean.items())
    print(f"RESULT quick_control_dev: {best:g} (peak lr of --quick's same-time control chosen on dev, {len(args.seeds)} "
          f"seeds, 48 dev tasks each, {ARM_STEPS} steps; mean dev score: {table})")


if __name__ == "__main__":
    main()

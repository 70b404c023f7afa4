"""Greedy measurement in fp32 vs bf16 on the pipeline's headline problems: how much faster, and how many answers move.

    python bench/eval_precision.py --rounds 2

``pipeline --quick`` measures greedily in bf16 where the machine probe says bf16 matmul is faster
(``eval_precision: auto``). This bench decodes the 96 test problems of ``--quick``'s seed 0 with the
base model and with a ``--quick`` SFT checkpoint (trained here, 16 steps), fp32 and bf16 interleaved,
batch 96, up to 80 tokens, and reports the decode time of each, the replies that differ and the
rewards that differ. It reads test to count agreement, not to choose anything.
Appends a row to bench/results/eval_precision.jsonl; ends with ``RESULT eval_precision``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_row import append_row, machine, provenance  # noqa: E402

from posttrain.configs.pipeline import QUICK, PipelineConfig  # noqa: E402
from posttrain.eval.compare import mean_and_se  # noqa: E402


def main() -> None:
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.envs.base import make_env
    from posttrain.experiments.stages import make_data, run_sft
    from posttrain.models.loading import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", default=str(ROOT / "runs" / "eval_precision"))
    args = p.parse_args()
    load0 = os.getloadavg()[0]
    cfg = PipelineConfig(**QUICK)
    work = Path(args.work)
    sft = run_sft(cfg, work, make_data(cfg, work))
    tasks = arithmetic_tasks(cfg.n_eval, cfg.seed + 2, "test", max_digits=cfg.max_digits)
    env = make_env("math")
    out = {}
    for name, spec in (("base", cfg.model), ("sft", sft["checkpoint"])):
        m = load_model(spec)
        secs: dict[str, list[float]] = {"fp32": [], "bf16": []}
        texts, rewards = {}, {}
        for _ in range(args.rounds):
            for dt in ("fp32", "bf16"):
                g = HFGenerator(m.model, m.tokenizer, batch_size=96, dtype=dt, greedy_in_dtype=True)
                t = time.perf_counter()
                c = g.generate([x.messages for x in tasks], SamplingParams(max_new_tokens=80, temperature=0.0))
                secs[dt].append(time.perf_counter() - t)
                texts[dt] = [y[0].text for y in c]
                rewards[dt] = [env.verify(x, [{"role": "assistant", "content": y[0].text}]).reward for x, y in zip(tasks, c)]
        mean = {k: mean_and_se(v)[0] for k, v in secs.items()}
        se = {k: mean_and_se(v)[1] for k, v in secs.items()}
        out[name] = {"seconds": secs, "mean_s": mean, "se_s": se, "speedup": mean["fp32"] / mean["bf16"],
                     "replies_differ": sum(a != b for a, b in zip(texts["fp32"], texts["bf16"])),
                     "rewards_differ": sum(a != b for a, b in zip(rewards["fp32"], rewards["bf16"])),
                     "accuracy": {k: sum(v) / len(v) for k, v in rewards.items()}}
        print(f"[bench] {name}: fp32 {mean['fp32']:.1f} s, bf16 {mean['bf16']:.1f} s; replies differ "
              f"{out[name]['replies_differ']}/96, rewards {out[name]['rewards_differ']}", flush=True)
    shutil.rmtree(work / "sft" / "checkpoints", ignore_errors=True)
    row = {"bench": "eval_precision", **provenance("test", machine(load0, os.getloadavg()[0])), "rounds": args.rounds,
           "n_tasks": len(tasks), "models": out}
    append_row(ROOT / "bench" / "results" / "eval_precision.jsonl", row)
    s = out["sft"]
    print(f"RESULT eval_precision: {s['speedup']:.2f}x (greedy decode of 96 problems, bf16 over fp32, the --quick SFT "
          f"checkpoint, {args.rounds} interleaved rounds: fp32 {s['mean_s']['fp32']:.1f} s, bf16 {s['mean_s']['bf16']:.1f} s; "
          f"{s['replies_differ']} replies and {s['rewards_differ']} rewards differ, accuracy {s['accuracy']['fp32']:.3f} fp32 vs "
          f"{s['accuracy']['bf16']:.3f} bf16; base model {out['base']['speedup']:.2f}x, {out['base']['rewards_differ']} rewards differ)")


if __name__ == "__main__":
    main()

"""The FSDP2 sharded trainer against one trainer (``scale.trainer.count``; docs/scale.md).

    PYTHONPATH=$PWD python bench/sharded_trainer.py                        # tiny Llama and the embedded model
    PYTHONPATH=$PWD python bench/sharded_trainer.py --parts ray --rounds 3          # the Ray GRPO part alone

Part 1, torch only (no Ray): the loop's own ``update`` (micro-batches, token normalisation over the
whole step, clipping, AdamW) on a fixed batch of random token rows, in 1 process or in 2 gloo ranks
(spawned processes, one torch thread each, the model sharded with ``train/sharding.py``), the two
interleaved round by round so load drift on the shared machine hits both alike. Per rank: the bytes
of parameters + gradients + AdamW states it holds after a step (a DTensor counts its local shard),
and the update's wall time (the mean of the steps after the first, which allocates the optimizer
states). The loss of the last step is printed beside the other's, as a check.

Part 2 (``--parts ray``): a tiny GRPO run on Ray with ``scale.trainer.count`` 1 and 2
(``ray.init(num_cpus=2)``; trainer ranks 0.5 CPU each), interleaved: mean ± standard error over the
steps of ``time_update_s`` and ``step_s``; the largest difference of ``loss`` (absolute: the GRPO loss sits
near 0) and of ``grad_norm`` (relative) between the two runs, and whether every step's reward agrees.

Ends with one ``RESULT`` line and appends one JSON row per model (and per Ray comparison) to
``bench/results/sharded_trainer.jsonl``, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from results_row import append_row, machine, mean_se, provenance  # noqa: E402  bench/results_row.py

RESULTS = ROOT / "bench" / "results" / "sharded_trainer.jsonl"


class CEStep:
    """Loss inputs of micro-batch ``idx`` (row indices): next-token log-probs, divided by the whole
    step's token count, as every stage does."""

    name, balance_loss = "ce", False

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows
        self.num_tokens = float(sum(len(r) - 1 for r in rows))

    def loss_inputs(self, model, idx):
        import torch

        from posttrain.algos.losses import LossInputs, token_logprobs

        ids = torch.tensor([self.rows[i] for i in idx])  # equal lengths: no padding
        logits = model(input_ids=ids).logits
        mask = torch.ones(len(idx), ids.shape[1] - 1, dtype=torch.bool)
        return LossInputs(token_logprobs(logits[:, :-1], ids[:, 1:]), mask, num_tokens=self.num_tokens)

    def after_update(self):
        pass


def _rank(rank: int, world: int, port: int, model_name: str, rows: int, seq: int, micro_rows: int, steps: int,
          out: str) -> None:
    import random

    import torch

    from posttrain.algos.losses import make_loss
    from posttrain.models.loading import load_model
    from posttrain.train import sharding
    from posttrain.train.loop import Trainer, update

    torch.set_num_threads(1)
    ranks = sharding.init(rank, world, "gloo", "127.0.0.1", port, timeout_s=1800) if world > 1 else None
    torch.manual_seed(0)
    model = load_model(model_name, seed=0, device="cpu", dtype=torch.float32).model
    model.config.use_cache = False
    if ranks is not None:
        sharding.shard_model(model, ranks)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-5)
    t = Trainer(SimpleCfg(), model, None, "cpu", opt, params, _null, None, None, ranks=ranks)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    data = [[rng.randrange(vocab) for _ in range(seq)] for _ in range(rows)]
    idx = list(range(rows))
    shares = [idx[len(idx) * r // world: len(idx) * (r + 1) // world] for r in range(world)]
    micro = sharding.interleave([[s[i:i + micro_rows] for i in range(0, len(s), micro_rows)] for s in shares])
    times, m = [], {}
    for _ in range(steps):
        t0 = time.perf_counter()
        m = update(t, CEStep(data), micro, make_loss("ce"))
        times.append(time.perf_counter() - t0)
    held = (sharding.local_bytes(params) + sharding.local_bytes(p.grad for p in params if p.grad is not None)
            + sharding.local_bytes(v for s in opt.state.values() for v in s.values() if v.dim() > 0))
    record = {"rank": rank, "bytes": held, "update_s": times, "loss": m["loss"], "grad_norm": m["grad_norm"]}
    Path(f"{out}.{rank}").write_text(json.dumps(record))
    sharding.close()


class SimpleCfg:  # what update reads of a stage's config
    def __init__(self) -> None:
        from posttrain.configs.train import MoEConfig, OptimConfig

        self.optim, self.moe = OptimConfig(lr=1e-5, grad_clip=1.0), MoEConfig()


def _null():
    from contextlib import nullcontext

    return nullcontext()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(model: str, world: int, args) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/r"
        mp.spawn(_rank, args=(world, _port(), model, args.rows, args.seq, args.micro_rows, args.steps, out),
                 nprocs=world)
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return {"bytes_per_rank": [r["bytes"] for r in ranks], "update_s": ranks[0]["update_s"][1:],
            "loss": ranks[0]["loss"], "grad_norm": ranks[0]["grad_norm"]}


def torch_part(args) -> list[str]:
    lines = []
    for model in args.models:
        load0 = os.getloadavg()[0]
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for _ in range(args.rounds):
            for world in (1, 2):
                runs[world].append(measure(model, world, args))
        load1 = os.getloadavg()[0]
        one, two = runs[1], runs[2]
        mib1 = one[0]["bytes_per_rank"][0] / 2**20
        mib2 = [b / 2**20 for b in two[0]["bytes_per_rank"]]
        t1 = mean_se([s for r in one for s in r["update_s"]])
        t2 = mean_se([s for r in two for s in r["update_s"]])
        print(f"{model}: {args.rows} rows x {args.seq} tokens, micro-batches of {args.micro_rows} rows, "
              f"{args.rounds} rounds x {args.steps - 1} timed steps; load {load0:.1f} -> {load1:.1f}")
        print(f"  params+grads+AdamW per rank: 1 trainer {mib1:.1f} MiB; 2 ranks " +
              " / ".join(f"{x:.1f}" for x in mib2) + f" MiB ({max(mib2) / mib1:.3f} of one)")
        print(f"  update wall time: 1 trainer {t1[0]:.3f} ± {t1[1]:.3f} s; 2 ranks {t2[0]:.3f} ± {t2[1]:.3f} s "
              f"({t1[0] / t2[0]:.2f}x)")
        print(f"  last step loss {one[-1]['loss']:.7f} vs {two[-1]['loss']:.7f}, grad norm "
              f"{one[-1]['grad_norm']:.6f} vs {two[-1]['grad_norm']:.6f}")
        append_row(RESULTS, {"bench": "sharded_trainer", "part": "torch", "model": model, "rows": args.rows,
                             "seq": args.seq, "micro_rows": args.micro_rows, "rounds": args.rounds,
                             "timed_steps": args.steps - 1, "mib_one": mib1, "mib_ranks": mib2,
                             "update_s_one": t1, "update_s_two": t2,
                             "loss": [one[-1]["loss"], two[-1]["loss"]],
                             "grad_norm": [one[-1]["grad_norm"], two[-1]["grad_norm"]],
                             **provenance("none", machine(load0, load1, threads_per_rank=1))})  # memory, time
        lines.append((model, max(mib2) / mib1, t1[0] / t2[0]))
    return lines


def ray_part(args) -> str:
    import ray

    import tests.integration.scale_env  # noqa: F401  (the stand-in environment the actors import)
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.scale.controller import run_rl

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    load0 = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="sharded_ray_"))
    rows: dict[int, list[dict]] = {1: [], 2: []}
    for rnd in range(args.rounds):
        for count in (1, 2):
            run_dir = root / f"c{count}_r{rnd}"
            cfg = load_config(RLConfig, None, [
                "model=tiny-llama", f"run_dir={run_dir}", f"train.steps={args.ray_steps}", "train.eval_every=0",
                "train.save_every=0", "rollout.prompts_per_step=8", "rollout.group_size=4",
                "rollout.max_new_tokens=16", "algo.overlong_filter=false", "algo.dynamic_filter=false",
                "algo.skip_zero_advantage=false", "optim.lr=1e-3", "train.plot=false", "train.threads=1",
                "envs=[{name: test_vowel_share_ray, train_tasks: 64, val_tasks: 0}]",
                "scale.worker_imports=[tests.integration.scale_env]", "scale.backend=ray",
                f"scale.trainer.count={count}", "scale.trainer.num_cpus=0.5"])
            run_rl(cfg, progress=False)
            rows[count] += [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    ray.shutdown()
    load1 = os.getloadavg()[0]
    stats = {}
    for k in ("time_update_s", "step_s"):
        stats[k] = [mean_se([r[k] for r in rows[c] if k in r]) for c in (1, 2)]
    pairs = [(a, b) for a, b in zip(rows[1], rows[2]) if "loss" in a]
    # the GRPO loss sits near 0 (advantages centred per group): its difference is absolute
    diffs = {"loss_abs": max(abs(a["loss"] - b["loss"]) for a, b in pairs),
             "grad_norm_rel": max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in pairs),
             "same_rewards": all(a["reward"] == b["reward"] for a, b in pairs)}
    print(f"Ray, tiny Llama GRPO, {args.rounds} rounds x {args.ray_steps} steps (8 prompts x 4 samples x 16 tokens); "
          f"load {load0:.1f} -> {load1:.1f}")
    for k, ((a, sa), (b, sb)) in stats.items():
        print(f"  {k}: count=1 {a:.3f} ± {sa:.3f} s; count=2 {b:.3f} ± {sb:.3f} s")
    print(f"  count=2 vs 1: largest |loss difference| {diffs['loss_abs']:.2e}, largest relative grad_norm "
          f"difference {diffs['grad_norm_rel']:.2e}, same rewards every step: {diffs['same_rewards']}")
    append_row(RESULTS, {"bench": "sharded_trainer", "part": "ray", "model": "tiny-llama", "rounds": args.rounds,
                         "steps": args.ray_steps, **{k: v for k, v in stats.items()}, "differences": diffs,
                         **provenance("none", machine(load0, load1, threads_per_rank=1))})  # time, no grading
    return stats["time_update_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny-llama", "embedded"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro-rows", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="update steps per run (the first is not timed)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", nargs="+", choices=["torch", "ray"], default=["torch", "ray"])
    ap.add_argument("--ray-steps", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("POSTTRAIN_PRECISION_PROBE", "fp32=100,bf16=1")  # no matmul probe: fp32 as the tests
    lines = torch_part(args) if "torch" in args.parts else []
    ray_update = ray_part(args) if "ray" in args.parts else None
    if lines:
        model, frac, speed = lines[-1]
        print(f"RESULT sharded_trainer: {frac:.3f} x (params+grads+AdamW state held per rank, 2 gloo ranks vs one "
              f"trainer, {model}; its update ran at {speed:.2f}x the one-trainer speed)")
    else:
        (a, sa), (b, sb) = ray_update
        print(f"RESULT sharded_trainer: {b / a:.2f} x (update time of the tiny Ray GRPO run, 2 gloo ranks vs "
              f"one trainer: {b:.3f} ± {sb:.3f} s vs {a:.3f} ± {sa:.3f} s)")


if __name__ == "__main__":
    main()

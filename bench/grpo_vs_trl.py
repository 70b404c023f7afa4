"""GRPO step time: ``posttrain rl`` vs TRL's ``GRPOTrainer``, same workload, one process.

Workload (both sides): the embedded SmolLM2-135M-Instruct in fp32 on the CPU; the same 8 math-env
training tasks rendered with posttrain's chat template (TRL gets a tokenizer carrying it); group
size 4 (32 rollouts a step); 48 new tokens at temperature 1; rewards from the math environment's
verifier; AdamW at the same learning rate; the token-level clipped PG loss with no KL (TRL's
defaults ``loss_type="dapo"``, ``beta=0``); one warm-up step, then ``--steps`` timed steps. A step
is sampling + verification + the update, measured per step (posttrain: the ``step_s`` it logs, which
excludes checkpoint writes; TRL: a callback around each optimizer step).

What differs, by design (it is what is being compared):

* sampling: posttrain's ``HFGenerator`` (shared prefill, finished rows dropped; bf16 sampling
  weights where the precision probe says bf16 is faster, ``rollout.engine.dtype: auto``, the
  trainer in fp32 either way) vs ``model.generate`` on the fp32 model inside TRL (TRL's ``bf16``
  flag would also train in bf16, which the RL numerics rule out: models/precision.py);
* the update: posttrain packs rows (no padding) and computes logits only at completion positions;
  TRL trains every rollout in one padded batch, with logits over the last completion-length
  positions of every row. Neither runs an extra forward pass for the old log-probs (TRL skips it
  too when generation and optimisation are aligned, as here). The number of rollouts each side
  trained is printed.

Two posttrain modes, run one after the other in the same process, against the same TRL run:

* ``equal`` (equal work): every rollout is trained, as TRL does — ``algo.dynamic_filter=false`` and
  ``algo.skip_zero_advantage=false``, so groups with equal rewards stay in the batch and their
  zero-advantage rollouts still go through the forward and backward (a zero gradient, real work);
* ``skip`` (posttrain's defaults): zero-advantage groups are dropped and never trained, which gives
  the same update for less work. Its ratio is reported beside, never instead of, the equal one.

Overlong filtering is off on the posttrain side for this comparison (48 tokens truncate most
replies, and TRL keeps truncated ones by default), so both train on the same kind of batch.

Equal precision (``--precisions fp32,bf16``): ``fp32`` trains and samples in fp32 on both sides
(posttrain's ``rollout.engine.dtype=fp32``); ``bf16`` runs both under bf16 autocast (posttrain's
``train.precision=bf16`` and bf16 sampling weights; TRL's ``bf16=True``, which trains and samples in
it). ``auto`` is not offered: it gave posttrain bf16 sampling against TRL's fp32, the unequal
comparison the 2026-12-01 figure below was. ``--repeats N`` interleaves N repeats (posttrain, TRL,
posttrain, TRL ...) and reports each ratio as mean ± se over them.

Prints s/step for each and the ratio, and appends one JSON line to
bench/results/grpo_vs_trl.jsonl. Run: ``python bench/grpo_vs_trl.py [--steps 2] [--threads 1]
[--precisions fp32,bf16] [--repeats 3]``.
The machine is shared: the load average before and after is recorded with the figures.

Latest result (2026-12-05, idle 2-core CPU, 1 thread, 3 interleaved repeats, equal work and equal
precision, row 8): fp32 3.29 ± 0.07x (posttrain 13.1 s/step vs TRL 42.9), bf16 4.44 ± 0.07x (8.8 vs
39.2). See docs/benchmarks.md, "GRPO step vs TRL".
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "grpo_vs_trl.jsonl"
PROMPTS, GROUP, MAX_NEW, LR = 8, 4, 48, 1e-6


MODES = {"equal": ["algo.dynamic_filter=false", "algo.skip_zero_advantage=false"], "skip": []}


def run_posttrain(model: str, steps: int, run_dir: Path, mode: str = "skip", threads: int = 0,
                  precision: str = "auto") -> dict[str, Any]:
    """posttrain's RL stage on the workload; ``mode``: equal (every rollout trained) or skip.
    ``precision``: auto (fp32 training, sampling weights by the probe), fp32 (both fp32) or bf16 (both
    bf16: the trainer under autocast, as TRL's ``bf16=True`` trains)."""
    train_p = "fp32" if precision == "auto" else precision
    from posttrain.configs import load_config
    from posttrain.train.metrics import read_metrics
    from posttrain.configs.rl import RLConfig
    from posttrain.train.rl import train_rl

    cfg = load_config(RLConfig, None, [
        f"model={model}", f"run_dir={run_dir}", f"train.steps={steps + 1}", "train.eval_every=0",
        "train.save_every=0", "train.plot=false", f"train.precision={train_p}", f"train.threads={threads}",
        f"rollout.engine.dtype={precision}",
        f"envs=[{{name: math, train_tasks: {PROMPTS}, val_tasks: 0}}]", "curriculum.kind=random",
        f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}", f"rollout.max_new_tokens={MAX_NEW}",
        "algo.overlong_filter=false", f"optim.lr={LR}", *MODES[mode],
    ])
    train_rl(cfg, progress=False)
    rows = [r for r in read_metrics(run_dir) if "step_s" in r][1:]  # drop the warm-up step
    mean = lambda k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    return {"s_per_step": mean("step_s"), "generate_s": mean("time_generate_s"), "verify_s": mean("time_verify_s"),
            "train_s": mean("time_train_s"), "rollouts_trained": mean("rollouts_trained"),
            "reward": mean("reward"), "rollouts_per_step": [r["rollouts_trained"] for r in rows],
            # rollout.engine.dtype=auto: bf16 sampling weights where the probe says bf16 is faster
            "sampling_precision": next((r["precision_sampling"] for r in read_metrics(run_dir)
                                        if "precision_sampling" in r), "fp32")}


def run_trl(model_spec: str, steps: int, out_dir: Path, bf16: bool = False) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.envs.base import Task, make_env
    from posttrain.models.loading import load_model
    from posttrain.train.checkpoint import chat_template_text

    env = make_env("math")
    tasks = env.tasks("train", PROMPTS, 0)
    loaded = load_model(model_spec, device="cpu", dtype=torch.float32)  # embedded: resolve_spec's local dir
    model, tok = loaded.model, loaded.tokenizer
    tok.chat_template = chat_template_text()  # the prompts posttrain renders
    data = Dataset.from_list([{"prompt": t.messages, "task": json.dumps(t.to_dict())} for t in tasks])

    def math_reward(prompts: list[Any], completions: list[Any], task: list[str], **_: Any) -> list[float]:
        return [env.verify(Task.from_dict(json.loads(t)), c).reward for t, c in zip(task, completions)]

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    cfg = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        max_completion_length=MAX_NEW, temperature=1.0, learning_rate=LR, max_steps=steps + 1, beta=0.0,
        use_cpu=True, bf16=bf16, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta2=0.95, seed=0,
        # TRL turns activation checkpointing on by default (a memory saving that recomputes the
        # forward in the backward); posttrain does not checkpoint, so it is off here for equal work
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[StepTimer()])
    trainer.train()
    timed = times[1:]
    return {"s_per_step": sum(timed) / len(timed), "rollouts_trained": PROMPTS * GROUP}


PRECISIONS = {"fp32": False, "bf16": True}  # ours (train + sampling) -> TRL's bf16 flag (it trains and samples in it)


def mean_se(xs: list[float]) -> tuple[float, float]:
    from results_row import mean_se as ms

    return ms(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step (default 2)")
    ap.add_argument("--model", default="embedded", help="model spec (default embedded; tiny-llama: smoke test)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both (default 1: bench/threads.py)")
    ap.add_argument("--modes", default="equal,skip", help="posttrain modes to run (equal, skip or both)")
    ap.add_argument("--precisions", default="fp32",
                    help="equal precision on both sides, a comma list of fp32 (train and sample in fp32) and bf16 "
                         "(both under bf16 autocast, TRL's bf16=True); default fp32")
    ap.add_argument("--repeats", type=int, default=1,
                    help="interleaved repeats (posttrain, TRL, posttrain, TRL, ...); ratios as mean ± se over them")
    args = ap.parse_args()

    # posttrain before torch: its __init__ loads the MKL shim (models/blas.py), which only works before
    # torch is imported. Both sides run in this process, so TRL gets the same BLAS as posttrain.
    import posttrain  # noqa: F401
    import torch
    import trl

    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: a comma list of {', '.join(MODES)}, got {args.modes!r}")
    precisions = [p for p in args.precisions.split(",") if p]
    if not precisions or set(precisions) - set(PRECISIONS):
        raise SystemExit(f"--precisions: a comma list of {', '.join(PRECISIONS)}, got {args.precisions!r}")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in precisions}  # per precision, one entry per repeat
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):  # interleaved: a drift in the machine's load hits both sides alike
            for p in precisions:
                d = Path(tmp) / f"r{r}_{p}"
                ours = {m: run_posttrain(args.model, args.steps, d / f"posttrain_{m}", m, args.threads, p)
                        for m in modes}
                theirs = run_trl(args.model, args.steps, d / "trl", PRECISIONS[p])
                runs[p].append({"posttrain_modes": ours, "trl": theirs,
                                "speedup_by_mode": {m: theirs["s_per_step"] / o["s_per_step"] for m, o in ours.items()}})
                print(f"[repeat {r + 1}/{args.repeats}, {p}] TRL {theirs['s_per_step']:.1f} s/step; " + "; ".join(
                    f"posttrain {m} {o['s_per_step']:.1f} s/step ({runs[p][-1]['speedup_by_mode'][m]:.2f}x)"
                    for m, o in ours.items()), flush=True)
    load_after = os.getloadavg()[0]
    summary: dict[str, dict[str, Any]] = {}
    for p, reps in runs.items():
        summary[p] = {"trl_s_per_step": mean_se([x["trl"]["s_per_step"] for x in reps])}
        for m in modes:
            summary[p][m] = {"s_per_step": mean_se([x["posttrain_modes"][m]["s_per_step"] for x in reps]),
                             "speedup": mean_se([x["speedup_by_mode"][m] for x in reps]),
                             "speedups": [round(x["speedup_by_mode"][m], 3) for x in reps],
                             "rollouts_trained": reps[-1]["posttrain_modes"][m]["rollouts_trained"]}
            s, t = summary[p][m], summary[p]["trl_s_per_step"]
            print(f"{p} {m:5s}: posttrain {s['s_per_step'][0]:.1f} ± {s['s_per_step'][1]:.1f} s/step vs TRL "
                  f"{t[0]:.1f} ± {t[1]:.1f}: {s['speedup'][0]:.2f} ± {s['speedup'][1]:.2f}x "
                  f"(repeats {', '.join(f'{v:.2f}' for v in s['speedups'])}; {s['rollouts_trained']:.0f} of "
                  f"{PROMPTS * GROUP} rollouts trained)")
    print(f"load average {load_before:.1f} -> {load_after:.1f}, {os.cpu_count()} cores, {torch.get_num_threads()} "
          f"threads, {args.steps} timed steps after 1 warm-up, {args.repeats} interleaved repeat(s)")
    head = "equal" if "equal" in modes else modes[0]
    first = runs[precisions[0]][-1]
    row = {
        "bench": "grpo_vs_trl",
        "model": args.model, "dtype": precisions[0], "precisions": precisions, "repeats": args.repeats,
        "prompts": PROMPTS, "group": GROUP, "max_new_tokens": MAX_NEW, "lr": LR, "timed_steps": args.steps,
        "summary": summary, "runs": runs,
        # the fields earlier rows carry, from the first precision's last repeat
        "posttrain_modes": first["posttrain_modes"], "trl": first["trl"], "speedup_by_mode": first["speedup_by_mode"],
        "posttrain": first["posttrain_modes"][head], "speedup": summary[precisions[0]][head]["speedup"][0],
        "versions": {"torch": torch.__version__, "trl": trl.__version__},
        **provenance("none", machine(load_before, load_after, threads=torch.get_num_threads())),  # speed only
    }
    if args.model == "embedded":  # smoke tests are not results
        append_row(RESULTS, row)
        print(f"appended to {RESULTS}")
    parts = [f"{p} {summary[p][head]['speedup'][0]:.2f} ± {summary[p][head]['speedup'][1]:.2f}" for p in precisions]
    side = [f"{p} {m} {summary[p][m]['speedup'][0]:.2f}" for p in precisions for m in modes if m != head]
    print(f"RESULT grpo_vs_trl: {summary[precisions[0]][head]['speedup'][0]:.2f} x TRL s/step ({head} work, equal "
          f"precision, {args.repeats} interleaved repeat(s): {'; '.join(parts)}"
          f"{'; ' + '; '.join(side) if side else ''}; load {load_before:.1f}->{load_after:.1f})")


if __name__ == "__main__":
    main()

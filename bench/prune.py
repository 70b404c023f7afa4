"""Pruning + distillation: how much of the teacher a pruned model recovers, per architecture, at one budget.

    python bench/prune.py --teacher runs/sft/checkpoints/step_000060 [--params 1.0e8 7.0e7] \
        [--distill-steps 60] [--search-steps 10] [--n-eval 100] [--data a.jsonl ...] [--no-record]
    python bench/prune.py --smoke --no-record        # tiny Llama, tiny budgets: the code path only
    python bench/prune.py --teacher ... --params 1.0e8 --distill-steps 120 --variants width   # a budget study
    python bench/prune.py --teacher ... --seed 1 --work <the seed-0 run's folder>   # another seed, same search

For each ``--params`` target, the teacher (an SFT checkpoint; it is also the model pruned) is cut by
three architectures, each distilled from it for the same ``--distill-steps`` × ``--batch``
conversations (``posttrain distill-logits``'s stage, top-``--topk`` teacher cache, the data order of
``--seed``):

* **width**: ``mlp_hidden`` only; **depth**: ``layers`` only;
* **searched**: the pick of ``posttrain prune-search`` (compress/search.py) over its default
  candidates at ``--search-steps``, chosen on held-out rows of the distillation data (never on test);
  when the pick is width or depth it is that run, not a second one;
* **SFT control**: the searched architecture trained with plain SFT (cross-entropy on the same data,
  same steps, batch, learning rate and order) instead of distillation.

Each model, and the teacher, is scored on: held-out cross-entropy on the data's held-out rows (nats
per assistant token); greedy accuracy on ``--n-eval`` **test**-split tasks of each ``--envs``
environment (default: ``arithmetic`` — the pipeline's problems —, ``mcq``, ``structured``), through
``eval/evaluate.py``; greedy decode tokens/s at batch 1 (compress/search.py: ``decode_speed``).

**Recovery** = student accuracy / teacher accuracy over the same tasks, in %, per environment and
pooled over all tasks, with the delta-method standard error of a ratio of paired means
(bench/quant_accuracy.py: ``ratio_delta_se``). The last line is ``RESULT prune_recovery: <searched
variant's pooled recovery at the first target> % (...)``; the row (every figure, per-task scores,
the search table) goes to bench/results/prune.jsonl unless ``--no-record`` (``--results`` for another
file). ``--smoke`` figures come from random tiny models and mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import posttrain  # noqa: F401,E402  (before torch: the MKL shim of models/blas.py)
from results_row import append_row, machine, mean_se, provenance, record_args, refuse_smoke_record  # noqa: E402  (bench/results_row.py)

RESULTS = ROOT / "bench" / "results" / "prune.jsonl"
VARIANTS = {"width": "mlp_hidden", "depth": "layers"}  # variant → prune-search candidate name
ALL_VARIANTS = ("width", "depth", "searched", "sft_control")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", help="the SFT checkpoint pruned and distilled from (required unless --smoke)")
    ap.add_argument("--params", type=float, nargs="+", default=[1.0e8, 7.0e7], help="parameter targets")
    ap.add_argument("--distill-steps", type=int, default=60, help="steps of every variant and of the SFT control")
    ap.add_argument("--search-steps", type=int, default=10, help="distillation steps per prune-search candidate")
    ap.add_argument("--batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0,
                    help="training seed of every distillation and SFT-control run: their batch order and the rows "
                         "given reasoning-format transforms (the search, the held-out rows and the test tasks stay "
                         "those of seed 0)")
    ap.add_argument("--topk", type=int, default=64, help="teacher top-k (cached once per target)")
    ap.add_argument("--data", nargs="*", default=[], help="SFT JSONL to distil on (default: --n-data arithmetic rows)")
    ap.add_argument("--n-data", type=int, default=1000)
    ap.add_argument("--envs", nargs="+", default=["arithmetic", "mcq", "structured"])
    ap.add_argument("--n-eval", type=int, default=100, help="test tasks per environment")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--work", default="runs/bench_prune", help="checkpoints and tables go here")
    ap.add_argument("--variants", nargs="+", default=list(ALL_VARIANTS), choices=ALL_VARIANTS,
                    help="which models to train and score (default all; e.g. `width` alone for a budget study)")
    ap.add_argument("--smoke", action="store_true", help="tiny-llama and tiny budgets (figures mean nothing)")
    record_args(ap, RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.teacher = args.teacher or "tiny-llama"
        args.params, args.distill_steps, args.search_steps, args.batch, args.lr = [8.0e4], 2, 1, 8, 3e-3
        args.topk, args.n_data, args.n_eval, args.max_new_tokens, args.decode_tokens = 16, 40, 4, 16, 4
    if not args.teacher:
        ap.error("--teacher is required (the SFT checkpoint to prune), or --smoke")
    refuse_smoke_record(ap, args, RESULTS)
    return args


TRAINING_ARGS = ("teacher", "distill_steps", "search_steps", "batch", "lr", "topk", "data", "n_data")


def same_work(args: argparse.Namespace, work: Path) -> None:
    """The distillation, search and SFT-control runs under ``--work`` resume where they stopped (a
    killed bench goes on), so a second run with other training settings would silently continue the
    old runs on another schedule: refuse it in one line. The settings are kept in ``work/args.json``;
    ``--params`` may differ (each target has its own folder)."""
    mine = {k: getattr(args, k) for k in TRAINING_ARGS}
    path = work / "args.json"
    if path.exists():
        old = json.loads(path.read_text())
        diff = sorted(k for k in mine if old.get(k) != mine[k])
        if diff:
            raise SystemExit(f"{work} holds runs made with other {', '.join(diff)} ({', '.join(f'{k}={old.get(k)}' for k in diff)}): "
                             "give another --work, or delete that folder")
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1) + "\n")


def score(spec: str, args: argparse.Namespace, held: list[Any]) -> dict[str, Any]:
    """``measure``, kept in ``--work``/scores/ under a key of the model's weights (path, size, mtime)
    and the scoring settings: a second run (another ``--params``, or after a kill) does not grade the
    teacher again. A reused score says so (``cached``); its decode speed is from the first run."""
    import hashlib

    weights = sorted(Path(spec).glob("*.safetensors")) if Path(spec).is_dir() else []
    key = json.dumps({"model": str(Path(spec).resolve()) if weights else spec,
                      "weights": [(w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in weights],
                      "envs": args.envs, "n_eval": args.n_eval, "max_new_tokens": args.max_new_tokens,
                      "decode_tokens": args.decode_tokens, "held": len(held)}, sort_keys=True)
    path = Path(args.work) / "scores" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if weights and path.exists():
        return {**json.loads(path.read_text()), "cached": str(path)}
    got = measure(spec, args, held)
    if weights:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got) + "\n")
    return got


def measure(spec: str, args: argparse.Namespace, held: list[Any]) -> dict[str, Any]:
    """Held-out NLL, per-task test accuracy per environment, decode tokens/s of one model."""
    from posttrain.compress.search import decode_speed, heldout_nll
    from posttrain.engines.hf import HFGenerator
    from posttrain.eval.evaluate import build_env, evaluate
    from posttrain.models.loading import load_model

    loaded = load_model(spec, device="cpu")
    model, tok = loaded.model, loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen = HFGenerator(model, tok, batch_size=32)
    tasks: dict[str, float] = {}
    for env in args.envs:
        res = evaluate(gen, build_env(env, None), split="test", n_tasks=args.n_eval,
                       max_new_tokens=args.max_new_tokens, seed=0)
        tasks.update({f"{env}/{t.task_id}": t.samples[0].reward for t in res.tasks})
    prompt = held[0].input_ids[: held[0].loss_mask.index(1)]
    return {"model": spec, "params": sum(p.numel() for p in model.parameters()),
            "nll": heldout_nll(model, held, 512, "auto", pad), "tasks": tasks,
            "decode_tokens_per_s": decode_speed(model, prompt, args.decode_tokens, pad)}


def recovery(student: dict[str, float], teacher: dict[str, float], prefix: str = "") -> tuple[float, float]:
    """Student / teacher accuracy in % over the tasks whose id starts with ``prefix``, ± delta-method se
    (nan when the teacher scores 0: there is nothing to recover)."""
    from quant_accuracy import ratio_delta_se  # bench/quant_accuracy.py (imports the eval stack: not for --help)

    ids = sorted(i for i in teacher if i.startswith(prefix))
    a, b = [student[i] for i in ids], [teacher[i] for i in ids]
    if not ids or sum(b) == 0:
        return float("nan"), float("nan")
    se = ratio_delta_se(a, b) if len(ids) > 1 else float("nan")
    return 100 * sum(a) / sum(b), 100 * se


def paired_gain(a: dict[str, float], b: dict[str, float]) -> tuple[float, float]:
    """Mean of a − b over the same tasks, in points, ± its paired se (distillation against the SFT
    control of the same architecture)."""
    m, se = mean_se([a[i] - b[i] for i in sorted(b)])
    return 100 * m, 100 * se


def finished_search(cfg: Any) -> str | None:
    """The pick of a search already finished under ``cfg.out`` with this very config (``search.json``),
    when every candidate's pruned model is still there; None otherwise. Read back, not re-run: the
    candidates' distillation checkpoints, most of ``--work``'s disk (7.7 GB at 1.0e8), may be deleted
    once the search is done, and re-running it would only retrain them to the same table."""
    done = Path(cfg.out) / "search.json"
    if not done.exists():
        return None
    rec = json.loads(done.read_text())
    mine = json.loads(json.dumps(cfg.model_dump()))
    same = {**rec.get("config", {}), "out": None} == {**mine, "out": None}  # a copied search lives elsewhere
    models = all((Path(cfg.out) / "candidates" / c["name"] / "model" / "config.json").exists() for c in rec["candidates"])
    if not (same and models):
        return None
    print(f"[bench] {done}: this search is finished, its pick ({rec['chosen']}) is reused", flush=True)
    return rec["chosen"]


def run_target(p: float, args: argparse.Namespace, data: list[str], held: list[Any], work: Path) -> dict[str, Any]:
    """Search, then width / depth / searched distilled for --distill-steps and the SFT control; scored."""
    from posttrain.compress.distill_logits import train_distill_logits
    from posttrain.compress.search import distill_config, run_search
    from posttrain.configs.prune import PruneSearchConfig
    from posttrain.configs.sft import SFTConfig, SFTTrainConfig
    from posttrain.train.sft import train_sft

    budget = {"data": {"train": [{"path": d} for d in data], "val_frac": 0.05 if not args.smoke else 0.2},
              "optim": {"lr": args.lr, "warmup_steps": 0 if args.smoke else 5},
              "train": {"steps": args.search_steps, "batch_size": args.batch, "precision": "fp32" if args.smoke else "auto"}}
    cfg = PruneSearchConfig(model=args.teacher, out=str(work / "search"), params=p, decode_tokens=args.decode_tokens,
                            calibration={"path": data[0], "samples": 8 if args.smoke else 64},
                            distill={**budget, "topk": args.topk})
    chosen = finished_search(cfg) or run_search(cfg).chosen.name
    # a seed moves the batch order (and which rows get the reasoning-format transforms): split_seed
    # keeps seed 0's held-out rows, so every seed is scored on the rows the search ranked on
    long = cfg.distill.model_copy(update={
        "train": cfg.distill.train.model_copy(update={"steps": args.distill_steps, "seed": args.seed}),
        "data": cfg.distill.data.model_copy(update={"split_seed": 0})})
    runs_dir = work if args.seed == 0 else work / f"seed_{args.seed}"
    cfg_long = cfg.model_copy(update={"distill": long})
    # the pick may be width or depth: then that run is the searched one, trained once
    alias = {"searched": v for v, name in VARIANTS.items() if name == chosen}
    wanted = [v for v in ALL_VARIANTS if v in args.variants and v != "sft_control"]
    train = {alias.get(v, v) for v in wanted}
    runs: dict[str, str] = {}
    for variant, name in {**VARIANTS, "searched": chosen}.items():
        if variant in train:
            pruned = Path(cfg.out) / "candidates" / name / "model"
            # the seed also draws which rows get the reasoning-format transforms, so the trained rows
            # (and the teacher's logits on them) differ: one cache per seed, the search's for seed 0
            dcfg = distill_config(cfg_long, pruned, runs_dir / variant, cache_dir=runs_dir if args.seed else None)
            runs[variant] = str(train_distill_logits(dcfg, False).checkpoint)
    runs.update({v: runs[alias[v]] for v in wanted if v in alias})
    runs = {v: runs[v] for v in wanted}
    if "sft_control" in args.variants:
        sft = SFTConfig(model=str(Path(cfg.out) / "candidates" / chosen / "model"), run_dir=str(runs_dir / "sft_control"),
                        data=long.data, optim=long.optim, moe=long.moe,
                        train=SFTTrainConfig(**long.train.model_dump()))
        runs["sft_control"] = str(train_sft(sft, progress=False).checkpoint)
    scored: dict[str, dict[str, Any]] = {}  # the searched run may be the width or depth one: scored once
    scores = {v: scored.setdefault(ckpt, score(ckpt, args, held)) if ckpt not in scored else scored[ckpt]
              for v, ckpt in runs.items()}
    return {"params_target": p, "seed": args.seed, "searched": chosen, "search": json.loads((Path(cfg.out) / "search.json").read_text()),
            "checkpoints": runs, "scores": scores}


def main() -> None:
    args = parse()
    import torch

    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.configs.sft import SFTConfig
    from posttrain.models.loading import load_tokenizer
    from posttrain.train.sft import load_sft_data

    torch.manual_seed(0)
    work = Path(args.work)
    same_work(args, work)
    data = list(args.data)
    if not data:
        data = [str(work / "data" / "arith_train.jsonl")]
        write_jsonl(arithmetic_rows(args.n_data, 0, "train"), data[0])  # the training split only
    held_cfg = SFTConfig(model=args.teacher, data={"train": [{"path": d} for d in data],
                                                   "val_frac": 0.05 if not args.smoke else 0.2})
    held = load_sft_data(held_cfg, load_tokenizer(args.teacher)).validation  # the rows the search scores on
    load_before, t0 = os.getloadavg()[0], time.time()
    teacher = score(args.teacher, args, held)
    targets = [run_target(p, args, data, held, work / f"params_{p:.3g}") for p in args.params]
    minutes = (time.time() - t0) / 60
    for t in targets:
        for name, s in t["scores"].items():
            s["recovery"] = {env: recovery(s["tasks"], teacher["tasks"], f"{env}/") for env in args.envs}
            s["recovery"]["pooled"] = recovery(s["tasks"], teacher["tasks"])
        if {"searched", "sft_control"} <= set(t["scores"]):
            t["distill_minus_sft_control"] = paired_gain(t["scores"]["searched"]["tasks"],
                                                         t["scores"]["sft_control"]["tasks"])
    print(markdown(args, teacher, targets))
    first = targets[0]
    r = first["scores"]
    pooled = {v: r[v]["recovery"]["pooled"] for v in r}
    n = len(teacher["tasks"])
    if not args.no_record:
        append_row(Path(args.results), {
            "bench": "prune", "args": vars(args), "minutes": round(minutes, 1), "teacher": teacher, "targets": targets,
            **provenance("test", machine(load_before, os.getloadavg()[0]))})
    head = next(v for v in ("searched", "width", "depth", "sft_control") if v in pooled)
    what = f"searched {first['searched']}" if head == "searched" else head
    others = ", ".join(f"{v.replace('sft_control', 'SFT control')} {pooled[v][0]:.1f}" for v in pooled if v != head)
    gap = first.get("distill_minus_sft_control")
    print(f"RESULT prune_recovery: {pooled[head][0]:.1f} % (± {pooled[head][1]:.1f}; {what} "
          f"at ≤ {first['params_target']:.3g} params after {args.distill_steps} distill-logits "
          f"steps of {args.batch}: test accuracy / the teacher's over {n} tasks of {'+'.join(args.envs)}"
          + (f"; {others} %" if others else "")
          + (f"; distilled − SFT control {gap[0]:+.1f} ± {gap[1]:.1f} points, paired" if gap else "")
          + f"{'; SMOKE: random tiny model, not a figure' if args.smoke else ''})")


def markdown(args: argparse.Namespace, teacher: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    envs = args.envs
    def acc(s: dict[str, Any], env: str) -> float:
        xs = [v for k, v in s["tasks"].items() if k.startswith(f"{env}/")]
        return sum(xs) / len(xs)

    head = (f"| model | params | held-out NLL | {' | '.join(f'{e} acc' for e in envs)} | recovery % ± se "
            f"({', '.join(envs)}; pooled) | decode tok/s |")
    lines = [head, "|" + "---|" * (5 + len(envs))]
    lines.append(f"| teacher {teacher['model']} | {teacher['params']:,} | {teacher['nll']:.4f} | "
                 + " | ".join(f"{100 * acc(teacher, e):.1f}%" for e in envs) + f" | 100 | {teacher['decode_tokens_per_s']:.0f} |")
    for t in targets:
        for v, s in t["scores"].items():
            name = f"{v} ({t['searched']})" if v in ("searched", "sft_control") else v
            rec = "; ".join(f"{x:.1f} ± {se:.1f}" for x, se in s["recovery"].values())
            lines.append(f"| ≤ {t['params_target']:.3g}: {name} | {s['params']:,} | {s['nll']:.4f} | "
                         + " | ".join(f"{100 * acc(s, e):.1f}%" for e in envs)
                         + f" | {rec} | {s['decode_tokens_per_s']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

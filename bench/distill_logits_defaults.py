"""Which defaults ``posttrain distill-logits`` should have, measured; and off-policy logits vs on-policy MOPD.

    python bench/distill_logits_defaults.py --teacher runs/sft/checkpoints/step_000060 \
        --data runs/pipeline/data/train.jsonl [--params 1.0e8] [--steps 30] [--seeds 0 1] [--mopd]
    python bench/distill_logits_defaults.py --smoke --no-record [--mopd]    # tiny Llama: the code path only

The student is the teacher (an SFT checkpoint) cut to ``--params`` parameters by ``posttrain prune``
(default axes, 64 calibration rows of ``--data``), once, into ``--work``/student (reused when its
``prune.json`` names the same teacher and calibration file). From that student, ``posttrain distill-logits``
(compress/distill_logits.py) runs ``--steps`` × ``--batch`` conversations of ``--data`` per setting, one
setting changed at a time from recipes/distill_logits.yaml's defaults (full vocabulary, T = 1,
ce_weight 0, LR 1e-4):

* ``teacher.topk=64`` with a teacher cache file (built inside the run: its seconds count);
* ``loss.temperature=2``; ``loss.ce_weight=0.5``; ``optim.lr=3e-4`` and ``optim.lr=3e-5``.

Every run of a seed has the same data order and held-out split (``train.seed`` = the seed) and the
recipe's schedule; each starts from an empty run directory. Each final checkpoint, the pruned
student and the teacher are scored on **dev**-split conversations (never test; the data are the
training split): ``--heldout`` arithmetic rows and ``--heldout`` instruction rows (the instruction
environment's dev tasks, RLVR's constraint counts, its scripted reference reply as the assistant
turn). The score is the cross-entropy of the assistant tokens: per conversation (token mean, fp32),
and pooled over tokens (the figure ``compress/search.py: heldout_nll`` gives).

**The rule, stated before any figure.** Per factor (top-k, temperature, ce_weight, LR), a non-default
value replaces the default only if its dev NLL is lower by more than max(2 paired se, 0.01
nats/token): the paired difference is taken conversation by conversation on the same dev
conversations (per-conversation NLL, averaged over ``--seeds`` first), its mean and se over
conversations. Two values within that margin are equal, and then the default stays, except where
the value changes the compute: top-k with a cache replaces the full vocabulary when equal and at
least 10 % fewer measured wall seconds (mean over seeds); the full vocabulary stays when equal and
not that much slower. Two non-defaults that both win: the lower NLL.

**``--mopd``: on-policy at equal wall time.** ``posttrain distill`` (MOPD, distill/stage.py) from the
same pruned student, recipes/distill.yaml's settings with the unpruned teacher as its only teacher
(``teachers.models=[{name: big, model: <teacher>}]``, ``default: big``), on the ``arithmetic`` and
``instruction`` environments (train-split tasks), ``--max-new-tokens`` per rollout, LR ``--mopd-lr``
(default 1e-5, recipes/mopd_cpu.yaml's: the recipe's 1e-6 is for a student already close to its
teachers, and a few steps of it would leave a just-pruned one where it was). Its budget is the wall
seconds of the default distill-logits run of the same seed, whole command (set-up, teacher, held-out
KL included). The RL loop has no wall-time budget, so MOPD runs in calls: one step, then resumes of
the same run (the recipe's LR is constant, so the split changes nothing) to the step count that the
mean step so far and one more set-up leave room for. Every call's set-up counts against MOPD; the
seconds it really took are recorded next to the budget, with how many rollouts it trained on (the
overlong filter, off by default for MOPD since this bench's smoke found it dropping every rollout
of a rambling student, would drop truncated rollouts whole, teacher signal and all). Both checkpoints
are scored by the dev NLL above (off-policy: reference replies, what distill-logits trains on) and by
greedy dev reward on ``--n-eval`` tasks of each environment (on-policy: what MOPD trains for), with
the paired se over tasks; the teacher and the pruned student beside them.

Ends with ``RESULT distill_logits_defaults: <dev NLL at the defaults> nats/token (...)``; the row
goes to bench/results/distill_logits_defaults.jsonl unless ``--no-record``. ``--smoke`` figures are
from random tiny models and mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import posttrain  # noqa: F401,E402  (before torch: the MKL shim of models/blas.py)
from results_row import append_row, machine, mean_se, provenance, record_args, refuse_smoke_record  # noqa: E402  (bench/results_row.py)

RESULTS = ROOT / "bench" / "results" / "distill_logits_defaults.jsonl"
RECIPE = ROOT / "recipes" / "distill_logits.yaml"
MOPD_RECIPE = ROOT / "recipes" / "distill.yaml"
SETTINGS: dict[str, dict[str, Any]] = {  # name → what it changes in the recipe (topk64 also gets its cache file)
    "default": {}, "topk64": {"teacher": {"topk": 64}}, "T2": {"loss": {"temperature": 2.0}},
    "ce0.5": {"loss": {"ce_weight": 0.5}}, "lr3e-4": {"optim": {"lr": 3e-4}}, "lr3e-5": {"optim": {"lr": 3e-5}}}
FACTORS = {"teacher.topk": ["default", "topk64"], "loss.temperature": ["default", "T2"],
           "loss.ce_weight": ["default", "ce0.5"], "optim.lr": ["default", "lr3e-4", "lr3e-5"]}
COSTLY = {"teacher.topk"}  # the factors whose value changes the compute: there the cheaper of two equals wins
MARGIN = 0.01  # nats/token: a difference below this is not worth changing a default for
COST_MARGIN = 0.10  # a setting is cheaper when it takes at least this fraction fewer wall seconds
ENVS = ("arithmetic", "instruction")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", help="the SFT checkpoint the student is pruned from (required unless --smoke)")
    ap.add_argument("--data", help="SFT conversation JSONL, training split (required unless --smoke)")
    ap.add_argument("--params", type=float, default=1.0e8, help="parameters of the pruned student")
    ap.add_argument("--steps", type=int, default=30, help="distill-logits steps per setting")
    ap.add_argument("--batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="train.seed of every run (data order)")
    ap.add_argument("--heldout", type=int, default=100, help="dev conversations per domain (arithmetic, instruction)")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                    help="which settings to run (default is always run: the others are compared with it)")
    ap.add_argument("--mopd", action="store_true", help="add the on-policy arm (posttrain distill) at equal wall time")
    ap.add_argument("--mopd-lr", type=float, default=1e-5, help="MOPD's LR (recipes/mopd_cpu.yaml's)")
    ap.add_argument("--n-eval", type=int, default=50, help="greedy dev tasks per environment (--mopd)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="per MOPD rollout and per eval reply")
    ap.add_argument("--work", help="student and runs (default runs/bench_distill_defaults; --smoke: a temp dir)")
    ap.add_argument("--smoke", action="store_true", help="tiny-llama and tiny budgets (figures mean nothing)")
    record_args(ap, RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.teacher = args.teacher or "tiny-llama"
        args.params, args.steps, args.batch, args.heldout, args.n_eval = 8.0e4, 2, 4, 8, 4
        args.max_new_tokens = 8
        refuse_smoke_record(ap, args, RESULTS)
    elif not (args.teacher and args.data):
        ap.error("--teacher (the SFT checkpoint to prune) and --data (its training JSONL) are required, or --smoke")
    return args


# --------------------------------------------------------------------------- the pure parts


def trained_tokens(ex: Any, max_len: int = 512) -> int:
    """Assistant tokens of an example that a loss counts: position 0 is never a target."""
    return sum(ex.loss_mask[1:max_len])


def per_row_nll(model: Any, examples: list[Any], pad_id: int, max_len: int = 512) -> list[float]:
    """Token-mean NLL (nats) of each example's assistant tokens, one forward per example (no packing,
    so nothing is shared between rows), no gradient, in the model's dtype (the bench loads fp32)."""
    import torch

    from posttrain.data.packing import trainable_rows
    from posttrain.train.supervised import row_logprobs

    device, was = str(next(model.parameters()).device), model.training
    model.eval()
    out = []
    with torch.no_grad():
        for i, ex in enumerate(examples):
            rows = trainable_rows([ex], max_len, pad_id, pack=False)
            if not rows:
                raise ValueError(f"example {i} has no assistant token within {max_len} tokens: nothing to score")
            lp, mask = row_logprobs(model, rows[0].to_tensors(device))
            out.append(-float(lp[mask].double().mean()))
    model.train(was)
    return out


def token_mean(nll: list[float], tokens: list[int]) -> float:
    """Pooled NLL per token from per-conversation means and token counts (``heldout_nll``'s figure)."""
    return sum(x * n for x, n in zip(nll, tokens)) / sum(tokens)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def paired_diff(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and standard error of a − b, pair by pair (nan se for a single pair)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_diff needs two equal, non-empty lists (got {len(a)} and {len(b)})")
    return mean_se([x - y for x, y in zip(a, b)])


def over_seeds(per_seed: list[list[float]]) -> list[float]:
    """Per conversation (or task), the mean over seeds: the rule pairs conversations, not runs."""
    return [sum(xs) / len(xs) for xs in zip(*per_seed)]


def verdict(alt: list[float], base: list[float]) -> dict[str, Any]:
    """alt against base: better or worse by more than max(2 paired se, MARGIN), else equal."""
    m, se = paired_diff(alt, base)
    margin = max(2 * se if math.isfinite(se) else 0.0, MARGIN)
    return {"minus_default": m, "se": se, "margin": margin,
            "verdict": "better" if m < -margin else "worse" if m > margin else "equal"}


def choose(nll: dict[str, list[float]], default: str, seconds: dict[str, float] | None = None
           ) -> tuple[str, dict[str, dict[str, Any]]]:
    """The module docstring's rule for one factor. ``nll``: per-conversation dev NLL of each value;
    ``seconds``: given only for a factor whose value changes the compute (top-k with a cache)."""
    table = {v: verdict(x, nll[default]) for v, x in nll.items()}
    better = [v for v in nll if table[v]["verdict"] == "better"]
    if better:
        return min(better, key=lambda v: sum(nll[v])), table
    if seconds:
        cheaper = [v for v in nll if table[v]["verdict"] == "equal"
                   and seconds[v] <= (1 - COST_MARGIN) * seconds[default]]
        if cheaper:
            return min(cheaper, key=lambda v: seconds[v]), table
    return default, table


def merged(tree: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with ``patch`` written over it, section by section (neither is changed)."""
    out = dict(tree)
    for k, v in patch.items():
        out[k] = merged(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


# --------------------------------------------------------------------------- runs


def heldout(tok: Any, n: int) -> tuple[list[Any], list[str]]:
    """The dev conversations (arithmetic, then instruction with its reference replies) and each one's domain."""
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.envs.base import make_env
    from posttrain.experiments.stages import RL_INSTRUCTION

    instr = make_env("instruction", **RL_INSTRUCTION).tasks("dev", n, seed=0)
    rows = {"arithmetic": list(arithmetic_rows(n, 0, "dev")),
            "instruction": [{"messages": [*t.messages, {"role": "assistant", "reasoning_content": "",
                                                        "content": t.metadata["reference_response"]}]} for t in instr]}
    examples, domains = [], []
    for dom, rs in rows.items():  # tokenized per domain: a skipped row cannot shift the domain labels
        ex, _ = tokenize_rows(tok, rs, 512)
        examples += ex
        domains += [dom] * len(ex)
    return examples, domains


def prune_student(args: argparse.Namespace, data: str, out: Path) -> Path:
    """The pruned student, cut once; reused when its prune.json names this teacher and calibration file."""
    from posttrain.compress.prune import run_prune
    from posttrain.configs.prune import PruneConfig

    made = out / "prune.json"
    if made.exists():
        rec = json.loads(made.read_text())
        if rec.get("source") == args.teacher and rec.get("calibration", {}).get("path") == data:
            print(f"[bench] reusing the pruned student {out} ({rec['params_after']:,} params)", flush=True)
            return out
        raise SystemExit(f"{out} holds a student pruned from {rec.get('source')} on {rec.get('calibration')}: "
                         "use another --work, or delete it")
    cfg = PruneConfig(model=args.teacher, out=str(out), target={"params": args.params},
                      calibration={"path": data, "samples": 64})
    res = run_prune(cfg)
    print(f"[bench] pruned {args.teacher}: {res.params_before:,} → {res.params_after:,} params", flush=True)
    return out


def logits_config(args: argparse.Namespace, student: Path, data: str, seed: int, setting: str, run_dir: Path) -> Any:
    """recipes/distill_logits.yaml with this bench's student, teacher, data, budget and one setting."""
    from posttrain.configs.base import load_yaml
    from posttrain.configs.prune import DistillLogitsConfig

    patch = SETTINGS[setting]
    if "teacher" in patch:  # top-k: the teacher runs once into a cache, built inside this run
        cache = run_dir / f"teacher_top{patch['teacher']['topk']}.safetensors"
        patch = merged(patch, {"teacher": {"cache": str(cache)}})
    run = {"model": str(student), "run_dir": str(run_dir), "teacher": {"model": args.teacher},
           "data": {"train": [{"path": data, "weight": 1.0}]},
           "train": {"steps": args.steps, "batch_size": args.batch, "seed": seed, "eval_every": 0, "save_every": 0,
                     "keep_last": 1}}
    if args.smoke:
        run = merged(run, {"optim": {"warmup_steps": 0}, "train": {"precision": "fp32"}})
    return DistillLogitsConfig.model_validate(merged(merged(load_yaml(RECIPE.read_text()), run), patch))


def mopd_config(args: argparse.Namespace, student: Path, seed: int, steps: int, run_dir: Path) -> Any:
    """recipes/distill.yaml: this student, the unpruned teacher alone, the bench's two environments."""
    from posttrain.configs.base import load_yaml
    from posttrain.configs.distill import DistillConfig
    from posttrain.experiments.stages import RL_INSTRUCTION

    args_of = {"arithmetic": {}, "instruction": dict(RL_INSTRUCTION)}
    tree = load_yaml(MOPD_RECIPE.read_text())
    tree.update(model=str(student), run_dir=str(run_dir),
                envs=[{"name": e, "args": args_of[e], "train_tasks": 16 if args.smoke else 256, "val_tasks": 0}
                      for e in ENVS],
                teachers={"models": [{"name": "big", "model": args.teacher}], "default": "big"})
    tree = merged(tree, {"optim": {"lr": args.mopd_lr}, "rollout": {"max_new_tokens": args.max_new_tokens},
                         "train": {"steps": steps, "seed": seed, "eval_every": 0, "save_every": 0, "keep_last": 1,
                                   "plot": False}})
    if args.smoke:
        # 8-token replies are all truncated, and the overlong filter would leave no token to train on
        tree = merged(tree, {"rollout": {"prompts_per_step": 2, "group_size": 2, "batch_size": 4},
                             "algo": {"overlong_filter": False}, "train": {"precision": "fp32"}})
    cfg = DistillConfig.model_validate(tree)
    if cfg.optim.warmup_steps or cfg.optim.decay_frac:  # a resume to another step count would change the LR
        raise SystemExit(f"{MOPD_RECIPE.name}: MOPD's LR schedule is not constant; the equal-time split needs it")
    return cfg


def run_mopd(args: argparse.Namespace, student: Path, seed: int, budget_s: float, run_dir: Path) -> dict[str, Any]:
    """MOPD for as many steps as fit in ``budget_s`` wall seconds. The RL loop has no time budget, so
    the run goes in calls: one step, then resumes of the same run (constant LR: the split changes
    nothing) to the step count that the mean step so far and one more call's set-up leave room for,
    until no further step fits (at most 4 calls)."""
    from posttrain.distill.stage import train_distill

    shutil.rmtree(run_dir, ignore_errors=True)
    steps, target, seconds, calls = 0, 1, 0.0, []
    while target > steps and len(calls) < 4:
        cfg = mopd_config(args, student, seed, target, run_dir)
        res = train_distill(cfg, progress=False)
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        step_s = [m["step_s"] for m in lines if "step_s" in m]
        setup = res.seconds - sum(step_s[steps:])  # loading, envs, saving: paid again by every call
        steps, seconds, ckpt = target, seconds + res.seconds, res.checkpoint
        calls.append({"steps": steps, "seconds": res.seconds, "setup_s": setup})
        mean_step = sum(step_s) / len(step_s)
        target = steps + max(0, int((budget_s - seconds - setup) // mean_step))
        if args.smoke and steps == 1:
            target = max(target, 2)  # tiny runs fit no second step: the smoke still walks the resume
    trained = sum(m.get("rollouts_trained", 0) for m in lines)
    sampled = cfg.rollout.prompts_per_step * cfg.rollout.group_size * steps
    gaps = [m["mopd_gap"] for m in lines if "mopd_gap" in m]
    print(f"[bench] MOPD seed {seed}: {steps} steps in {seconds:.0f}s (budget {budget_s:.0f}s, {len(calls)} calls); "
          f"{trained} of {sampled} rollouts trained on, "
          f"{sum(m.get('truncated_frac', 0) for m in lines) / len(lines):.0%} truncated", flush=True)
    return {"checkpoint": str(ckpt), "steps": steps, "seconds": seconds, "budget_s": budget_s, "calls": calls,
            "config": cfg.model_dump(mode="json"),
            "step_s": step_s, "rollouts_trained": trained, "rollouts_sampled": sampled,
            "truncated_frac": [m.get("truncated_frac") for m in lines],
            "updates_skipped": sum(int(m.get("update_skipped", 0)) for m in lines),
            "mopd_gap_first_last": [gaps[0], gaps[-1]] if gaps else None}


def load_fp32(spec: str) -> tuple[Any, Any]:
    import torch

    from posttrain.models.loading import load_model

    loaded = load_model(spec, device="cpu", dtype=torch.float32)
    return loaded.model.eval(), loaded.tokenizer


def rewards(spec: str, args: argparse.Namespace) -> dict[str, float]:
    """Greedy dev reward per task (``<env>/<task id>``) on --n-eval tasks of each environment."""
    from posttrain.engines.hf import HFGenerator
    from posttrain.envs.base import make_env
    from posttrain.eval.evaluate import build_env, evaluate
    from posttrain.experiments.stages import RL_INSTRUCTION

    model, tok = load_fp32(spec)
    gen = HFGenerator(model, tok, batch_size=32)
    out: dict[str, float] = {}
    for env in ENVS:  # instruction with RLVR's constraint counts, as its dev rows and MOPD's tasks
        e = make_env(env, **RL_INSTRUCTION) if env == "instruction" else build_env(env, None)
        res = evaluate(gen, e, split="dev", n_tasks=args.n_eval, max_new_tokens=args.max_new_tokens, seed=0)
        out.update({f"{env}/{t.task_id}": t.samples[0].reward for t in res.tasks})
    return out


# --------------------------------------------------------------------------- main


def main() -> None:
    args = parse()
    tmp = tempfile.TemporaryDirectory(prefix="distill_defaults_") if args.smoke and not args.work else None
    work = Path(tmp.name if tmp else args.work or "runs/bench_distill_defaults")
    try:
        bench(args, work)
    finally:
        if tmp:
            tmp.cleanup()


def smoke_data(work: Path) -> str:
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.experiments.stages import instruction_rows

    path = work / "data" / "train.jsonl"
    write_jsonl([*arithmetic_rows(32, 0, "train"), *instruction_rows(16, 0)], path)
    return str(path)


def bench(args: argparse.Namespace, work: Path) -> None:
    import torch

    from posttrain.compress.distill_logits import train_distill_logits

    torch.manual_seed(0)
    data = smoke_data(work) if args.smoke else str(Path(args.data).resolve())
    load_before, t0 = os.getloadavg()[0], time.time()
    student = prune_student(args, data, work / "student")
    teacher, tok = load_fp32(args.teacher)
    held, domains = heldout(tok, args.heldout)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    tokens = [trained_tokens(ex) for ex in held]
    nll = lambda spec: per_row_nll(load_fp32(spec)[0], held, pad)  # noqa: E731
    scores = {"teacher": per_row_nll(teacher, held, pad), "pruned": nll(str(student))}
    del teacher  # the runs load their own
    settings = ["default", *[s for s in args.settings if s != "default"]]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    for seed in args.seeds:
        for s in settings:
            run_dir = work / f"seed{seed}" / s
            shutil.rmtree(run_dir, ignore_errors=True)  # a run dir with checkpoints would resume, not train
            load = os.getloadavg()[0]
            res = train_distill_logits(logits_config(args, student, data, seed, s, run_dir), progress=False)
            runs[s].append({"seed": seed, "checkpoint": str(res.checkpoint), "seconds": res.seconds,
                            "val_kl_before": res.val_kl_before, "val_kl_after": res.val_kl_after,
                            "tokens_trained": res.tokens_trained, "load": [load, os.getloadavg()[0]],
                            "nll": nll(str(res.checkpoint))})
            print(f"[bench] seed {seed} {s}: {res.seconds:.1f}s, dev NLL {token_mean(runs[s][-1]['nll'], tokens):.4f}",
                  flush=True)
    per_conv = {s: over_seeds([r["nll"] for r in rs]) for s, rs in runs.items()}
    seconds = {s: sum(r["seconds"] for r in rs) / len(rs) for s, rs in runs.items()}
    picks = {f: choose({v: per_conv[v] for v in vals if v in runs}, "default", seconds if f in COSTLY else None)
             for f, vals in FACTORS.items() if len([v for v in vals if v in runs]) > 1}
    mopd = compare_mopd(args, student, runs["default"], held, pad, tokens, work) if args.mopd else None
    minutes = (time.time() - t0) / 60
    report(args, scores, per_conv, seconds, picks, mopd, tokens, domains)
    if not args.no_record:
        append_row(Path(args.results), {
            "bench": "distill_logits_defaults", "args": vars(args), "minutes": round(minutes, 1),
            "student": json.loads((student / "prune.json").read_text()), "tokens": tokens, "domains": domains,
            "scores": scores, "runs": runs, "seconds": seconds,
            "picks": {f: {"chosen": c, "table": t} for f, (c, t) in picks.items()}, "mopd": mopd,
            **provenance("dev", machine(load_before, os.getloadavg()[0]))})
    finale(args, scores, per_conv, picks, mopd, tokens)


def compare_mopd(args: argparse.Namespace, student: Path, default_runs: list[dict[str, Any]], held: list[Any],
                 pad: int, tokens: list[int], work: Path) -> dict[str, Any]:
    """MOPD per seed at the default run's wall seconds; dev NLL and greedy dev reward of both arms."""
    arms: dict[str, list[dict[str, Any]]] = {"distill_logits": [], "mopd": []}
    for r in default_runs:
        m = run_mopd(args, student, r["seed"], r["seconds"], work / f"seed{r['seed']}" / "mopd")
        m["nll"] = per_row_nll(load_fp32(m["checkpoint"])[0], held, pad)
        arms["mopd"].append(m)
        arms["distill_logits"].append({"seed": r["seed"], "checkpoint": r["checkpoint"], "seconds": r["seconds"],
                                       "nll": r["nll"]})
    for runs in arms.values():
        for x in runs:
            x["rewards"] = rewards(x["checkpoint"], args)
    ref = {"teacher": rewards(args.teacher, args), "pruned": rewards(str(student), args)}
    ids = sorted(ref["teacher"])
    acc = {a: over_seeds([[x["rewards"][i] for i in ids] for x in runs]) for a, runs in arms.items()}
    acc.update({k: [v[i] for i in ids] for k, v in ref.items()})
    nll = {a: over_seeds([x["nll"] for x in runs]) for a, runs in arms.items()}
    by_env = {e: [j for j, i in enumerate(ids) if i.startswith(f"{e}/")] for e in ENVS}
    return {"arms": arms, "task_ids": ids, "reward": acc, "nll": nll,
            "nll_mopd_minus_logits": paired_diff(nll["mopd"], nll["distill_logits"]),
            "reward_mopd_minus_logits": {
                "pooled": paired_diff(acc["mopd"], acc["distill_logits"]),
                **{e: paired_diff([acc["mopd"][j] for j in js], [acc["distill_logits"][j] for j in js])
                   for e, js in by_env.items()}}}


# --------------------------------------------------------------------------- output


def report(args: argparse.Namespace, scores: dict[str, list[float]], per_conv: dict[str, list[float]],
           seconds: dict[str, float], picks: dict[str, Any], mopd: dict[str, Any] | None, tokens: list[int],
           domains: list[str]) -> None:
    """The settings' table, the rule's picks and (``--mopd``) the equal-time table, in markdown."""
    dev = (f"{len(tokens)} dev conversations ({domains.count('arithmetic')} arithmetic, "
           f"{domains.count('instruction')} instruction)")
    print(f"\ndev NLL (nats per assistant token) after {args.steps} steps × {args.batch}, seeds {args.seeds}, {dev}")
    print("| model | dev NLL (tokens) | mean over conversations | − default ± paired se | wall s | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for name, x in scores.items():
        print(f"| {name} | {token_mean(x, tokens):.4f} | {sum(x) / len(x):.4f} | | | |")
    verdicts = {v: t[v] for _, (_, t) in picks.items() for v in t}
    for s, x in per_conv.items():
        v = verdicts[s]
        diff = "—" if s == "default" else f"{v['minus_default']:+.4f} ± {v['se']:.4f}"
        print(f"| {s} | {token_mean(x, tokens):.4f} | {sum(x) / len(x):.4f} | {diff} | {seconds[s]:.1f} | "
              f"{'' if s == 'default' else v['verdict']} |")
    print("\nby the rule: " + "; ".join(f"{f}: {c}" for f, (c, _) in picks.items()))
    if mopd is None:
        return
    print(f"\nequal wall time, seeds {args.seeds}: dev NLL, greedy dev reward on {args.n_eval} tasks per environment")
    print(f"| arm | steps | wall s | dev NLL | {' | '.join(f'{e} reward' for e in ENVS)} | pooled reward |")
    print("|---|---:|---:|---:|" + "---:|" * (len(ENVS) + 1))
    ids = mopd["task_ids"]
    for arm, acc in mopd["reward"].items():
        runs_ = mopd["arms"].get(arm)
        steps = "/".join(str(x.get("steps", args.steps)) for x in runs_) if runs_ else "—"
        secs = "/".join(f"{x['seconds']:.0f}" for x in runs_) if runs_ else "—"
        nll = token_mean(mopd["nll"][arm], tokens) if arm in mopd["nll"] else token_mean(scores[arm], tokens)
        env = [mean([a for a, i in zip(acc, ids) if i.startswith(f"{e}/")]) for e in ENVS]
        print(f"| {arm} | {steps} | {secs} | {nll:.4f} | " + " | ".join(f"{100 * x:.1f}%" for x in env)
              + f" | {100 * sum(acc) / len(acc):.1f}% |")
    d, m = mopd["reward_mopd_minus_logits"], mopd["arms"]["mopd"]
    print(f"MOPD trained on {sum(x['rollouts_trained'] for x in m)} of {sum(x['rollouts_sampled'] for x in m)} "
          "sampled rollouts (with algo.overlong_filter on, truncated ones would be dropped whole)")
    print("MOPD − distill-logits: dev NLL {:+.4f} ± {:.4f}; reward ".format(*mopd["nll_mopd_minus_logits"])
          + ", ".join(f"{k} {100 * m:+.1f} ± {100 * se:.1f} pts" for k, (m, se) in d.items()))


def finale(args: argparse.Namespace, scores: dict[str, list[float]], per_conv: dict[str, list[float]],
           picks: dict[str, Any], mopd: dict[str, Any] | None, tokens: list[int]) -> None:
    said = "; ".join(f"{f} {c}" for f, (c, _) in picks.items())
    tail = ""
    if mopd is not None:
        a, (dm, dse) = mopd["arms"]["mopd"], mopd["reward_mopd_minus_logits"]["pooled"]
        tail = (f"; MOPD at equal wall time ({'/'.join(str(x['steps']) for x in a)} steps): dev NLL "
                f"{token_mean(mopd['nll']['mopd'], tokens):.3f}, greedy dev reward MOPD − distill-logits "
                f"{100 * dm:+.1f} ± {100 * dse:.1f} pts")
    print(f"RESULT distill_logits_defaults: {token_mean(per_conv['default'], tokens):.3f} nats/token (dev NLL of "
          f"{args.teacher} pruned to {args.params:.3g} params after {args.steps} distill-logits steps of {args.batch} "
          f"at the recipe's defaults, seeds {args.seeds}; by the rule: {said}; pruned "
          f"{token_mean(scores['pruned'], tokens):.3f}, teacher {token_mean(scores['teacher'], tokens):.3f}{tail}"
          f"{'; SMOKE: random tiny model, not a figure' if args.smoke else ''})")


if __name__ == "__main__":
    main()

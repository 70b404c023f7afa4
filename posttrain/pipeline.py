"""The main job: ``posttrain pipeline`` runs the recipe end to end on the embedded model.

Stages so far (each later issue adds its stage here):

1. **data**   — a generated arithmetic SFT set (column-by-column reasoning + ``Answer: N``), and
                held-out problems that are disjoint from it by construction (data/synthetic.py);
2. **before** — the untouched model: held-out SFT loss and greedy answer accuracy, graded by the
                math environment's verifier, split by operand size;
3. **sft**    — supervised fine-tuning (train/sft.py) on the generated set;
4. **after**  — the same measurements on the fine-tuned checkpoint;
5. **report** — a table on stdout, ``report.json`` and ``report.png`` in the run directory;
6. **curation** (``--curation``) — generate-then-filter from the model itself with the math verifier,
                then SFT on the curated rows vs SFT on the same number of unfiltered samples
                (data/curation_experiment.py), and the held-out accuracy of both.

Every stage writes its result to ``<run_dir>/stages/<name>.json``; a re-run skips finished stages
and the SFT stage resumes from its last checkpoint, so an interrupted pipeline picks up where it
stopped. ``--fresh`` starts over.

Sizes: the default finishes in about 10–15 minutes on 2 CPU cores; ``--quick`` in under 3.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from posttrain.config import StrictModel


class PipelineConfig(StrictModel):
    model: str = "embedded"
    run_dir: str = "runs/pipeline"
    seed: int = 0
    n_train: int = Field(2000, ge=8)
    """Generated SFT conversations."""
    n_eval: int = Field(80, ge=4)
    """Held-out problems for answer accuracy (greedy)."""
    n_val_rows: int = Field(64, ge=4)
    """Held-out conversations for the SFT loss."""
    max_digits: int = Field(2, ge=1, le=3)
    sft_steps: int = Field(40, ge=1)
    sft_batch_size: int = Field(16, ge=1)
    sft_lr: float = Field(1e-4, gt=0)
    max_new_tokens: int = Field(80, ge=8)
    eval_batch_size: int = Field(32, ge=1)
    curation: bool = False
    """Add the curation stage: rejection sampling from the model itself with the math verifier, then
    SFT on the curated rows vs on as many unfiltered samples (data/curation_experiment.py; ~12 min)."""


QUICK = {"n_train": 400, "n_eval": 48, "n_val_rows": 24, "sft_steps": 10, "sft_batch_size": 8,
         "sft_lr": 2e-4, "max_new_tokens": 72, "run_dir": "runs/pipeline-quick"}


# --------------------------------------------------------------------------- stages


def _stage(run_dir: Path, name: str, fn: Any) -> dict[str, Any]:
    """Run ``fn`` once; its JSON result is cached so a re-run skips finished stages."""
    path = run_dir / "stages" / f"{name}.json"
    if path.exists():
        print(f"[pipeline] {name}: done earlier, reusing {path}")
        return json.loads(path.read_text())
    t = time.time()
    out = fn()
    out["seconds"] = round(time.time() - t, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


def make_data(cfg: PipelineConfig, run_dir: Path) -> dict[str, Any]:
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows

    train = run_dir / "data" / "train.jsonl"
    val = run_dir / "data" / "validation.jsonl"
    n_train = write_jsonl(arithmetic_rows(cfg.n_train, cfg.seed, "train", max_digits=cfg.max_digits), train)
    n_val = write_jsonl(arithmetic_rows(cfg.n_val_rows, cfg.seed + 1, "validation", max_digits=cfg.max_digits), val)
    return {"train": str(train), "validation": str(val), "n_train": n_train, "n_validation": n_val}


def measure(cfg: PipelineConfig, model_spec: str, data: dict[str, Any]) -> dict[str, Any]:
    """Held-out SFT loss and greedy answer accuracy of one model."""
    from posttrain.data.conversations import read_conversations
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.envs.base import make_env
    from posttrain.models.loading import load_model
    from posttrain.rollout.base import SamplingParams
    from posttrain.rollout.hf import HFGenerator
    from posttrain.train.precision import autocast
    from posttrain.train.sft import heldout_loss, is_hybrid, tokenize_rows

    loaded = load_model(model_spec)
    rows, _ = read_conversations(data["validation"])
    val = heldout_loss(loaded.model, tokenize_rows(loaded.tokenizer, rows), 1024, not is_hybrid(loaded.model),
                       loaded.tokenizer.pad_token_id or 0, lambda: autocast("fp32", loaded.device))

    tasks = arithmetic_tasks(cfg.n_eval, cfg.seed + 2, "validation", max_digits=cfg.max_digits)
    gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=cfg.eval_batch_size)
    comps = gen.generate([t.messages for t in tasks], SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0))
    env = make_env("math")
    by_digits: dict[int, list[float]] = {}
    formatted, samples = 0, []
    for t, c in zip(tasks, comps):
        res = env.verify(t, [{"role": "assistant", "content": c[0].text}])
        by_digits.setdefault(t.metadata["digits"], []).append(res.reward)
        formatted += int(res.components.get("format", 0) > 0)
        if len(samples) < 3:
            samples.append({"prompt": t.messages[-1]["content"], "reply": c[0].text, "reward": res.reward})
    rewards = [r for v in by_digits.values() for r in v]
    return {
        "model": model_spec,
        "heldout_loss": val.loss,
        "accuracy": sum(rewards) / len(rewards),
        "accuracy_by_digits": {str(d): sum(v) / len(v) for d, v in sorted(by_digits.items())},
        "answer_format_rate": formatted / len(tasks),
        "mean_reply_tokens": sum(len(c[0].token_ids) for c in comps) / len(comps),
        "n_eval": len(tasks),
        "samples": samples,
    }


def run_sft(cfg: PipelineConfig, run_dir: Path, data: dict[str, Any]) -> dict[str, Any]:
    from posttrain.config import load_config
    from posttrain.train.sft import SFTConfig, train_sft

    sft_cfg = load_config(SFTConfig, None, [
        f"model={cfg.model}", f"run_dir={run_dir / 'sft'}", f"train.steps={cfg.sft_steps}",
        f"train.batch_size={cfg.sft_batch_size}", f"optim.lr={cfg.sft_lr}", f"train.seed={cfg.seed}",
        f"optim.warmup_steps={max(1, cfg.sft_steps // 10)}", "optim.decay_frac=0.3",
        f"train.save_every={max(5, cfg.sft_steps // 4)}", "data.max_seq_len=512",
        f"data.train=[{{path: {data['train']}}}]", f"data.validation=[{data['validation']}]",
    ])
    res = train_sft(sft_cfg)
    return {"checkpoint": str(res.checkpoint), "steps": res.steps, "tokens_trained": res.tokens_trained,
            "val_loss_before": res.val_loss_before, "val_loss_after": res.val_loss_after}


# --------------------------------------------------------------------------- report


def report(run_dir: Path, before: dict[str, Any], after: dict[str, Any], sft: dict[str, Any], total_s: float) -> str:
    digits = sorted(set(before["accuracy_by_digits"]) | set(after["accuracy_by_digits"]), key=int)
    lines = [
        "",
        "posttrain pipeline — what it achieved",
        f"  model: {before['model']}  →  {after['model']}",
        f"  SFT: {sft['steps']} steps, {sft['tokens_trained']} trained tokens",
        "",
        f"  {'metric':34s} {'before':>9s} {'after':>9s}",
        f"  {'held-out SFT loss':34s} {before['heldout_loss']:9.3f} {after['heldout_loss']:9.3f}",
        f"  {'answer accuracy (greedy)':34s} {before['accuracy']:9.1%} {after['accuracy']:9.1%}",
    ]
    for d in digits:
        b, a = before["accuracy_by_digits"].get(d, float("nan")), after["accuracy_by_digits"].get(d, float("nan"))
        lines.append(f"  {'  ' + d + '-digit operands':34s} {b:9.1%} {a:9.1%}")
    lines += [
        f"  {'uses the answer format':34s} {before['answer_format_rate']:9.1%} {after['answer_format_rate']:9.1%}",
        f"  {'mean reply tokens':34s} {before['mean_reply_tokens']:9.1f} {after['mean_reply_tokens']:9.1f}",
        "",
        f"  {before['n_eval']} held-out problems; total time {total_s / 60:.1f} min; details in {run_dir}/report.json",
    ]
    text = "\n".join(lines)
    (run_dir / "report.json").write_text(json.dumps({"before": before, "after": after, "sft": sft, "seconds": total_s}, indent=2))
    _plot(run_dir, before, after, digits)
    return text


def _plot(run_dir: Path, before: dict[str, Any], after: dict[str, Any], digits: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posttrain.train.metrics import read_metrics

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = ["all"] + [f"{d}-digit" for d in digits]
    b = [before["accuracy"]] + [before["accuracy_by_digits"].get(d, 0) for d in digits]
    a = [after["accuracy"]] + [after["accuracy_by_digits"].get(d, 0) for d in digits]
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], b, 0.4, label="before")
    ax1.bar([x + 0.2 for x in xs], a, 0.4, label="after SFT")
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylim(0, 1)
    ax1.set_title("held-out answer accuracy")
    ax1.legend()
    rows = read_metrics(run_dir / "sft")
    tr = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    va = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if tr:
        ax2.plot(*zip(*tr), label="train")
    if va:
        ax2.plot(*zip(*va), "o-", label="held-out")
    ax2.set_xlabel("step")
    ax2.set_title("SFT loss")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "report.png", dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sizes: finishes in under 3 minutes on 2 cores")
    p.add_argument("--config", "-c", help="YAML with PipelineConfig fields (see recipes/pipeline.yaml)")
    p.add_argument("--fresh", action="store_true", help="delete the run directory first instead of resuming")
    p.add_argument("--curation", action="store_true",
                   help="also run the curation stage: curated vs unfiltered self-generated SFT data (~12 min more)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. sft_steps=30 n_eval=200")


def run(args: argparse.Namespace) -> int:
    from posttrain.config import load_config

    overrides = ([f"{k}={v}" for k, v in QUICK.items()] if args.quick else []) + list(args.overrides)
    if args.curation:
        overrides.append("curation=true")
    cfg = load_config(PipelineConfig, args.config, overrides)
    run_dir = Path(cfg.run_dir)
    if args.fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    print(f"[pipeline] run directory: {run_dir} (re-run the same command to resume)")
    data = _stage(run_dir, "data", lambda: make_data(cfg, run_dir))
    before = _stage(run_dir, "before", lambda: measure(cfg, cfg.model, data))
    print(f"[pipeline] before: accuracy {before['accuracy']:.1%}, held-out loss {before['heldout_loss']:.3f}")
    sft = _stage(run_dir, "sft", lambda: run_sft(cfg, run_dir, data))
    after = _stage(run_dir, "after", lambda: measure(cfg, sft["checkpoint"], data))
    print(report(run_dir, before, after, sft, time.time() - t0))
    if cfg.curation:
        from posttrain.data.curation_experiment import compare, curation_stage

        cur_dir = run_dir / "curation"
        cur = _stage(run_dir, "curation", lambda: curation_stage(
            cfg.model, cur_dir, 160, 4, 2, 0.9, 64, cfg.seed, max_digits=cfg.max_digits))
        if not cur["rows_curated"]:
            print(f"\ncuration: none of {cur['candidates_logged']} candidates passed the verifier and filters; "
                  f"nothing to fine-tune on (drop counts in {cur['paths']['summary']})")
            return 0
        cmp = compare(cfg.model, cur_dir, cur, 12, 8, 2e-4, cfg.n_eval, cfg.seed, max_digits=cfg.max_digits,
                      max_new_tokens=cfg.max_new_tokens)  # caches its own stages under curation/stages
        print(f"\ncuration: {cur['candidates_logged']} self-generated candidates → {cur['rows_curated']} curated rows; "
              f"SFT on them vs on {cur['rows_unfiltered']} unfiltered samples (same steps):")
        for name in ("base", "unfiltered", "curated"):
            print(f"  {name:12s} held-out accuracy {cmp[name]['accuracy']:6.1%}")
    return 0

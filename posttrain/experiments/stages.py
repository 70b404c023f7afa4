"""Stages the experiments share: cached stage results, the arithmetic data, measuring a model,
an SFT run with the pipeline's settings."""

from __future__ import annotations

import json
import os
import random
import resource
import time
from pathlib import Path
from typing import Any

from posttrain.configs.pipeline import PipelineConfig

RL_INSTRUCTION: dict[str, Any] = {"min_constraints": 1, "max_constraints": 2}
"""The instruction domain's constraint counts, for its SFT rows and its RL environment alike."""

RUNNING: list[str] = []
"""Names of the stages running now, outermost first; a Ctrl-C leaves them here so the caller can
say where it stopped."""


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads), plus that of every
    ``vllm serve`` it started (``rollout.engine: vllm-server``): a stage's CPU time is then what its
    sampling cost, wherever it ran, and the same-time control is given all of it."""
    from posttrain.engines.vllm_server import server_cpu_seconds

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + server_cpu_seconds()


def cached_stage(run_dir: Path, name: str, fn: Any) -> dict[str, Any]:
    """Run ``fn`` once; its JSON result is cached so a re-run skips finished stages. The result also
    records the stage's wall ``seconds``, its ``cpu_seconds`` and the 1-minute load average at its
    start and end (the CPU may be shared: wall time alone says little)."""
    path = run_dir / "stages" / f"{name}.json"
    if path.exists():
        print(f"[pipeline] {name}: done earlier, reusing {path}")
        return json.loads(path.read_text())
    RUNNING.append(name)
    t, cpu, load = time.time(), cpu_seconds(), os.getloadavg()[0]
    out = fn()
    out["seconds"] = round(time.time() - t, 3)  # ms: a tiny model's stage can take under 0.05 s
    out["cpu_seconds"] = round(cpu_seconds() - cpu, 3)
    out["load_avg"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    release_checkpoints(out)
    RUNNING.pop()
    return out


def release_checkpoints(result: dict[str, Any]) -> None:
    """Free what a finished training stage no longer needs: its checkpoints other than the one it
    reports, and that one's optimizer state. The stage is cached by its JSON and never resumes, so
    they only fill the disk: the embedded model's checkpoint is 1.6 GB, of which 1.1 GB is optimizer
    state, and an evidence run with three controls kept ten of them a seed (16 GB); three seeds side by
    side filled this machine's disk mid-run. The reported checkpoint's weights stay, loadable in
    transformers as they are. ``result["checkpoint"]`` that is no training run's checkpoint (a model
    spec such as ``embedded``) is left alone."""
    import shutil

    from posttrain.train.checkpoint import STATE_FILE

    ckpt = result.get("checkpoint")
    if not isinstance(ckpt, str) or Path(ckpt).parent.name != "checkpoints" or not Path(ckpt).is_dir():
        return
    kept = Path(ckpt)
    for step in kept.parent.glob("step_*"):
        if step.is_dir() and step.name != kept.name:
            shutil.rmtree(step, ignore_errors=True)
    (kept / STATE_FILE).unlink(missing_ok=True)


def make_data(cfg: PipelineConfig, run_dir: Path) -> dict[str, Any]:
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows

    train = run_dir / "data" / "train.jsonl"
    val = run_dir / "data" / "validation.jsonl"
    rows = list(arithmetic_rows(cfg.n_train, cfg.seed, "train", max_digits=cfg.max_digits))
    extra = instruction_rows(cfg.sft_instruction_rows, cfg.seed) if cfg.sft_instruction_rows else []
    if extra:  # interleaved by a seeded shuffle, so any prefix of the file has both domains
        rows += extra
        random.Random(cfg.seed).shuffle(rows)
    n_train = write_jsonl(rows, train)
    n_val = write_jsonl(arithmetic_rows(cfg.n_val_rows, cfg.seed + 1, "dev", max_digits=cfg.max_digits), val)
    return {"train": str(train), "validation": str(val), "n_train": n_train, "n_validation": n_val,
            "n_instruction": len(extra)}


def instruction_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` SFT conversations from the instruction environment's train split, with the RLVR stage's
    constraint counts (``RL_INSTRUCTION``): the task's prompt and its scripted reference reply, which
    the task generator only keeps when it passes every constraint. The reasoning is empty: the reply
    needs no worked steps, and the chat template renders it as an empty think block. The task seed
    is offset from the RLVR stage's (``seed``) so the SFT rows are not its first training prompts."""
    from posttrain.envs.base import make_env

    env = make_env("instruction", **RL_INSTRUCTION)
    return [{"messages": [*t.messages, {"role": "assistant", "reasoning_content": "",
                                        "content": t.metadata["reference_response"]}],
             "source": "instruction/writer", "task_id": t.id}
            for t in env.tasks("train", n, seed=seed + 7)]


def eval_dtype(cfg: PipelineConfig) -> str:
    """The precision of the RL-vs-control test table's greedy decoding (``eval_precision``; ``auto``
    decides by the machine probe, as sampling does). The headline measurement stays fp32 (``measure``)."""
    from posttrain.models.precision import resolve

    return "fp32" if cfg.eval_precision == "fp32" else resolve("auto", "sampling").precision


def measure(cfg: PipelineConfig, model_spec: str, data: dict[str, Any], sampled: bool = False) -> dict[str, Any]:
    """Held-out SFT loss and greedy answer accuracy of one model; with ``sampled`` (and
    ``cfg.eval_samples`` > 0) also its sampled accuracy: ``eval_samples`` answers per problem at the
    RLVR stage's temperature, sampled as its rollouts are (``rollout.engine`` defaults), each
    problem scored by the fraction that is right."""
    from posttrain.data.conversations import read_conversations
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.envs.base import make_env
    from posttrain.models.loading import load_model
    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.train.autocast import autocast
    from posttrain.models.facts import is_hybrid
    from posttrain.data.examples import tokenize_rows
    from posttrain.train.sft import heldout_loss

    loaded = load_model(model_spec)
    rows, _ = read_conversations(data["validation"])
    val = heldout_loss(loaded.model, tokenize_rows(loaded.tokenizer, rows)[0], 1024, not is_hybrid(loaded.model),
                       loaded.tokenizer.pad_token_id or 0, lambda: autocast("fp32", loaded.device))

    tasks = arithmetic_tasks(cfg.n_eval, cfg.seed + 2, "test", max_digits=cfg.max_digits)
    # always fp32: in bf16 the base model's long replies drift (64 of 96 differ) and its accuracy read
    # 5.2 points lower (bench/results/eval_precision.jsonl#L1), which would inflate the SFT gain
    gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=cfg.eval_batch_size)
    comps = gen.generate([t.messages for t in tasks], SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0))
    env = make_env("math")
    by_digits: dict[int, list[float]] = {}
    formatted, samples, per_task = 0, [], []
    for t, c in zip(tasks, comps):
        res = env.verify(t, [{"role": "assistant", "content": c[0].text}])
        by_digits.setdefault(t.metadata["digits"], []).append(res.reward)
        fmt = int(res.components.get("format", 0) > 0)
        formatted += fmt
        per_task.append({"id": t.id, "correct": res.reward, "format": fmt})
        if len(samples) < 3:
            samples.append({"prompt": t.messages[-1]["content"], "reply": c[0].text, "reward": res.reward})
    rewards = [r for v in by_digits.values() for r in v]
    extra: dict[str, Any] = {}
    if sampled and cfg.eval_samples:
        from posttrain.engines.registry import make_engine

        k, sampler = cfg.eval_samples, make_engine({"type": "hf"}, loaded.model, loaded.tokenizer, batch_size=64)
        outs = sampler.generate([t.messages for t in tasks], SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.rl_temperature, n=k, seed=cfg.seed + 3))
        for row, t, c in zip(per_task, tasks, outs):
            row["sampled"] = sum(env.verify(t, [{"role": "assistant", "content": x.text}]).reward for x in c) / k
        extra = {"sampled_accuracy": sum(r["sampled"] for r in per_task) / len(per_task), "sampled_k": k,
                 "sampled_temperature": cfg.rl_temperature, "sampling_precision": sampler.precision}
    return {
        "model": model_spec,
        "heldout_loss": val.loss,
        "accuracy": sum(rewards) / len(rewards),
        "accuracy_by_digits": {str(d): sum(v) / len(v) for d, v in sorted(by_digits.items())},
        "answer_format_rate": formatted / len(tasks),
        "mean_reply_tokens": sum(len(c[0].token_ids) for c in comps) / len(comps),
        "n_eval": len(tasks),
        "eval_precision": gen.precision,
        "samples": samples,
        "per_task": per_task,  # paired comparisons between models (same tasks, same order)
        **extra,
    }


def run_sft(cfg: PipelineConfig, run_dir: Path, data: dict[str, Any], model: str | None = None,
            steps: int | None = None, name: str = "sft", seed: int | None = None, batch_size: int | None = None,
            lr: float | None = None, constant: bool = False, precision: str = "auto",
            freeze_layers: int | None = None) -> dict[str, Any]:
    """SFT on the generated set (WSD schedule: 10% warmup, 30% decay; ``constant``: neither, and no
    weight decay). The keywords default to the pipeline's SFT stage; the longer-SFT arm continues from
    its checkpoint, the anchor-alone control trains as the RLVR stage's anchor does."""
    from posttrain.configs import load_config
    from posttrain.configs.sft import SFTConfig
    from posttrain.train.sft import train_sft

    steps = steps or cfg.sft_steps
    schedule = (["optim.warmup_steps=0", "optim.decay_frac=0", "optim.weight_decay=0"] if constant
                else [f"optim.warmup_steps={max(1, steps // 10)}", "optim.decay_frac=0.3"])
    sft_cfg = load_config(SFTConfig, None, [
        f"model={model or cfg.model}", f"run_dir={run_dir / name}", f"train.steps={steps}",
        f"train.batch_size={batch_size or cfg.sft_batch_size}", f"optim.lr={lr or cfg.sft_lr}",
        f"train.seed={cfg.seed if seed is None else seed}", f"train.precision={precision}", *schedule,
        # a checkpoint (weights + optimizer, ~0.9 GB) costs 2-3 s: at least 12 steps apart (--quick's 24: 2 saves, not 4)
        f"train.save_every={max(12, steps // 4)}", "data.max_seq_len=512",
        f"train.freeze_layers={cfg.sft_freeze_layers if freeze_layers is None else freeze_layers}",
        f"data.train=[{{path: {data['train']}}}]", f"data.validation=[{data['validation']}]",
    ])
    res = train_sft(sft_cfg)
    return {"checkpoint": str(res.checkpoint), "run_dir": str(run_dir / name), "model": model or cfg.model,
            # steps_run: what this invocation ran (a resumed stage's clock holds only these)
            "steps": res.steps, "steps_run": res.steps - res.start_step, "tokens_trained": res.tokens_trained, "val_loss_before": res.val_loss_before, "val_loss_after": res.val_loss_after}

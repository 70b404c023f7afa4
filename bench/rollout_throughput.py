"""Rollout decode throughput against the machine's memory-bandwidth limit, at batch 1, 8 and 32.

    python bench/rollout_throughput.py [--batches 1,8,32] [--new-tokens 48] [--threads 1] [--rounds 2]

Decoding one token per row reads every weight once and each row's KV cache once, whatever the
batch, so a decode step cannot beat ``bytes_read / bandwidth`` seconds. The bench

1. measures the memory bandwidth (best of a few ``x.sum()`` over a 512 MiB fp32 tensor: a pure
   streaming read, the access pattern of reading weights; a copy's read+write rate is printed too);
2. computes bytes read per decode step at batch B: the weights (each parameter once; the tied
   embedding is read once, as the LM head) + K and V of every layer for B rows at the mean context
   length of the measured decode; limit tokens/s = B / (bytes / bandwidth);
3. also prints the compute limit (2 FLOP per weight per token at the measured matmul peak), because
   at batch 32 a 135M model on this CPU is compute-bound, not bandwidth-bound: the honest ceiling
   there is the smaller of the two (the roofline);
4. runs ``HFGenerator`` with stop tokens disabled (every row decodes exactly ``--new-tokens``, so
   the batch stays at B) and times decode alone: (time of a full generation − time of a 1-token
   generation, i.e. the prefill) / decoded tokens.

Levers measured, each at every batch, interleaved round by round: the static-cache decode loop
(``engines/static_llama.py``, the default for Llama modules) against the ``DynamicCache`` loop it
replaced (``bf16-dyn``, bf16 weights); fp32 sampling weights and bf16 sampling weights (an fp32 policy's bf16 copy; ``rollout.engine.dtype: auto``, the default, picks it
where the precision probe says bf16 is faster); the bf16 row reports the log-prob error against fp32 on the fp32 engine's own samples
(teacher-forced). Also profiled once at the largest batch in bf16: ms a step in the matmuls, in
attention, in other ops and outside ops. And timed once: the share of a decode step spent in the
sampler (``sample_next`` over the logits), which bounds what a fused sampler could win. Threads
are measured by bench/threads.py.

Ends with ``RESULT rollout_throughput: <fraction> of the roofline (...)`` for the default engine
at the largest batch (which limit binds, the fraction of the bandwidth limit, the old loop's fraction), and appends one JSON row to bench/results/rollout_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "rollout_throughput.jsonl"
ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["the sea", "autumn", "paperclips", "plants", "languages", "Australia", "Cinderella", "the sky"]


def bandwidth_gbs(mib: int = 512, repeats: int = 5) -> tuple[float, float]:
    """(read GB/s from x.sum(), read+write GB/s from y.copy_(x)), best of ``repeats``."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    y = torch.empty_like(x)
    x.sum(), y.copy_(x)  # fault the pages in
    read = copy = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        read = max(read, x.numel() * 4 / (time.perf_counter() - t))
        t = time.perf_counter()
        y.copy_(x)
        copy = max(copy, 2 * x.numel() * 4 / (time.perf_counter() - t))
    return read / 1e9, copy / 1e9


def model_bytes(model: Any, dtype_bytes: int) -> tuple[int, int]:
    """(weight bytes read per decode step, KV bytes per row per context token)."""
    c = model.config
    n = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * dtype_bytes
    return n * dtype_bytes, kv


def prompts_for(batch: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Tell me fact number {i} about {TOPICS[i % len(TOPICS)]}."}]
            for i in range(batch)]


def timed_generate(gen: Any, prompts: list, new_tokens: int, seed: int) -> tuple[float, Any]:
    from posttrain.engines.base import SamplingParams

    t = time.perf_counter()
    out = gen.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed))
    return time.perf_counter() - t, out


def logprob_error(bf16_model: Any, comps: list, pad_id: int) -> float:
    """Mean |log-prob under the bf16 copy − the fp32 sampler's log-prob| over the fp32 samples."""
    import torch

    errs = []
    with torch.inference_mode():
        for c in comps:
            ids = torch.tensor([c[0].prompt_ids + c[0].token_ids])
            logits = bf16_model(input_ids=ids).logits[0, len(c[0].prompt_ids) - 1:-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c[0].token_ids)[:, None])[:, 0]
            errs.append((lp - torch.tensor(c[0].logprobs)).abs())
    return float(torch.cat(errs).mean())


def sampler_share(gen: Any, batch: int, new_tokens: int) -> float:
    """Fraction of one decode step's time spent in ``sample_next`` (the rest is the model)."""
    from posttrain.engines import hf

    spent = [0.0]
    orig = hf.sample_next

    def timed(*a: Any) -> Any:
        t = time.perf_counter()
        out = orig(*a)
        spent[0] += time.perf_counter() - t
        return out

    hf.sample_next = timed
    try:
        dt, _ = timed_generate(gen, prompts_for(batch), new_tokens, seed=99)
    finally:
        hf.sample_next = orig
    return spent[0] / dt


def step_profile(gen: Any, batch: int, new_tokens: int) -> dict[str, float]:
    """Where a decode step's time goes, by torch profiler self time in ms per step: the matmuls of
    the layers and LM head, attention's batched matmuls and softmax, the other ops, and the rest of
    the wall time (Python, waits). A full generation minus a 1-token one (the prefill), as above."""
    from torch.profiler import profile

    buckets = {"matmuls": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm"),
               "attention": ("aten::bmm", "aten::baddbmm", "aten::_softmax",
                             "aten::_scaled_dot_product_flash_attention_for_cpu")}

    def one(tokens: int) -> dict[str, float]:
        with profile() as prof:
            t = time.perf_counter()
            timed_generate(gen, prompts_for(batch), tokens, seed=98)
            wall = (time.perf_counter() - t) * 1e3
        out = {k: 0.0 for k in (*buckets, "other ops")}
        for e in prof.key_averages():
            out[next((k for k, ops in buckets.items() if e.key in ops), "other ops")] += e.self_cpu_time_total / 1e3
        out["python and waits"] = wall - sum(out.values())
        out["wall (profiled)"] = wall
        return out

    full, prefill = one(new_tokens), one(1)
    return {k: (full[k] - prefill[k]) / (new_tokens - 1) for k in full}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (mean ± standard error)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (bench/threads.py: 1 is the shared-machine default)")
    ap.add_argument("--no-save", action="store_true", help="print only, do not append to the results file")
    ap.add_argument("--vllm-server", action="store_true",
                    help="also the vllm-server engine (bf16 weights; vllm serve from .venv-vllm computes on one core)")
    args = ap.parse_args()

    import posttrain  # noqa: F401  (before torch: models/blas.py's MKL shim, which the fp32 rows use)
    import torch

    from posttrain.engines.hf import HFGenerator
    from posttrain.models.loading import load_model
    from posttrain.models.precision import measure

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    load_before = os.getloadavg()[0]
    read_gbs, copy_gbs = bandwidth_gbs()
    peak = dict(zip(("fp32", "bf16"), measure(budget_s=1.0, threads=args.threads, sizes=(512, 1024))))

    loaded = load_model(args.model, device="cpu", dtype=torch.float32)
    model, tok = loaded.model, loaded.tokenizer
    engines = {"fp32": HFGenerator(model, tok, batch_size=max(batches)),
               "bf16": HFGenerator(model, tok, batch_size=max(batches), dtype="bf16"),
               # the anchor: the same engine on transformers' DynamicCache forward (the loop before
               # engines/static_llama.py; what every non-Llama model still decodes with)
               "bf16-dyn": HFGenerator(model, tok, batch_size=max(batches), dtype="bf16", static_cache=False)}
    if args.vllm_server:
        from posttrain.engines.vllm_server import VLLMServerGenerator

        engines["vllm-server"] = VLLMServerGenerator(model, tok, batch_size=max(batches), dtype="bfloat16")
    for g in engines.values():
        g.stop_ids = frozenset()  # every row decodes exactly new_tokens: the batch stays at B
        timed_generate(g, prompts_for(2), 4, 0)  # warm-up
    prompt_len = statistics.mean(len(engines["fp32"].render_prompt(p, None)) for p in prompts_for(max(batches)))
    context = prompt_len + args.new_tokens / 2  # mean context length over the decode

    runs: dict[tuple[str, int], list[float]] = {(d, b): [] for d in engines for b in batches}
    samples: dict[int, Any] = {}
    for r in range(args.rounds):
        for b in batches:
            for d, g in engines.items():
                t_full, out = timed_generate(g, prompts_for(b), args.new_tokens, seed=r)
                t_prefill, _ = timed_generate(g, prompts_for(b), 1, seed=r)
                runs[(d, b)].append(b * (args.new_tokens - 1) / max(t_full - t_prefill, 1e-9))
                if d == "fp32":
                    samples[b] = out
    lp_err = logprob_error(engines["bf16"].model, samples[max(batches)][:8], engines["fp32"].pad_id)
    share = sampler_share(engines["fp32"], max(batches), 16)
    profiled = step_profile(engines["bf16"], max(batches), args.new_tokens)
    load_after = os.getloadavg()[0]

    n_params = sum(p.numel() for p in model.parameters())
    c = model.config
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), load average {load_before:.1f} -> {load_after:.1f}")
    print(f"memory bandwidth: read {read_gbs:.1f} GB/s (x.sum over 512 MiB), copy {copy_gbs:.1f} GB/s (read+write)")
    print(f"matmul peak: fp32 {peak['fp32']:.0f} GFLOP/s, bf16 {peak['bf16']:.0f} GFLOP/s")
    print(f"model: {args.model}, {n_params / 1e6:.1f}M parameters, {c.num_hidden_layers} layers; prompts "
          f"~{prompt_len:.0f} tokens, {args.new_tokens} new tokens (mean context {context:.0f})")
    print(f"{'weights':>7s} {'batch':>5s} {'MB/step':>8s} {'bw limit':>9s} {'compute lim':>11s} "
          f"{'decode tok/s':>15s} {'of bw lim':>9s} {'of roofline':>11s}")
    table = []
    for d in engines:
        w_bytes, kv_tok = model_bytes(model, 4 if d == "fp32" else 2)
        pk = peak["fp32" if d == "fp32" else "bf16"]  # the vLLM server's worker computes in bf16 on one core
        for b in batches:
            step_bytes = w_bytes + kv_tok * b * context
            bw_limit = b * read_gbs * 1e9 / step_bytes
            compute_limit = pk * 1e9 / (2 * n_params)
            roof = min(bw_limit, compute_limit)
            v = runs[(d, b)]
            mean = statistics.mean(v)
            se = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
            table.append({"weights": d, "batch": b, "bytes_per_step": step_bytes, "bandwidth_limit": bw_limit,
                          "compute_limit": compute_limit, "tokens_per_s": mean, "se": se, "raw": v,
                          "frac_bandwidth": mean / bw_limit, "frac_roofline": mean / roof})
            print(f"{d:>7s} {b:5d} {step_bytes / 1e6:8.0f} {bw_limit:9.1f} {compute_limit:11.1f} "
                  f"{mean:8.1f} ± {se:4.1f} {100 * mean / bw_limit:8.1f}% {100 * mean / roof:10.1f}%")
    print(f"bf16 sampling weights: mean |log-prob − fp32 sampler's| = {lp_err:.4f} nat/token (8 rows of batch "
          f"{max(batches)}, teacher-forced)")
    print(f"sampler share of decode time (fp32, batch {max(batches)}): {100 * share:.1f}% (bounds a fused sampler's gain)")
    print(f"one bf16 decode step at batch {max(batches)}, ms (torch profiler, prefill subtracted): "
          + ", ".join(f"{k} {v:.1f}" for k, v in profiled.items()))
    from posttrain.models.precision import resolve

    default = resolve("auto", "sampling").precision  # what rollout.engine.dtype=auto samples with here
    head = next(r for r in table if r["weights"] == default and r["batch"] == max(batches))
    server = next((r for r in table if r["weights"] == "vllm-server" and r["batch"] == max(batches)), None)
    if server is not None:
        engines["vllm-server"].close()
    row = {"bench": "rollout_throughput",
           "kind": "bandwidth_limit", "model": args.model, "args": vars(args), "bandwidth_read_gbs": read_gbs,
           "bandwidth_copy_gbs": copy_gbs, "peak_gflops": peak, "prompt_tokens": prompt_len, "table": table,
           "bf16_logprob_error": lp_err, "sampler_share": share, "bf16_step_profile_ms": profiled, "default_sampling_weights": default,
           **provenance("none", machine(load_before, load_after, threads=args.threads))}  # made-up prompts, timed
    if not args.no_save:
        append_row(RESULTS, row)
    binds = "compute" if head["compute_limit"] < head["bandwidth_limit"] else "bandwidth"
    anchor = next((r for r in table if r["weights"] == "bf16-dyn" and r["batch"] == max(batches)), None)
    print(f"RESULT rollout_throughput: {head['frac_roofline']:.2f} of the roofline (HFGenerator {default} decode, "
          f"the default (auto) sampling weights here, at batch {max(batches)}: {head['tokens_per_s']:.0f} tok/s "
          f"against a roofline of {min(head['compute_limit'], head['bandwidth_limit']):.0f} ({binds} binds); "
          f"{head['frac_bandwidth']:.2f} of the bandwidth limit"
          + (f"; the DynamicCache loop {anchor['frac_roofline']:.2f}" if anchor and default == "bf16" else "")
          + (f"; vllm-server {server['tokens_per_s']:.0f} tok/s, {server['frac_roofline']:.2f} of its roofline" if server else "")
          + ")")


if __name__ == "__main__":
    main()

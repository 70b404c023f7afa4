"""Rollout throughput: generated tokens/s of ``HFGenerator`` vs plain ``model.generate``.

The workload is a small RL rollout batch: 8 chat prompts × 4 completions, 48 new tokens, sampling
at temperature 1, fp32 on the CPU. Both engines must deliver the same thing the trainer needs: the
sampled token ids *and* their log-probs, so the ``model.generate`` side asks for
``output_logits=True`` and turns the logits into log-probs (``log_softmax(logits / T)``), which is
part of its cost. Its prompts are rendered by the same chat template and left-padded.

Generated tokens are counted per completion up to and including its stop token (padding after a
finished row is not counted). The engines run interleaved round by round (A, B, A, B, ...) so slow
phases of a shared machine hit both alike; the rate is total tokens / total seconds.

Prints both rates and their ratio and appends one JSON line to
bench/results/rollout_throughput.jsonl. Run: ``python bench/rollout_throughput.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from results_row import append_row  # bench/results_row.py (sys.path[0] is bench/ when run)

RESULTS = Path(__file__).resolve().parent / "results" / "rollout_throughput.jsonl"

QUESTIONS = [
    "What is 17 times 23? Explain briefly.",
    "Write a haiku about autumn leaves.",
    "Name three uses of a paperclip.",
    "How do plants make their food?",
    "Give me a short tip for learning a new language.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Summarize the plot of Cinderella in two sentences.",
    "Why is the sky blue?",
]


def run_hf_generator(gen: Any, prompts: list[list[dict]], n: int, max_new: int, seed: int) -> int:
    from posttrain.engines.base import SamplingParams

    out = gen.generate(prompts, SamplingParams(max_new_tokens=max_new, temperature=1.0, n=n, seed=seed))
    return sum(len(c.token_ids) for comps in out for c in comps)


def run_model_generate(gen: Any, prompts: list[list[dict]], n: int, max_new: int, seed: int) -> int:
    """The baseline: one ``model.generate`` call with logits out, log-probs computed after."""
    import torch

    ids = [gen.render_prompt(p, None) for p in prompts]
    width = max(len(p) for p in ids)
    input_ids = torch.tensor([[gen.pad_id] * (width - len(p)) + p for p in ids])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = gen.model.generate(
            input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0, top_p=1.0,
            top_k=0, max_new_tokens=max_new, num_return_sequences=n, eos_token_id=sorted(gen.stop_ids),
            pad_token_id=gen.pad_id, output_logits=True, return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]
        # the log-probs the trainer needs are part of the work (computed, then not used here)
        logits = torch.stack(out.logits, dim=1).float()  # [rows, steps, V]
        torch.log_softmax(logits, dim=-1).gather(-1, new[..., None])
    total = 0
    for row in new.tolist():
        stop = next((i for i, t in enumerate(row) if t in gen.stop_ids), None)
        total += len(row) if stop is None else stop + 1
    return total


ENGINES = {"hf_generator": run_hf_generator, "model_generate": run_model_generate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    ap.add_argument("--no-save", action="store_true", help="print only, do not append to the results file")
    args = ap.parse_args()

    import torch

    from posttrain.models.loading import load_model
    from posttrain.engines.hf import HFGenerator

    loaded = load_model(args.model, device="cpu", dtype=torch.float32)
    gen = HFGenerator(loaded.model, loaded.tokenizer, batch_size=args.prompts * args.n, num_threads=args.threads)
    prompts = [[{"role": "user", "content": q}] for q in (QUESTIONS * 8)[: args.prompts]]
    for engine in ENGINES.values():  # warm-up: first-call allocations, lazy imports
        engine(gen, prompts[:2], 1, 4, 0)
    tokens = {k: 0 for k in ENGINES}
    seconds = {k: 0.0 for k in ENGINES}
    for r in range(args.rounds):
        for name, engine in ENGINES.items():
            t0 = time.perf_counter()
            tokens[name] += engine(gen, prompts, args.n, args.max_new_tokens, seed=r)
            seconds[name] += time.perf_counter() - t0
    rate = {k: tokens[k] / seconds[k] for k in ENGINES}
    ratio = rate["hf_generator"] / rate["model_generate"]
    for k in ENGINES:
        print(f"{k:15s} {rate[k]:8.1f} tokens/s  ({tokens[k]} tokens in {seconds[k]:.1f} s)")
    print(f"ratio hf_generator / model_generate: {ratio:.2f}x")
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": args.model, "dtype": "float32", "prompts": args.prompts, "n": args.n,
        "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "tokens": tokens, "ratio": round(ratio, 3),
    }
    if not args.no_save:
        append_row(RESULTS, record)


if __name__ == "__main__":
    main()

"""SFT training throughput on the embedded model, next to the matmul peak measured in the same run.

    python bench/sft_throughput.py [--steps 3] [--batch 16] [--seq 512]

Prints, for each trainer:
* tokens/s — every token of the packed rows (prompt + answer), the usual definition;
* model FLOP/s at 6·N FLOP per token (N = parameters, embeddings included, as for MFU);
* that as a fraction of the fp32 and bf16 matmul peaks measured on this machine in this run.

Trainers:
* ``anchor``: plain HF fine-tuning — padded batch, full logits, fp32, ``model(**batch, labels=...)``;
* ``posttrain``: the SFT stage's step (packing, logits only at trained positions, precision auto).

Because posttrain skips the vocabulary projection at positions that carry no loss, its real FLOPs
per token are below 6·N; the "model FLOP/s" column still uses 6·N (the work a naive trainer would
do for the same tokens), so it measures useful training throughput, not hardware utilisation.
Appends one JSON line to bench/results/sft_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from results_row import append_row  # bench/results_row.py (sys.path[0] is bench/ when run)


def matmul_peak(dtype: torch.dtype, n: int = 1536, budget_s: float = 3.0) -> float:
    """Best-of square-matmul FLOP/s within a time budget (bf16 can be very slow on AVX2-only CPUs)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t))
    return best


def make_examples(tok, n: int, seed: int):
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.train.sft import tokenize_rows

    examples, _ = tokenize_rows(tok, list(arithmetic_rows(n, seed=seed, max_digits=3)))
    return examples


def anchor_step(model, opt, examples, pad_id: int) -> int:
    """Plain HF: right-padded batch, full logits, the model's own loss."""
    width = max(len(e) for e in examples)
    ids = torch.tensor([e.input_ids + [pad_id] * (width - len(e)) for e in examples])
    att = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in examples])
    labels = torch.tensor([[t if m else -100 for t, m in zip(e.input_ids, e.loss_mask)] + [-100] * (width - len(e))
                           for e in examples])
    opt.zero_grad(set_to_none=True)
    model(input_ids=ids, attention_mask=att, labels=labels).loss.backward()
    opt.step()
    return int(att.sum())


def posttrain_step(model, opt, examples, pad_id: int, seq: int, precision: str) -> int:
    from posttrain.algos.losses import LossInputs, make_loss
    from posttrain.data.packing import pack_examples
    from posttrain.train.precision import autocast
    from posttrain.train.sft import row_logprobs

    rows = pack_examples(examples, seq, pad_id)
    n_targets = sum(r.n_target_tokens for r in rows)
    ce = make_loss("ce")  # what the SFT stage runs per micro-batch (train/sft.py, train/loop.py)
    opt.zero_grad(set_to_none=True)
    for r in rows:
        with autocast(precision, "cpu"):
            logprobs_BT, mask_BT = row_logprobs(model, r.to_tensors())
            loss = ce(LossInputs(logprobs_BT, mask_BT, num_tokens=n_targets)).loss
        loss.backward()
    opt.step()
    return sum(len(x) for r in rows for x in r.input_ids_BT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per trainer (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--seq", type=int, default=512, help="packed row length (the SFT default)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    from posttrain.models.loading import load_model
    from posttrain.train.precision import resolve_precision

    torch.manual_seed(0)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16, n=768)}
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    model.train()
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    pad_id = tok.pad_token_id or 0
    precision = resolve_precision("auto", "cpu")
    batches = [make_examples(tok, args.batch, seed=s) for s in range(args.steps + 1)]
    trainers = {
        "anchor": lambda ex: anchor_step(model, opt, ex, pad_id),
        "posttrain": lambda ex: posttrain_step(model, opt, ex, pad_id, args.seq, precision),
    }
    results = {}
    init = {k: v.clone() for k, v in model.state_dict().items()}
    for name, step in trainers.items():
        model.load_state_dict(init)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
        step(batches[0])  # warm-up
        tokens, t = 0, time.perf_counter()
        for ex in batches[1:]:
            tokens += step(ex)
        dt = time.perf_counter() - t
        tps = tokens / dt
        flops = 6 * n_params * tps
        results[name] = {"tokens_per_s": tps, "model_flops": flops,
                         "frac_fp32_peak": flops / peaks["fp32"], "frac_bf16_peak": flops / peaks["bf16"],
                         "tokens": tokens, "seconds": dt}

    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, posttrain precision={precision}")
    print(f"matmul peak: fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s")
    print(f"model: {args.model}, {n_params / 1e6:.1f}M parameters; {args.steps} steps × {args.batch} conversations")
    print(f"{'trainer':10s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'% fp32 pk':>9s} {'% bf16 pk':>9s}")
    for name, r in results.items():
        print(f"{name:10s} {r['tokens_per_s']:9.1f} {r['model_flops'] / 1e9:8.1f} "
              f"{100 * r['frac_fp32_peak']:8.1f}% {100 * r['frac_bf16_peak']:8.1f}%")
    speedup = results["posttrain"]["tokens_per_s"] / results["anchor"]["tokens_per_s"]
    print(f"posttrain / anchor: {speedup:.2f}×")
    if not args.no_save:
        out = Path(__file__).parent / "results" / "sft_throughput.jsonl"
        append_row(out, {"time": time.time(), "model": args.model, "peaks": peaks, "precision": precision,
                                "results": results, "speedup": speedup, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

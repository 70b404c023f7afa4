"""SFT training throughput on the embedded model, next to the matmul peak measured in the same run.

    python bench/sft_throughput.py [--steps 3] [--batch 16] [--seq 512] [--threads 0] [--profile]

Prints, for each trainer:
* tokens/s — every token of the packed rows (prompt + answer), the usual definition;
* model FLOP/s at 6·N FLOP per token (N = parameters, embeddings included, as for MFU);
* that as a fraction of the fp32 and bf16 matmul peaks measured on this machine in this run, and of
  the *best available* peak (the faster of the two: bf16 on a CPU with avx512_bf16/AMX, fp32 on an
  AVX2-only one), which the summary line names.

Trainers (same batches, same initial weights, same optimizer):
* ``anchor``: plain HF fine-tuning — padded batch, full logits, fp32, ``model(**batch, labels=...)``;
* ``posttrain fp32``: the SFT stage's step (packing, logits only at trained positions) in fp32;
* ``posttrain bf16, sdpa`` and ``posttrain bf16 autocast`` (only where bf16 is >= 1.3x faster):
  fp32 weights, bf16 autocast, with torch's sdpa attention and with the eager attention the loop
  picks for bf16 on the CPU (``attention_for``): the two levers' other sides;
* ``posttrain auto``: the precision the SFT stage's ``precision: auto`` picks from this run's peaks
  for ``--model`` (``train/autocast.py: decide_precision``): where bf16 is faster, ``bf16_master`` —
  bf16 weights, no autocast, AdamW over fp32 masters (``train/master_weights.py``), eager attention;
  else fp32.

``--profile`` adds a torch.profiler pass over one ``posttrain auto`` step and prints where its time
goes: matmuls of the transformer layers, the LM head's matmuls (those with a vocabulary-sized
dimension), attention (sdpa forward + backward over the packed rows), dtype casts, the optimizer
step and collation (packing + tensors; timed directly), the rest.

Because posttrain skips the vocabulary projection at positions that carry no loss, its real FLOPs
per token are below 6·N; the "model FLOP/s" column still uses 6·N (the work a naive trainer would
do for the same tokens), so it measures useful training throughput, not hardware utilisation.
Appends one JSON line to bench/results/sft_throughput.jsonl.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from results_row import append_row, machine, provenance  # bench/results_row.py (sys.path[0] is bench/ when run)


def matmul_peaks() -> dict[str, float]:
    """fp32 and bf16 matmul peaks in FLOP/s at this run's thread count (``models/precision.py:
    measure``, best over sizes 512 and 1024, the dtypes alternating)."""
    from posttrain.models.precision import measure

    fp32, bf16 = measure(budget_s=1.0, threads=torch.get_num_threads(), sizes=(512, 1024))
    return {"fp32": fp32 * 1e9, "bf16": bf16 * 1e9}


def profile_step(model, opt, examples, pad_id: int, seq: int, precision: str, vocab: int, master=None) -> dict[str, float]:
    """Seconds by category in one posttrain step (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    from posttrain.data.packing import pack_examples

    t = time.perf_counter()
    for r in pack_examples(examples, seq, pad_id):
        r.to_tensors()
    collation = time.perf_counter() - t
    step_fn = opt.step
    spent = {"optimizer step": 0.0}

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        out = step_fn(*a, **k)
        spent["optimizer step"] += time.perf_counter() - t0
        return out

    opt.step = timed_step
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t = time.perf_counter()
            posttrain_step(model, opt, examples, pad_id, seq, precision, master)
            total = time.perf_counter() - t
    finally:
        opt.step = step_fn
    cats = {"layer matmuls": 0.0, "LM head matmuls": 0.0, "attention (sdpa fwd+bwd)": 0.0, "dtype casts": 0.0}
    for e in prof.key_averages(group_by_input_shape=True):
        s = e.self_cpu_time_total / 1e6
        if e.key in ("aten::mm", "aten::addmm", "aten::bmm"):
            cat = "LM head matmuls" if any(vocab in sh for sh in (e.input_shapes or []) if sh) else "layer matmuls"
        elif "scaled_dot_product" in e.key:
            cat = "attention (sdpa fwd+bwd)"
        elif e.key in ("aten::copy_", "aten::_to_copy"):
            cat = "dtype casts"
        else:
            continue
        cats[cat] += s
    # the profiler's self times carry its own overhead: scale the op categories so that all ops sum
    # to the measured wall time outside collation (the optimizer step is timed directly as well)
    prof_total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    scale = min(1.0, (total - collation) / prof_total) if prof_total else 1.0
    out = {k: v * scale for k, v in cats.items()}
    out["optimizer step"] = spent["optimizer step"]
    out["collation (pack + tensors)"] = collation  # inside posttrain_step's wall time too
    out["other (norms, activations, loss, autograd, Python)"] = max(0.0, total - sum(out.values()))
    out["total step"] = total
    return out


def make_optimizer(params):
    """AdamW as the training loop builds it (``train/loop.py``: fused, fp32 states), for every trainer
    here, the anchor included (transformers' Trainer defaults to adamw_torch_fused with torch >= 2.8)."""
    return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=True)


def fresh(model, init, precision: str):
    """(optimizer, masters or None): the model back at ``init`` (fp32 weights) and a new AdamW for a
    trainer in ``precision``; for bf16_master the weights are cast to bf16 and AdamW steps their fp32
    masters."""
    from posttrain.train.master_weights import MasterWeights

    for p in model.parameters():  # a bf16_master trainer before left them bf16
        p.data = p.data.float()
    model.load_state_dict(init)
    master = MasterWeights(model) if precision == "bf16_master" else None
    return make_optimizer(master.masters if master else model.parameters()), master


def make_examples(tok, n: int, seed: int):
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.data.examples import tokenize_rows

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


def posttrain_step(model, opt, examples, pad_id: int, seq: int, precision: str, master=None) -> int:
    from posttrain.algos.losses import LossInputs, make_loss
    from posttrain.data.packing import pack_examples
    from posttrain.train.autocast import autocast
    from posttrain.train.supervised import row_logprobs

    rows = pack_examples(examples, seq, pad_id)
    n_targets = sum(r.n_target_tokens for r in rows)
    ce = make_loss("ce")  # what the SFT stage runs per micro-batch (train/sft.py, train/loop.py)
    opt.zero_grad(set_to_none=True)
    for r in rows:
        with autocast(precision, "cpu"):
            logprobs_BT, mask_BT = row_logprobs(model, r.to_tensors())
            loss = ce(LossInputs(logprobs_BT, mask_BT, num_tokens=n_targets)).loss
        loss.backward()
    if master is not None:  # bf16_master (train/loop.py: update): bf16 grads → fp32 masters → AdamW → bf16 weights
        master.grads_to_masters()
    opt.step() if master is None else master.step(opt)
    return sum(len(x) for r in rows for x in r.input_ids_BT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per trainer (after one warm-up step)")
    ap.add_argument("--batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--seq", type=int, default=512, help="packed row length (the SFT default)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one per core)")
    ap.add_argument("--profile", action="store_true", help="also profile one posttrain step (where the time goes)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()


    from posttrain.models.loading import load_model
    from posttrain.models.precision import Probe, decide
    from posttrain.train.autocast import masters_where_they_apply

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    peaks = matmul_peaks()
    autocast_decision = decide(Probe(peaks["fp32"] / 1e9, peaks["bf16"] / 1e9, source="this run"), "sft")
    decision = masters_where_they_apply(autocast_decision, "auto", "cpu", True, args.model)  # as the SFT stage
    precision = decision.precision
    best = max(peaks, key=peaks.get)  # type: ignore[arg-type]
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    model.train()
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    pad_id = tok.pad_token_id or 0
    batches = [make_examples(tok, args.batch, seed=s) for s in range(args.steps + 1)]
    def with_attention(impl, fn):  # the stage's attention choice (models/precision.py: attention_for)
        def step(ex):
            model.set_attn_implementation(impl)
            try:
                return fn(ex)
            finally:
                model.set_attn_implementation("sdpa")
        return step

    # eager attention in bf16 on the CPU: what train/loop.py picks (attention_for, rows <= 512)
    auto_attention = "eager" if precision in ("bf16", "bf16_master") else "sdpa"
    AUTO = f"posttrain auto ({precision})"
    trainers = {  # name → (precision, step)
        "anchor": ("fp32", lambda ex: anchor_step(model, opt, ex, pad_id)),
        "posttrain fp32": ("fp32", lambda ex: posttrain_step(model, opt, ex, pad_id, args.seq, "fp32")),
    }
    if autocast_decision.precision == "bf16":  # the levers' other sides: autocast with sdpa and with eager attention
        trainers["posttrain bf16, sdpa"] = ("bf16", lambda ex: posttrain_step(model, opt, ex, pad_id, args.seq, "bf16"))
        trainers["posttrain bf16 autocast"] = ("bf16", with_attention(
            "eager", lambda ex: posttrain_step(model, opt, ex, pad_id, args.seq, "bf16")))
    trainers[AUTO] = (precision, with_attention(
        auto_attention, lambda ex: posttrain_step(model, opt, ex, pad_id, args.seq, precision, master)))
    results: dict[str, dict] = {}
    init = {k: v.clone() for k, v in model.state_dict().items()}
    for name, (trainer_precision, step) in trainers.items():
        opt, master = fresh(model, init, trainer_precision)
        step(batches[0])  # warm-up
        times, tokens = [], 0
        for ex in batches[1:]:
            t = time.perf_counter()
            n = step(ex)
            times.append(n / (time.perf_counter() - t))
            tokens += n
        tps = sum(times) / len(times)
        se = statistics.stdev(times) / len(times) ** 0.5 if len(times) > 1 else float("nan")
        flops = 6 * n_params * tps
        results[name] = {"tokens_per_s": tps, "tokens_per_s_se": se, "per_step_tokens_per_s": times,
                         "model_flops": flops, "frac_fp32_peak": flops / peaks["fp32"],
                         "frac_bf16_peak": flops / peaks["bf16"], "frac_best_peak": flops / peaks[best],
                         "tokens": tokens}
    prof = None
    if args.profile:
        opt, master = fresh(model, init, precision)
        model.set_attn_implementation(auto_attention)
        posttrain_step(model, opt, batches[0], pad_id, args.seq, precision, master)
        prof = profile_step(model, opt, batches[1], pad_id, args.seq, precision, model.config.vocab_size, master)
        model.set_attn_implementation("sdpa")
    # The peaks again, after the trainers; the higher of the two counts. A busy moment during the
    # first measurement must not lower the peak: at load 1.6 one run measured fp32 81 GFLOP/s while
    # the fp32 trainer itself then ran at 154 (a "190% of peak" that only says the peak was wrong).
    again = matmul_peaks()
    peaks = {k: max(peaks[k], again[k]) for k in peaks}
    best = max(peaks, key=peaks.get)  # type: ignore[arg-type]
    for r in results.values():
        r.update(frac_fp32_peak=r["model_flops"] / peaks["fp32"], frac_bf16_peak=r["model_flops"] / peaks["bf16"],
                 frac_best_peak=r["model_flops"] / peaks[best])
    load_after = os.getloadavg()[0]

    print(f"machine: {os.cpu_count()} cores, {torch.get_num_threads()} threads, torch {torch.__version__}, CPU "
          f"capability {torch.backends.cpu.get_cpu_capability()}, load average {load_before:.1f} -> {load_after:.1f}")
    print(f"matmul peak: fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s; "
          f"{decision.line()}")
    print(f"model: {args.model}, {n_params / 1e6:.1f}M parameters; {args.steps} steps × {args.batch} conversations, "
          f"rows of {args.seq}")
    print(f"{'trainer':24s} {'tokens/s':>15s} {'GFLOP/s':>8s} {'% fp32 pk':>9s} {'% bf16 pk':>9s}")
    for name, r in results.items():
        print(f"{name:24s} {r['tokens_per_s']:8.1f} ± {r['tokens_per_s_se']:4.1f} {r['model_flops'] / 1e9:8.1f} "
              f"{100 * r['frac_fp32_peak']:8.1f}% {100 * r['frac_bf16_peak']:8.1f}%")
    auto = results[AUTO]
    speedup = auto["tokens_per_s"] / results["anchor"]["tokens_per_s"]
    print(f"posttrain auto ({precision}, {auto_attention} attention) / anchor: {speedup:.2f}×; / posttrain fp32: "
          f"{auto['tokens_per_s'] / results['posttrain fp32']['tokens_per_s']:.2f}×")
    if "posttrain bf16 autocast" in results:
        print(f"{AUTO} / posttrain bf16 autocast: "
              f"{auto['tokens_per_s'] / results['posttrain bf16 autocast']['tokens_per_s']:.2f}× (same batches, same run)")
    if prof:
        print(f"where one {AUTO} step's {prof['total step']:.1f} s go:")
        for k, v in prof.items():
            if k != "total step":
                print(f"  {k:45s} {v:6.2f} s  {100 * v / prof['total step']:5.1f}%")
    if not args.no_save:
        out = Path(__file__).parent / "results" / "sft_throughput.jsonl"
        append_row(out, {"bench": "sft_throughput", "model": args.model, "peaks": peaks, "precision": precision,
                         "best_peak": best, "results": results, "speedup": speedup, "profile": prof,
                         "args": vars(args), "auto_attention": auto_attention,
                         **provenance("none", machine(load_before, load_after, threads=torch.get_num_threads(),
                                                      capability=torch.backends.cpu.get_cpu_capability()))})
    print(f"RESULT sft_throughput: {100 * auto['frac_best_peak']:.1f} % of the best matmul peak ({best} "
          f"{peaks[best] / 1e9:.0f} GFLOP/s; posttrain SFT in {precision}, {auto['tokens_per_s']:.1f} ± "
          f"{auto['tokens_per_s_se']:.1f} tokens/s at 6N FLOP/token, {torch.get_num_threads()} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

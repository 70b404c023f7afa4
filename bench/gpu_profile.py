"""Where an SFT step's time goes on a GPU (issue 38): the first GPU check measured SFT at 1.1% of the
bf16 matmul rate, 1.36 s for a step of 7 packed rows of 2048 tokens, while the loop's bare update
ran 8-row micro-batches at 7x the tokens/s. This profiles that step three ways, on the model the
GPU check's env part prepared (``python bench/gpu_check.py env --work DIR`` first):

1. one packed row, forward + backward, timed with CUDA sync, as ``row_logprobs`` runs it (packed:
   ``position_ids`` restart at each conversation) and as plain rows (no ``position_ids``), with and
   without ``logits_to_keep`` — which part of the micro-batch costs what;
2. ``posttrain sft`` for a few steps under cProfile: the Python functions the step spends its time in;
3. the same under ``torch.profiler``: the operators, on the CPU and on the GPU, and how busy the GPU was.

    python bench/gpu_profile.py --work /tmp/gpu_check [--cpu-smoke]

Prints tables; writes nothing but ``DIR/profile_*.txt`` (and ``$OUT/gpu_profile.txt`` when set).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (bench/gpu_check.py: the model and the SFT arguments)

LINES: list[str] = []
MICRO: dict[str, dict[str, float]] = {}


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


def timed(fn, reps: int, sync) -> tuple[float, float]:
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2], ts[0]


def micro_batches(work: Path, seq: int, cpu: bool) -> None:
    import torch

    from posttrain.data.conversations import read_conversations
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.packing import trainable_rows
    from posttrain.models.loading import load_model
    from posttrain.train.supervised import row_logprobs

    dev = "cpu" if cpu else "cuda"
    loaded = load_model(gpu_check.model_spec(work), device=dev, dtype=torch.float32 if cpu else torch.bfloat16)
    model, tok = loaded.model, loaded.tokenizer
    model.train()
    say(f"[micro] model on {next(model.parameters()).device}, {next(model.parameters()).dtype}, attention "
        f"{model.config._attn_implementation}")
    examples, _ = tokenize_rows(tok, read_conversations(work / "sft_data.jsonl")[0][:400], seq)
    rows = trainable_rows(examples, seq, tok.pad_token_id or 0, True)
    row = rows[0].to_tensors(dev)
    n_docs = int((row["position_ids"][0] == 0).sum())
    sync = torch.cuda.synchronize if not cpu else (lambda: None)
    reps = 3 if cpu else 10

    def packed():
        lp, m = row_logprobs(model, row)
        (-lp[m].mean()).backward()

    def plain_keep():  # no position_ids: one causal sequence over the row, logits only at targets
        b = {k: v for k, v in row.items() if k != "position_ids"}
        b["position_ids"] = torch.arange(row["input_ids"].shape[1], device=dev)[None]
        lp, m = row_logprobs(model, b)
        (-lp[m].mean()).backward()

    def plain_full():  # HF's own loss over every position
        out = model(input_ids=row["input_ids"], labels=row["input_ids"], use_cache=False)
        out.loss.backward()

    def forward_only():
        with torch.no_grad():
            row_logprobs(model, row)

    # four packed rows as one (1, 4T) row: the same documents per micro-batch as 4 rows, a quarter of the launches
    long = {k: torch.cat([r.to_tensors(dev)[k] for r in rows[:4]], dim=1) for k in ("input_ids", "labels", "position_ids")}

    def packed_long():
        lp, m = row_logprobs(model, long)
        (-lp[m].mean()).backward()

    # what `train.precision: bf16` does on CUDA today: fp32 weights under torch.autocast(bf16)
    fp32 = load_model(gpu_check.model_spec(work), device=dev, dtype=torch.float32).model.train()

    def packed_autocast():
        with torch.autocast(device_type="cuda" if not cpu else "cpu", dtype=torch.bfloat16):
            lp, m = row_logprobs(fp32, row)
            loss = -lp[m].mean()
        loss.backward()

    def forward_autocast():
        with torch.no_grad(), torch.autocast(device_type="cuda" if not cpu else "cpu", dtype=torch.bfloat16):
            row_logprobs(fp32, row)

    T = row["input_ids"].shape[1]
    n_params = sum(p.numel() for p in model.parameters())
    for name, fn, m, tokens in (
            ("packed row (row_logprobs), bf16 weights", packed, model, T),
            ("packed row, fp32 weights + autocast bf16 (SFT today)", packed_autocast, fp32, T),
            ("4 packed rows as one row, bf16 weights", packed_long, model, long["input_ids"].shape[1]),
            ("one sequence, logits_to_keep, bf16", plain_keep, model, T),
            ("one sequence, HF loss, all logits, bf16", plain_full, model, T),
            ("packed row, forward only, bf16", forward_only, model, T),
            ("packed row, forward only, fp32 + autocast", forward_autocast, fp32, T)):
        med, best = timed(fn, reps, sync)
        m.zero_grad(set_to_none=True)
        MICRO[name] = {"ms_median": round(1e3 * med, 2), "ms_best": round(1e3 * best, 2),
                       "tokens_per_s": round(tokens / med), "tflops_6n": round(6 * n_params * tokens / med / 1e12, 2)}
        say(f"[micro] {name}: {1e3 * med:.1f} ms median, {1e3 * best:.1f} best; {tokens / med:.0f} tokens/s; "
            f"{6 * n_params * tokens / med / 1e12:.1f} TFLOP/s (6N per token)")
    if not cpu:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as p:
            packed_autocast()
            sync()
        say(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
    say(f"[micro] the row: {T} tokens, {n_docs} conversations, {int(row['labels'].ne(-100).sum())} target tokens")


def sft_args(work: Path, run: Path, steps: int, cpu: bool) -> list[str]:
    s = gpu_check.SIZES["sft"]["cpu" if cpu else "gpu"]
    return ["sft", "--no-progress", f"model={gpu_check.model_spec(work)}", f"run_dir={run}",
            f"data.train=[{{path: {work / 'sft_data.jsonl'}}}]", "data.val_frac=0.02",
            f"data.max_seq_len={s['seq']}", f"train.batch_size={s['batch']}", f"train.steps={steps}",
            f"train.precision={'fp32' if cpu else 'bf16'}", "train.eval_every=0", "train.save_every=0",
            "optim.warmup_steps=0"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--micro-only", action="store_true", help="only the micro-batch timings (view 1)")
    a = ap.parse_args()
    import shutil

    import torch

    from posttrain.cli import main as cli
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import KINDS

    s = gpu_check.SIZES["sft"]["cpu" if a.cpu_smoke else "gpu"]
    write_jsonl(KINDS["arithmetic"](s["rows"], 0, "train", max_digits=3), a.work / "sft_data.jsonl")
    try:
        micro_batches(a.work, s["seq"], a.cpu_smoke)
    except Exception as e:  # the other two views still run
        say(f"[micro] failed: {type(e).__name__}: {e}")
    if MICRO:
        from results_row import append_row, machine_now, provenance  # bench/results_row.py

        rows = Path(os.environ["OUT"], "gpu_profile.jsonl") if os.environ.get("OUT") else \
            Path(__file__).parent / "results" / "gpu_profile.jsonl"
        append_row(rows, {"bench": "gpu_profile", "part": "micro", "micro": MICRO, **provenance("none", machine_now()),
                          "mode": "cpu-smoke" if a.cpu_smoke else "gpu"})
        one, four = (MICRO.get(k, {}).get("tokens_per_s") for k in
                     ("packed row (row_logprobs), bf16 weights", "4 packed rows as one row, bf16 weights"))
        say(f"RESULT gpu_profile: {four} tokens/s (fwd+bwd, 4 packed rows as one micro-batch; one row: {one})")
    if a.micro_only:
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gpu_profile_micro.txt").write_text("\n".join(LINES) + "\n")
        return 0

    run = a.work / "prof_sft"
    shutil.rmtree(run, ignore_errors=True)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    cli(sft_args(a.work, run, a.steps, a.cpu_smoke))
    prof.disable()
    say(f"[cprofile] posttrain sft, {a.steps} steps: {time.perf_counter() - t0:.1f} s")
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(r"posttrain", 30)
    say(buf.getvalue())

    shutil.rmtree(run, ignore_errors=True)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([] if a.cpu_smoke else [torch.profiler.ProfilerActivity.CUDA])
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as p:
        cli(sft_args(a.work, run, 3, a.cpu_smoke))
    wall = time.perf_counter() - t0
    ka = p.key_averages()
    key = "self_cpu_time_total" if a.cpu_smoke else "self_device_time_total"
    say(f"[torch.profiler] posttrain sft, 3 steps, {wall:.1f} s wall")
    if not a.cpu_smoke:
        busy = sum(e.self_device_time_total for e in ka) / 1e6
        say(f"[torch.profiler] GPU kernels {busy:.2f} s of {wall:.1f} s wall ({100 * busy / wall:.1f}% busy)")
    say(ka.table(sort_by=key, row_limit=25, max_name_column_width=60))
    say(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    text = "\n".join(LINES) + "\n"
    (a.work / "profile_sft.txt").write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_profile.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

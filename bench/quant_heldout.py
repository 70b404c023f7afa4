"""Held-out loss, KL(BF16 ‖ FP8) and top-1 agreement of exported FP8 checkpoints on the same SFT
validation texts (for calibration SFT vs generic, and the policies, on one footing).

    python bench/quant_heldout.py BF16_SPEC VAL.jsonl N EXPORT_DIR [EXPORT_DIR ...] [--json OUT]
        [--split dev] [--no-save]

BF16_SPEC is the model the exports came from (its weights are rounded to BF16, as the quantizer
does). The N texts are scored in batches of 8; each figure is the token-weighted mean, and its
standard error is the spread of the per-batch values over the batches (Δ loss is paired: FP8 minus
BF16 on the same batch). Prints a Markdown table; ``--json`` also writes the figures. Appends one
row to bench/results/quant_heldout.jsonl (``--no-save``: none); ``--split`` names the split VAL.jsonl
was made from (``posttrain make-data --split``; default dev) for the row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_row import DATA_SPLITS  # noqa: E402  bench/results_row.py (sys.path[0] is bench/ when run)


def mean_se(values: list[float], weights: list[float]) -> tuple[float, float]:
    w = sum(weights)
    m = sum(v * x for v, x in zip(values, weights)) / w
    k = len(values)
    if k < 2:
        return m, 0.0
    u = sum(values) / k
    return m, (sum((v - u) ** 2 for v in values) / (k - 1) / k) ** 0.5


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from posttrain.models.loading import load_model
    from posttrain.quant import calibrate
    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.simulate import round_weights

    args = sys.argv[1:]
    out_json, split, save = None, "dev", "--no-save" not in args
    args = [a for a in args if a != "--no-save"]
    if "--json" in args:
        i = args.index("--json")
        out_json = args[i + 1]
        del args[i:i + 2]
    if "--split" in args:
        i = args.index("--split")
        split = args[i + 1]
        del args[i:i + 2]
    if split not in DATA_SPLITS:
        raise SystemExit(f"--split {split!r}: give train, dev or test (the split VAL.jsonl was made from)")
    spec, val, n, exports = args[0], args[1], int(args[2]), args[3:]
    loaded = load_model(spec, device="cpu", dtype=torch.float32)
    round_weights(loaded.model, torch.bfloat16)
    data = calibrate.batches(loaded.tokenizer, calibrate.sft_texts([val], n, seed=1), 128, 8)
    ref = calibrate.reference_logprobs(loaded.model, data)
    base = [calibrate.score(loaded.model, [b]) for b in data]
    toks = [p["tokens"] for p in base]
    base_loss = mean_se([p["loss"] for p in base], toks)[0]
    del loaded
    print(f"{n} held-out texts of {val}, {int(sum(toks))} tokens, {len(data)} batches; BF16 loss {base_loss:.4f}\n")
    print("| export | checkpoint MiB | loss | Δ loss ± se | KL(BF16‖FP8) per token ± se | top-1 agreement ± se |\n"
          "|---|---:|---:|---:|---:|---:|")
    rows = {"bf16_loss": base_loss, "tokens": sum(toks), "texts": n, "exports": {}}
    for e in exports:
        model = load_fp8(e)
        per = [calibrate.score(model, [b], [r]) for b, r in zip(data, ref)]
        loss = mean_se([p["loss"] for p in per], toks)[0]
        dloss, dse = mean_se([p["loss"] - q["loss"] for p, q in zip(per, base)], toks)
        kl, kse = mean_se([p["kl"] for p in per], toks)
        ag, ase = mean_se([p["top1_agree"] for p in per], toks)
        rep = Path(e) / "quant_report.json"
        mib = json.loads(rep.read_text())["checkpoint_bytes"] / 2 ** 20 if rep.exists() else float("nan")
        rows["exports"][Path(e).name] = {"path": e, "mib": mib, "loss": loss, "dloss": dloss, "dloss_se": dse,
                                         "kl": kl, "kl_se": kse, "top1_agree": ag, "top1_agree_se": ase}
        print(f"| {Path(e).name} | {mib:.1f} | {loss:.4f} | {dloss:+.4f} ± {dse:.4f} | {kl:.3e} ± {kse:.1e} | "
              f"{ag:.4f} ± {ase:.4f} |", flush=True)
        del model
    if out_json:
        Path(out_json).write_text(json.dumps(rows, indent=1))
    if save:
        from results_row import append_row, provenance

        append_row(Path(__file__).resolve().parent / "results" / "quant_heldout.jsonl", {
            "bench": "quant_heldout", "model": spec, "texts_file": val, **rows, **provenance(split)})
    return 0


if __name__ == "__main__":
    sys.exit(main())

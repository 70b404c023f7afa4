"""Held-out loss and KL(BF16 ‖ FP8) of exported FP8 checkpoints on the same SFT validation texts
(for calibration SFT vs generic, and the policies, on one footing).

    python scripts/quant_heldout.py BF16_SPEC VAL.jsonl N EXPORT_DIR [EXPORT_DIR ...]

BF16_SPEC is the model the exports came from (its weights are rounded to BF16, as the quantizer
does). Prints a Markdown table: export, held-out loss, Δ vs BF16, KL per token.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from posttrain.models.loading import load_model
    from posttrain.quant import calibrate
    from posttrain.quant.checkpoint import load_fp8
    from posttrain.quant.simulate import round_weights

    spec, val, n, exports = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    loaded = load_model(spec, device="cpu", dtype=torch.float32)
    round_weights(loaded.model, torch.bfloat16)
    data = calibrate.batches(loaded.tokenizer, calibrate.sft_texts([val], n, seed=1), 128, 8)
    ref = calibrate.reference_logprobs(loaded.model, data)
    base = calibrate.score(loaded.model, data)
    print(f"{n} held-out texts of {val}, {int(base['tokens'])} tokens; BF16 loss {base['loss']:.4f}\n")
    print("| export | loss | Δ loss | KL(BF16‖FP8) per token | ± se over batches of 8 texts |\n|---|---:|---:|---:|---:|")
    for e in exports:
        model = load_fp8(e)
        per = [calibrate.score(model, [b], [r]) for b, r in zip(data, ref)]
        tokens = sum(p["tokens"] for p in per)
        s = {k: sum(p[k] * p["tokens"] for p in per) / tokens for k in ("loss", "kl")}
        kls = [p["kl"] for p in per]
        m = sum(kls) / len(kls)
        se = (sum((k - m) ** 2 for k in kls) / (len(kls) - 1) / len(kls)) ** 0.5 if len(kls) > 1 else 0.0
        print(f"| {Path(e).name} | {s['loss']:.4f} | {s['loss'] - base['loss']:+.4f} | {s['kl']:.3e} | {se:.1e} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

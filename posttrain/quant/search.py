"""Per-unit sensitivity search: which units hurt most when put in FP8.

For each unit (``policy.find_units``), alone: quantize it (same weight / activation settings as
the final run), score the model on held-out calibration texts, undo. The score is the change in
next-token loss against the BF16 model (Δloss) and the mean per-token KL(BF16 ‖ quantized); units
are ranked by KL (smooth and always ≥ 0; Δloss on a few dozen texts is noisy and can be negative).
A budget of k keeps the k first units of the ranking in BF16 (``policy.type=searched``).

The result is ``sensitivity.json`` (the ranking), ``sensitivity.md`` (a table) and
``sensitivity.png`` (a bar per unit in model order, coloured by kind).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from posttrain.quant.calibrate import reference_logprobs, score
from posttrain.quant.policy import Plan, Unit
from posttrain.quant.simulate import apply_plan, expert_modules, set_module


def sensitivity(model: Any, units: list[Unit], data: list[dict[str, torch.Tensor]], weights: str,
                activations: str, input_scales: dict[str, torch.Tensor], progress: bool = True) -> list[dict[str, Any]]:
    """One row per unit, most sensitive (highest KL) first. ``model`` is left unchanged."""
    ref = reference_logprobs(model, data)
    base = score(model, data)
    rows = []
    for u in units:
        t0 = time.perf_counter()
        # the modules apply_plan replaces (Linears, fused-experts modules), put back afterwards
        saved = {n: model.get_submodule(n) for n in u.linears + expert_modules(u.experts)}
        plan = Plan(linears=u.linears, experts=u.experts, kv=[], ignore=[], bf16_units=[])
        apply_plan(model, plan, weights, activations, input_scales)
        s = score(model, data, ref)
        for n, mod in saved.items():  # undo
            set_module(model, n, mod)
        rows.append({"unit": u.name, "kind": u.kind, "layer": u.layer, "kl": s["kl"],
                     "delta_loss": s["loss"] - base["loss"], "base_loss": base["loss"],
                     "seconds": time.perf_counter() - t0})
        if progress:
            print(f"  {u.name:32s} {u.kind:9s} KL {s['kl']:.3e}  Δloss {s['loss'] - base['loss']:+.4f}", flush=True)
    rows.sort(key=lambda r: -r["kl"])
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| rank | unit | kind | KL(BF16‖FP8) per token | Δ loss |", "|---:|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['rank']} | `{r['unit']}` | {r['kind']} | {r['kl']:.3e} | {r['delta_loss']:+.4f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(rows, key=lambda r: (r["layer"], r["unit"]))
    colours = {"attention": "tab:red", "mamba": "tab:blue", "moe": "tab:green", "mlp": "tab:orange"}
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.28 * len(ordered) + 2), 6), sharex=True)
    x = range(len(ordered))
    for ax, key, label in ((axes[0], "kl", "KL(BF16 ‖ FP8) per token"), (axes[1], "delta_loss", "Δ held-out loss")):
        ax.bar(x, [r[key] for r in ordered], color=[colours.get(r["kind"], "grey") for r in ordered])
        ax.set_ylabel(label)
        ax.axhline(0, color="black", lw=0.5)
    if all(r["kl"] > 0 for r in ordered):
        axes[0].set_yscale("log")
    axes[1].set_xticks(list(x))
    axes[1].set_xticklabels([f"{r['layer']}:{r['kind'][:4]}" for r in ordered], rotation=90, fontsize=7)
    kinds = [k for k in colours if any(r["kind"] == k for r in ordered)]  # only the kinds this model has
    axes[0].legend([plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in kinds], kinds, fontsize=7, ncol=4)
    axes[0].set_title(title or "per-unit FP8 sensitivity (one unit quantized at a time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / "sensitivity.json"
    js.write_text(json.dumps({**meta, "ranking": rows}, indent=1))
    md = out_dir / "sensitivity.md"
    md.write_text(format_table(rows) + "\n")
    png = out_dir / "sensitivity.png"
    plot(rows, png, f"FP8 sensitivity: {meta.get('model', '')}")
    return [js, md, png]


def copy_model(model: Any) -> Any:
    return copy.deepcopy(model)

"""posttrain's pruning next to torch-pruning's at the same target, right after the cut (no distillation).

    python bench/prune_vs_torch_pruning.py [--model embedded] [--params 1.0e8] [--calib 64] [--heldout 200]
    python bench/prune_vs_torch_pruning.py --smoke --no-record      # tiny Llama: the code path only

One axis both libraries cut the same way: the MLP's hidden channels (Llama ``intermediate_size``), to
the size at which the model has at most ``--params`` parameters (``prune.sizes_for_params`` with
``[mlp_hidden]``), uniform over layers. Three cuts of the same float32 model:

* **posttrain**: activation importance on ``--calib`` calibration conversations (``importance.py``:
  mean |input of down_proj| per channel), the best channels per layer kept (``slicing.py``);
* **torch-pruning magnitude**: ``tp.pruner.MetaPruner`` with ``GroupMagnitudeImportance(p=2)`` (its
  default, data-free: the L2 norm of each channel's weights across gate/up/down);
* **torch-pruning taylor**: ``GroupTaylorImportance`` from the gradient of the same calibration rows'
  next-token loss (data-aware, first-order).

torch-pruning is told to cut only ``gate_proj``/``up_proj`` outputs (every other layer is in
``ignored_layers``), which its dependency graph carries to ``down_proj``'s inputs. Per cut: its
parameters, the held-out cross-entropy on ``--heldout`` dev-split arithmetic conversations (assistant
tokens, nats/token) with the unpruned model's beside it, the pruning wall time (importance + cut;
not the save), and whether the saved directory loads with plain ``AutoModelForCausalLM
.from_pretrained`` as the smaller config and gives the same logits: as saved, and (torch-pruning)
after setting ``config.intermediate_size`` by hand, since torch-pruning changes modules, not the
config. Llama-style models only. Ends with ``RESULT prune_vs_torch_pruning: ...``; the row goes to
bench/results/prune_vs_torch_pruning.jsonl unless ``--no-record``. ``--smoke`` figures are from a
random tiny model and mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import posttrain  # noqa: F401,E402  (before torch: the MKL shim of models/blas.py)
from results_row import append_row, machine, provenance, record_args, refuse_smoke_record  # noqa: E402  (bench/results_row.py)

RESULTS = ROOT / "bench" / "results" / "prune_vs_torch_pruning.jsonl"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded", help="a Llama-style model spec (embedded, an HF directory)")
    ap.add_argument("--params", type=float, default=1.0e8, help="parameter target (MLP channels are cut to reach it)")
    ap.add_argument("--calib", type=int, default=64, help="calibration conversations (posttrain and taylor)")
    ap.add_argument("--heldout", type=int, default=200, help="dev-split conversations the loss is measured on")
    ap.add_argument("--smoke", action="store_true", help="tiny-llama, 8 calibration rows (figures mean nothing)")
    record_args(ap, RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.model, args.params, args.calib, args.heldout = "tiny-llama", 8.0e4, 8, 16
        refuse_smoke_record(ap, args, RESULTS)
    return args


def loads_in_transformers(model: Any, tok: Any, out: Path, probe: Any) -> dict[str, Any]:
    """Save ``model`` as it is, reload it with plain transformers: does it load, at which size, with
    the same logits on ``probe``?"""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.train.checkpoint import save_hf_model

    save_hf_model(model, tok, out)
    try:
        again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001  (the point is to report how it fails)
        return {"loads": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    with torch.no_grad():
        same = bool(torch.allclose(again(probe).logits, model(probe).logits, atol=1e-4, rtol=1e-4))
    return {"loads": True, "intermediate_size": again.config.intermediate_size, "same_logits": same,
            "params": sum(p.numel() for p in again.parameters())}


def torch_pruning_cut(model: Any, rows: list[list[int]], keep: int, importance: str) -> Any:
    """torch-pruning on a copy of ``model``: only the MLP hidden channels, to ``keep`` per layer."""
    import torch
    import torch_pruning as tp

    m = copy.deepcopy(model)
    mlp_in = {mod for n, mod in m.named_modules() if n.endswith(("mlp.gate_proj", "mlp.up_proj"))}
    ignored = [mod for mod in m.modules() if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)) and mod not in mlp_in]
    imp = (tp.importance.GroupMagnitudeImportance(p=2) if importance == "magnitude"
           else tp.importance.GroupTaylorImportance())
    ratio = 1 - keep / m.config.intermediate_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the RMSNorm weights it cannot place: they are not cut here
        pruner = tp.pruner.MetaPruner(m, torch.tensor([rows[0]]), importance=imp, pruning_ratio=ratio,
                                      ignored_layers=ignored, global_pruning=False, output_transform=lambda o: o.logits)
    if importance == "taylor":  # first-order: the gradient of the calibration rows' next-token loss
        m.zero_grad()
        for r in rows:
            ids = torch.tensor([r])
            logits = m(ids).logits[0, :-1]
            (torch.nn.functional.cross_entropy(logits, ids[0, 1:]) / len(rows)).backward()
    pruner.step()
    m.zero_grad(set_to_none=True)
    return m


def main() -> None:
    args = parse()
    if _version("torch-pruning") is None:
        raise SystemExit("torch-pruning is not installed: pip install torch-pruning==1.6.1 (the bench extra)")
    with tempfile.TemporaryDirectory(prefix="prune_vs_tp_") as work:  # saved cuts: ~0.5 GB each for the embedded model
        compare(args, Path(work))


def compare(args: argparse.Namespace, work: Path) -> None:
    import torch

    from posttrain.compress.importance import activation_importance, kind
    from posttrain.compress.prune import calibration_rows, sizes_for_params
    from posttrain.compress.search import heldout_nll
    from posttrain.compress.slicing import prune_model
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.models.loading import load_model

    torch.manual_seed(0)
    loaded = load_model(args.model, device="cpu", dtype=torch.float32)
    model, tok = loaded.model.eval(), loaded.tokenizer
    if kind(model) != "llama":
        raise SystemExit(f"{args.model}: this bench compares Llama-style MLP cuts only")
    calib_file = work / "calib.jsonl"
    write_jsonl(arithmetic_rows(args.calib, 0, "train"), calib_file)
    rows = calibration_rows(str(calib_file), tok, args.calib, 256)
    held, _ = tokenize_rows(tok, list(arithmetic_rows(args.heldout, 0, "dev")), 512)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    nll = lambda m: heldout_nll(m, held, 512, "auto", pad)  # noqa: E731
    sizes = sizes_for_params(model.config, args.params, ["mlp_hidden"])
    probe = torch.tensor([rows[0][:32]])
    load_before = os.getloadavg()[0]
    full = {"params": sum(p.numel() for p in model.parameters()), "nll": nll(model),
            "intermediate_size": model.config.intermediate_size}

    cuts: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    small = prune_model(model, activation_importance(model, rows), sizes).eval()
    cuts["posttrain"] = {"seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in small.parameters()),
                         "nll": nll(small), "as_saved": loads_in_transformers(small, tok, work / "posttrain", probe)}
    for importance in ("magnitude", "taylor"):
        t0 = time.perf_counter()
        m = torch_pruning_cut(model, rows, sizes.mlp_hidden, importance).eval()
        got = {"seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in m.parameters()), "nll": nll(m),
               "intermediate_size": m.model.layers[0].mlp.gate_proj.out_features,
               "as_saved": loads_in_transformers(m, tok, work / f"tp_{importance}", probe)}
        widths = {layer.mlp.gate_proj.out_features for layer in m.model.layers}
        if len(widths) == 1:  # what torch-pruning's LLM example does by hand: tell the config the new width
            m.config.intermediate_size = widths.pop()
            got["after_config_edit"] = loads_in_transformers(m, tok, work / f"tp_{importance}_edited", probe)
        cuts[f"torch-pruning {importance}"] = got
    load_after = os.getloadavg()[0]

    print(f"| cut (mlp_hidden {full['intermediate_size']} → {sizes.mlp_hidden}) | params | held-out NLL | "
          "prune s | loads in transformers as saved | after config edit |")
    print("|---|---:|---:|---:|---|---|")
    print(f"| unpruned {args.model} | {full['params']:,} | {full['nll']:.4f} | — | — | — |")
    for name, c in cuts.items():
        edit = c.get("after_config_edit")
        print(f"| {name} | {c['params']:,} | {c['nll']:.4f} | {c['seconds']:.2f} | {said(c['as_saved'])} | "
              f"{said(edit) if edit else '—'} |")
    if not args.no_record:
        append_row(Path(args.results), {"bench": "prune_vs_torch_pruning", "args": vars(args), "unpruned": full,
                                        "mlp_hidden": sizes.mlp_hidden, "cuts": cuts,
                                        "torch_pruning": _version("torch-pruning"),
                                        **provenance("dev", machine(load_before, load_after))})
    p, mag, tay = cuts["posttrain"], cuts["torch-pruning magnitude"], cuts["torch-pruning taylor"]
    print(f"RESULT prune_vs_torch_pruning: {p['nll']:.3f} nats/token (posttrain's held-out NLL right after cutting "
          f"{args.model}'s MLP to {sizes.mlp_hidden} channels, {p['params']:,} params; torch-pruning magnitude "
          f"{mag['nll']:.3f}, taylor {tay['nll']:.3f}; unpruned {full['nll']:.3f}; loads in plain transformers as "
          f"saved: posttrain {said(p['as_saved'])}, torch-pruning {said(mag['as_saved'])}"
          f"{'; SMOKE: random tiny model, not a figure' if args.smoke else ''})")


def said(r: dict[str, Any]) -> str:
    if not r["loads"]:
        return "no (weights do not match its config's sizes)" if "mismatch" in r["error"] else f"no ({r['error'][:80]})"
    return f"yes, intermediate_size {r['intermediate_size']}, same logits: {r['same_logits']}"


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

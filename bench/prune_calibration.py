"""Which calibration set to prune with: rows, row length and aggregation against the loss right after the cut.

    python bench/prune_calibration.py --model runs/sft/checkpoints/step_000060 --data runs/pipeline/data/train.jsonl
    python bench/prune_calibration.py --smoke --no-record        # tiny Llama: the code path only

``posttrain prune`` scores every unit on ``calibration.samples`` conversations cut to
``calibration.max_seq_len`` tokens, per-token magnitudes reduced by ``calibration.aggregation``
(docs/prune.md). This bench measures those three choices one at a time from the defaults (64 rows,
256 tokens, ``mean``): rows in ``--samples``, lengths in ``--lengths``, aggregation ``mean`` and
``l2``; each setting with ``--draws`` calibration draws (``calibration_rows``' seed: another shuffle
of ``--data``; the draws of one seed are nested, so 8 rows are the first 8 of the 64).

Per setting and draw, the same model is cut two ways at ``--params`` parameters, with no
distillation: **mlp** (``mlp_hidden`` only) and **mix** (the default ``axes_mix``: MLP channels and
layers by the same fraction; layers ranked by ``depth_metric=cosine`` on the same rows). The score
is the held-out cross-entropy (nats per assistant token) on **dev**-split conversations:
``--heldout`` arithmetic rows and ``--heldout`` instruction rows with their scripted reference
replies (never the test split; the data are the training split).

**The rule that picks each default, stated before any figure:** per choice (rows, length), the
cheapest value (fewest calibration tokens) whose mean loss over draws, averaged over the two cuts, is
within max(2 paired se, 0.01 nats) of the best value's; aggregation: ``l2`` replaces ``mean`` only if
it is lower by more than that margin. Paired: draw by draw (same seed), the difference to the best.
Ends with ``RESULT prune_calibration: ...``; the row goes to bench/results/prune_calibration.jsonl
unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import posttrain  # noqa: F401,E402  (before torch: the MKL shim of models/blas.py)
from results_row import append_row, machine, mean_se, provenance, record_args, refuse_smoke_record  # noqa: E402  (bench/results_row.py)

RESULTS = ROOT / "bench" / "results" / "prune_calibration.jsonl"
DEFAULT = {"samples": 64, "max_seq_len": 256, "aggregation": "mean"}  # configs/prune.py: CalibrationConfig
CUTS = {"mlp": ["mlp_hidden"], "mix": ["mlp_hidden", "layers"]}
MARGIN = 0.01  # nats/token: a difference below this is not worth more calibration compute


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the model cut (an SFT checkpoint; required unless --smoke)")
    ap.add_argument("--data", help="conversation JSONL the calibration rows are drawn from (training data)")
    ap.add_argument("--params", type=float, default=1.0e8)
    ap.add_argument("--samples", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--draws", type=int, default=3, help="calibration draws (seeds) per setting")
    ap.add_argument("--heldout", type=int, default=100, help="dev conversations per domain (arithmetic, instruction)")
    ap.add_argument("--smoke", action="store_true", help="tiny-llama, tiny grid (figures mean nothing)")
    record_args(ap, RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.model, args.params, args.samples, args.lengths, args.draws, args.heldout = \
            "tiny-llama", 8.0e4, [4, 8], [32, 64], 2, 8
        refuse_smoke_record(ap, args, RESULTS)
    if not args.model:
        ap.error("--model is required (the checkpoint to prune), or --smoke")
    return args


def settings(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One factor at a time from DEFAULT; the default itself once."""
    out = [dict(DEFAULT)]
    out += [{**DEFAULT, "samples": n} for n in args.samples if n != DEFAULT["samples"]]
    out += [{**DEFAULT, "max_seq_len": n} for n in args.lengths if n != DEFAULT["max_seq_len"]]
    out.append({**DEFAULT, "aggregation": "l2"})
    return out


def key(s: dict[str, Any]) -> str:
    return f"{s['samples']}x{s['max_seq_len']}/{s['aggregation']}"


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and se of a − b, draw by draw."""
    return mean_se([x - y for x, y in zip(a, b)])


def pick(values: list[Any], losses: dict[Any, list[float]], cost: dict[Any, int]) -> tuple[Any, dict[Any, Any]]:
    """The module docstring's rule: the cheapest value within max(2 se, MARGIN) of the best mean."""
    mean = {v: sum(losses[v]) / len(losses[v]) for v in values}
    best = min(values, key=lambda v: mean[v])
    diffs = {v: paired(losses[v], losses[best]) for v in values}
    ok = [v for v in values if diffs[v][0] <= max(2 * (diffs[v][1] if not math.isnan(diffs[v][1]) else 0), MARGIN)]
    return min(ok, key=lambda v: cost[v]), {v: {"mean": mean[v], "minus_best": diffs[v]} for v in values}


def main() -> None:
    args = parse()
    import tempfile

    import torch

    from posttrain.compress.importance import activation_importance
    from posttrain.compress.prune import calibration_rows, sizes_for_params
    from posttrain.compress.search import heldout_nll
    from posttrain.compress.slicing import prune_model
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.envs.base import make_env
    from posttrain.experiments.stages import RL_INSTRUCTION
    from posttrain.models.loading import load_model

    torch.manual_seed(0)
    loaded = load_model(args.model, device="cpu", dtype=torch.float32)
    model, tok = loaded.model.eval(), loaded.tokenizer
    tmp = tempfile.TemporaryDirectory(prefix="prune_calib_")
    data = args.data
    if not data:  # the training split of the pipeline's two domains
        data = str(Path(tmp.name) / "calib.jsonl")
        write_jsonl(arithmetic_rows(max(args.samples) * 2, 0, "train"), data)
    instr = make_env("instruction", **RL_INSTRUCTION).tasks("dev", args.heldout, seed=0)
    held_rows = list(arithmetic_rows(args.heldout, 0, "dev")) + [
        {"messages": [*t.messages, {"role": "assistant", "reasoning_content": "",
                                    "content": t.metadata["reference_response"]}]} for t in instr]
    held, _ = tokenize_rows(tok, held_rows, 512)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    sizes = {c: sizes_for_params(model.config, args.params, axes) for c, axes in CUTS.items()}
    load_before, t0 = os.getloadavg()[0], time.time()
    unpruned = heldout_nll(model, held, 512, "auto", pad)
    runs: dict[str, dict[str, Any]] = {}
    for s in settings(args):
        r = runs[key(s)] = {**s, "tokens": [], "seconds": [], **{c: [] for c in CUTS}}
        for draw in range(args.draws):
            rows = calibration_rows(data, tok, s["samples"], s["max_seq_len"], seed=draw)
            t = time.perf_counter()
            with torch.no_grad():
                imp = activation_importance(model, rows, s["aggregation"], "cosine")
            r["seconds"].append(time.perf_counter() - t)
            r["tokens"].append(sum(len(x) for x in rows))
            for c in CUTS:
                r[c].append(heldout_nll(prune_model(model, imp, sizes[c]).eval(), held, 512, "auto", pad))
            print(f"{key(s)} draw {draw}: " + ", ".join(f"{c} {r[c][-1]:.4f}" for c in CUTS), flush=True)
        r["both"] = [(a + b) / 2 for a, b in zip(r["mlp"], r["mix"])]
    minutes = (time.time() - t0) / 60

    def choose(field: str, values: list[Any]) -> tuple[Any, dict[Any, Any]]:
        ks = {v: key({**DEFAULT, field: v}) for v in values}
        return pick(values, {v: runs[ks[v]]["both"] for v in values},
                    {v: sum(runs[ks[v]]["tokens"]) for v in values})
    n_pick, n_table = choose("samples", sorted({*args.samples, DEFAULT["samples"]}))
    l_pick, l_table = choose("max_seq_len", sorted({*args.lengths, DEFAULT["max_seq_len"]}))
    l2 = paired(runs[key({**DEFAULT, "aggregation": "l2"})]["both"], runs[key(DEFAULT)]["both"])
    agg = "l2" if l2[0] < -max(2 * (l2[1] if not math.isnan(l2[1]) else 0), MARGIN) else "mean"

    print(f"\nheld-out NLL right after the cut, dev ({len(held)} conversations), {args.draws} draws; unpruned {unpruned:.4f}")
    print("| calibration | tokens | importance s | mlp | mix |")
    print("|---|---:|---:|---:|---:|")
    for k, r in runs.items():
        ms = lambda xs: "{:.4f} ± {:.4f}".format(*mean_se(xs))  # noqa: E731
        print(f"| {k} | {sum(r['tokens']) // len(r['tokens']):,} | {sum(r['seconds']) / len(r['seconds']):.1f} | "
              f"{ms(r['mlp'])} | {ms(r['mix'])} |")
    if not args.no_record:
        append_row(Path(args.results), {
            "bench": "prune_calibration", "args": vars(args), "minutes": round(minutes, 1), "unpruned": unpruned,
            "sizes": {c: s.__dict__ for c, s in sizes.items()}, "runs": runs,
            "picked": {"samples": n_pick, "max_seq_len": l_pick, "aggregation": agg},
            "samples_table": {str(k): v for k, v in n_table.items()},
            "length_table": {str(k): v for k, v in l_table.items()}, "l2_minus_mean": l2,
            **provenance("dev", machine(load_before, os.getloadavg()[0]))})
    d = runs[key(DEFAULT)]["both"]
    print(f"RESULT prune_calibration: {sum(d) / len(d):.3f} nats/token (dev loss right after cutting {args.model} to "
          f"{args.params:.3g} params, mean of the mlp and mix cuts at the defaults 64 rows × 256 tokens, mean; "
          f"by the rule: {n_pick} rows, {l_pick} tokens, {agg}; l2 − mean {l2[0]:+.4f} ± {l2[1]:.4f}; "
          f"{args.draws} draws; unpruned {unpruned:.3f}{'; SMOKE: random tiny model, not a figure' if args.smoke else ''})")


if __name__ == "__main__":
    main()

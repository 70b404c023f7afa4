"""``posttrain prune-search``: which axes to cut, decided by a short distillation of each (MiniPuzzle idea).

Minitron cuts a model to a size; *which* axes to cut (MLP width, heads, embedding width, depth, a
mix) changes how much a distillation budget can recover. MiniPuzzle and Puzzle search over the
architectures; this is the small version of that idea:

1. **Candidates** (``candidates``): each is a set of axes, cut by one shared fraction until the model
   has at most ``params`` parameters (``prune.sizes_for_params``, on the config alone). Every
   candidate's sizes are computed before any weight is read, so an axis the model lacks or a count
   it cannot reach fails in one line naming the candidate.
2. **Importance once**: the unpruned model's activations on the calibration rows are scored once
   (``importance.py``) and every candidate is cut from the same scores (``slicing.py``), written to
   ``out/candidates/<name>/model``.
3. **The same short distillation for each** from the unpruned model (``distill_logits.py``, the
   ``posttrain distill-logits`` stage, unchanged): ``distill.train.steps`` × ``batch_size``
   conversations, same data order, same learning rate. With ``distill.topk`` the teacher's top-k
   runs once into a cache that every candidate reads.
4. **Scored on held-out rows** of the distillation data, before and after the budget: the KL to the
   teacher (the stage's ``val_kl``) and the cross-entropy on the data's assistant tokens (``nll``).
5. **Chosen by a rule stated in numbers** (``choose``): the lowest ``select.metric`` after the budget;
   candidates within ``select.tie_tolerance`` nats/token of it tie, and a tie goes to the fewest
   parameters, then the faster greedy decode (tokens/s, measured when ``decode_tokens`` > 0), then
   the earlier candidate. The winner's distilled weights are copied to ``out/chosen``.

``out/search.json`` and ``out/search.md`` hold the table: per candidate its axes' sizes, parameters,
held-out KL and NLL before and after distillation, decode tokens/s and which one was chosen.

Departures from MiniPuzzle/Puzzle, and why: candidates are whole-model uniform cuts (plain HF configs
have one width per axis), not per-layer block variants; they are scored after a short *global*
distillation, not by blockwise local distillation, and chosen from a list, not by mixed-integer
programming over a hardware cost. Short-budget rankings need not hold after a long budget; the
table says what was measured, and ``bench/prune.py`` checks the pick against width- and depth-only
cuts at a longer budget.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from posttrain.compress.prune import check_inputs, load_and_score, sizes_for_params, write_pruned
from posttrain.compress.slicing import PruneError, Sizes
from posttrain.configs.prune import DistillLogitsConfig, LogitTeacherConfig, PruneSearchConfig


class SearchError(PruneError):
    """A search that cannot run as configured (a candidate the model cannot be cut to)."""


@dataclass(frozen=True)
class Scored:
    """What the rule reads of one candidate."""

    name: str
    params: int
    loss: float  # the rule's held-out figure after the budget (nats/token), lower is better
    decode_tokens_per_s: float | None = None


def choose(rows: Sequence[Scored], tie_tolerance: float) -> int:
    """Index of the chosen candidate: the lowest finite ``loss``; those within ``tie_tolerance`` of it
    tie, and the tie goes to the fewest parameters, then the highest decode tokens/s (unmeasured counts
    as slowest), then the earliest row."""
    finite = [i for i, r in enumerate(rows) if math.isfinite(r.loss)]
    if not finite:
        raise SearchError("no candidate has a finite held-out loss after distillation: nothing to choose from")
    best = min(rows[i].loss for i in finite)
    tied = [i for i in finite if rows[i].loss <= best + tie_tolerance]
    return min(tied, key=lambda i: (rows[i].params, -(rows[i].decode_tokens_per_s or 0.0), i))


def candidate_sizes(hf_config: Any, cfg: PruneSearchConfig) -> dict[str, Sizes]:
    """Every candidate's sizes, from the config alone; a candidate that cannot be cut to ``params`` is
    one :class:`SearchError` line naming it."""
    out = {}
    for i, c in enumerate(cfg.candidates):
        try:
            out[c.label] = sizes_for_params(hf_config, cfg.params, list(c.axes), ("params", f"candidates[{i}].axes"))
        except PruneError as e:
            raise SearchError(f"candidate {c.label}: {e}") from None
    return out


def distill_config(cfg: PruneSearchConfig, student: Path, run_dir: Path, cache_dir: Path | None = None) -> DistillLogitsConfig:
    """The ``posttrain distill-logits`` config of one candidate: the search's budget, the unpruned model
    as teacher, the shared top-k cache when ``distill.topk`` is set (in ``cache_dir``, default the
    search's folder: a run whose trained rows differ, another seed, needs its own)."""
    d, k = cfg.distill, cfg.distill.topk
    cache = None if k is None else str(Path(cache_dir or cfg.out) / f"teacher_top{k}.safetensors")
    return DistillLogitsConfig(model=str(student), run_dir=str(run_dir),
                               teacher=LogitTeacherConfig(model=cfg.model, topk=k, cache=cache),
                               loss=d.loss, data=d.data, optim=d.optim, moe=d.moe, train=d.train)


def heldout_nll(model: Any, examples: list[Any], max_len: int, pack: str, pad_id: int) -> float:
    """Token-mean cross-entropy on the held-out rows' assistant tokens (``train/sft.py``'s), fp32."""
    import contextlib

    from posttrain.models.facts import use_packing
    from posttrain.train.sft import heldout_loss

    return heldout_loss(model, examples, max_len, use_packing(model, pack), pad_id, contextlib.nullcontext).loss


def decode_speed(model: Any, prompt_ids: list[int], new_tokens: int, pad_id: int = 0) -> float:
    """Greedy decode tokens/s at batch 1 with the KV cache: ``new_tokens`` forced (EOS cannot end it
    early, so every model decodes the same count), after a 2-token warm-up."""
    import torch

    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)
    kw = dict(do_sample=False, use_cache=True, pad_token_id=pad_id)
    was = model.training
    model.eval()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        dt = time.perf_counter() - t0
    model.train(was)
    return new_tokens / dt


@dataclass
class CandidateRow:
    name: str
    axes: list[str]
    sizes: dict[str, Any]
    params: int
    calib_loglik: float  # calibration log-likelihood right after the cut (higher is better)
    kl_before: float
    kl_after: float
    nll_before: float
    nll_after: float
    decode_tokens_per_s: float | None
    checkpoint: str
    distill_seconds: float
    chosen: bool = False


@dataclass
class SearchResult:
    out: Path
    rows: list[CandidateRow]
    chosen: CandidateRow
    teacher: dict[str, Any]


def check_search(cfg: PruneSearchConfig) -> dict[str, Sizes]:
    """Everything that can fail before a weight is read: the data files, the calibration file, a LoRA
    directory, every candidate's sizes."""
    from posttrain.models.loading import model_config
    from posttrain.train.sft import check_data_files

    check_inputs(cfg.model, cfg.calibration.path)
    if not cfg.distill.data.train:
        raise SearchError("distill.data.train is empty: the candidates need SFT-format JSONL to be distilled on")
    check_data_files(distill_config(cfg, Path(cfg.out), Path(cfg.out)))  # type: ignore[arg-type]
    return candidate_sizes(model_config(cfg.model), cfg)


def run_search(cfg: PruneSearchConfig, progress: bool = False) -> SearchResult:
    """The whole command: see the module docstring."""
    from posttrain.compress.distill_logits import train_distill_logits
    from posttrain.compress.importance import mean_loglik
    from posttrain.models.loading import load_model
    from posttrain.train.sft import load_sft_data

    planned = check_search(cfg)
    out = Path(cfg.out)
    model, tok, rows, imp = load_and_score(cfg.model, cfg.calibration, cfg.depth_metric)
    calib_full = mean_loglik(model, rows)
    held = load_sft_data(distill_config(cfg, out, out), tok).validation  # type: ignore[arg-type]
    if not held:
        raise SearchError("distill.data gives no held-out rows (set val_frac > 0 or validation): nothing to score on")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    nll = lambda m: heldout_nll(m, held, cfg.distill.data.max_seq_len, cfg.distill.data.pack, pad_id)  # noqa: E731
    prompt = held[0].input_ids[: held[0].loss_mask.index(1) if 1 in held[0].loss_mask else 16]  # up to the reply
    speed = lambda m: decode_speed(m, prompt, cfg.decode_tokens, pad_id) if cfg.decode_tokens else None  # noqa: E731
    teacher = {"model": cfg.model, "params": sum(p.numel() for p in model.parameters()), "nll": nll(model),
               "calib_loglik": calib_full, "decode_tokens_per_s": speed(model)}
    record = {"source": cfg.model, "calibration": cfg.calibration.model_dump(), "depth_metric": cfg.depth_metric}
    pruned = {}
    for c in cfg.candidates:  # every cut first: the unpruned model can then be freed before training
        res = write_pruned(model, imp, planned[c.label], tok, rows, out / "candidates" / c.label / "model",
                           {**record, "search_candidate": c.label}, calib_full)
        pruned[c.label] = res
    del model, imp
    table: list[CandidateRow] = []
    for c in cfg.candidates:
        res = pruned[c.label]
        small = load_model(str(res.out), device="cpu").model
        nll_before = nll(small)
        dres = train_distill_logits(distill_config(cfg, res.out, out / "candidates" / c.label / "distill"), progress)
        small = load_model(str(dres.checkpoint), device="cpu").model
        row = CandidateRow(c.label, list(c.axes), asdict(res.sizes), res.params_after, res.calib_loglik_after,
                           dres.val_kl_before, dres.val_kl_after, nll_before, nll(small),
                           speed(small),
                           str(dres.checkpoint), dres.seconds)
        table.append(row)
        print(f"[prune-search] {c.label}: {row.params / 1e6:.3f}M params, held-out KL {row.kl_before:.4f} → "
              f"{row.kl_after:.4f}, NLL {row.nll_before:.4f} → {row.nll_after:.4f}", flush=True)
    metric = "kl_after" if cfg.select.metric == "kl" else "nll_after"
    pick = choose([Scored(r.name, r.params, getattr(r, metric), r.decode_tokens_per_s) for r in table],
                  cfg.select.tie_tolerance)
    table[pick].chosen = True
    chosen_dir = out / "chosen"
    shutil.rmtree(chosen_dir, ignore_errors=True)  # a re-run replaces it whole: no stale file survives
    shutil.copytree(table[pick].checkpoint, chosen_dir, ignore=shutil.ignore_patterns("trainer_state.pt"))
    result = SearchResult(out, table, table[pick], teacher)
    write_table(cfg, result)
    return result


def write_table(cfg: PruneSearchConfig, r: SearchResult) -> None:
    """``search.json`` (config, teacher, rows, rule) and ``search.md`` (the same as a table)."""
    rule = (f"lowest held-out {cfg.select.metric} after {cfg.distill.train.steps} distillation steps of "
            f"{cfg.distill.train.batch_size} conversations; within {cfg.select.tie_tolerance} nats/token: fewest "
            "params, then fastest decode, then list order")
    (r.out / "search.json").write_text(json.dumps({
        "config": cfg.model_dump(), "rule": rule, "teacher": r.teacher, "chosen": r.chosen.name,
        "candidates": [asdict(x) for x in r.rows]}, indent=1) + "\n")
    fmt = lambda x: "—" if x is None else f"{x:.0f}"  # noqa: E731
    lines = [f"# prune-search: {cfg.model} → ≤ {cfg.params:.4g} parameters", "", f"Rule: {rule}.", "",
             "| candidate | sizes (mlp_hidden / heads / kv / hidden / layers) | params | held-out KL before → after | "
             "held-out NLL before → after | decode tok/s | chosen |",
             "|---|---|---:|---:|---:|---:|---|"]
    t = r.teacher
    lines.append(f"| teacher (unpruned) | — | {t['params']:,} | 0 | {t['nll']:.4f} | {fmt(t['decode_tokens_per_s'])} | |")
    for x in r.rows:
        s = x.sizes
        sizes = f"{s['mlp_hidden']} / {s['heads']} / {s['kv_heads']} / {s['hidden']} / {s['layers']}"
        lines.append(f"| {x.name} | {sizes} | {x.params:,} | {x.kl_before:.4f} → {x.kl_after:.4f} | "
                     f"{x.nll_before:.4f} → {x.nll_after:.4f} | {fmt(x.decode_tokens_per_s)} | "
                     f"{'**yes**' if x.chosen else ''} |")
    (r.out / "search.md").write_text("\n".join(lines) + "\n")

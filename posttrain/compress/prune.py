"""``posttrain prune``: calibration rows → importance → the target's sizes → a smaller HF checkpoint.

A ``params`` target is met by cutting the ``axes_mix`` axes by one shared fraction f of their size,
found by bisection on the parameter count of the config (meta-device models, no weights), with
each size rounded to what the axis allows (heads to a multiple of the KV groups, hidden to 8).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.compress.slicing import PruneError, Sizes, check_target, count_params, current_sizes, new_config


@dataclass
class PruneResult:
    out: Path
    sizes: Sizes
    params_before: int
    params_after: int
    calib_loglik_before: float
    calib_loglik_after: float


def check_not_adapter(spec: str) -> None:
    p = Path(spec)
    if (p / "adapter_config.json").exists():
        raise PruneError(f"{spec} holds LoRA adapters (adapter_config.json): merge them first (a posttrain "
                         "checkpoint is saved merged) and prune the merged model")


def check_inputs(spec: str, calibration_path: str) -> None:
    """What ``prune`` and ``prune-search`` refuse before any weight is read: a LoRA directory, a
    missing calibration file."""
    check_not_adapter(spec)
    if not Path(calibration_path).is_file():
        raise PruneError(f"calibration.path={calibration_path}: no such file")


def sizes_for_params(cfg: Any, target_params: float, axes: list[str],
                     fields: tuple[str, str] = ("target.params", "target.axes_mix")) -> Sizes:
    """The shared cut fraction over ``axes`` whose model has at most ``target_params`` parameters.
    ``fields``: the config fields an error names (the count, the axes)."""
    params_field, axes_field = fields
    from types import SimpleNamespace

    now = current_sizes(cfg)
    llama = cfg.model_type != "nemotron_h"

    def at(f: float) -> Sizes:
        t = SimpleNamespace(mlp_hidden=None, heads=None, kv_heads=None, hidden=None, layers=None, mamba_heads=None,
                            experts=None)
        for a in axes:
            old = getattr(now, a)
            if old is None:
                raise PruneError(f"{axes_field}: this {cfg.model_type} model has no axis {a!r}")
            n = max(1, round(old * (1 - f)))
            if a == "heads":
                n = max(now.kv_heads, n - n % now.kv_heads)
                while llama and "hidden" not in axes and now.hidden % n and n > now.kv_heads:
                    n -= now.kv_heads  # transformers' Llama-style configs want hidden % heads == 0
            if a == "hidden":
                n = max(8, n - n % 8)
            if a == "mamba_heads":
                n = max(cfg.n_groups, n - n % cfg.n_groups)
            if a == "experts":
                n = max(cfg.num_experts_per_tok, n - n % cfg.n_group)
            setattr(t, a, n)
        if llama and "hidden" in axes:  # a multiple of 8 and of the heads kept (transformers refuses others)
            step = math.lcm(8, t.heads or now.heads)
            t.hidden = max(step, t.hidden - t.hidden % step)
        return check_target(cfg, t)

    counted: dict[tuple[Any, ...], int] = {}

    def params(f: float) -> int:
        # sizes are integers, so most of the bisection's fractions give sizes already counted: each
        # count builds a meta model (~0.1 s for a 30-layer one)
        s = at(f)
        key = tuple(s.__dict__.values())
        if key not in counted:
            counted[key] = count_params(new_config(cfg, s, list(range(s.layers))))
        return counted[key]

    if params(0.0) <= target_params:
        return at(0.0)
    if params(0.99) > target_params:
        raise PruneError(f"{params_field}={target_params:.3g} is out of reach by cutting {axes} alone "
                         f"(smallest: {params(0.99):.3g}); add axes to {axes_field}")
    lo, hi = 0.0, 0.99
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if params(mid) <= target_params else (mid, hi)
    return at(hi)


def target_sizes(cfg: Any, target: Any) -> Sizes:
    """The sizes a ``PruneTarget`` asks of a model with config ``cfg`` (a parameter count, or per axis)."""
    return sizes_for_params(cfg, target.params, target.axes_mix) if target.params else check_target(cfg, target)


def calibration_rows(path: str, tokenizer: Any, samples: int, max_len: int, seed: int = 0) -> list[list[int]]:
    import random

    from posttrain.data.conversations import read_conversations
    from posttrain.models.chat_template import render

    rows, _ = read_conversations(path, on_error="skip")
    random.Random(seed).shuffle(rows)
    # Every token of the rendered conversation is calibration, prompt included: tokenize_rows would
    # drop a row whose prompt alone is longer than max_len (it has no trained token left), so a short
    # max_seq_len silently meant fewer rows.
    out = [render(tokenizer, r["messages"], r.get("tools"), reasoning=r.get("reasoning", True)).input_ids[:max_len]
           for r in rows[:samples]]
    if not out:
        raise PruneError(f"calibration.path={path}: no usable conversation rows")
    return out


def load_and_score(spec: str, calibration: Any, depth_metric: str, seed: int = 0) -> tuple[Any, Any, list[list[int]], Any]:
    """(model in float32 on the CPU, tokenizer, calibration rows, importance of every unit): what every
    cut of ``spec`` starts from; ``prune-search`` measures it once for all its candidates."""
    import torch

    from posttrain.compress.importance import activation_importance
    from posttrain.models.loading import load_model

    loaded = load_model(spec, device="cpu", dtype=torch.float32, seed=seed)
    model, tok = loaded.model, loaded.tokenizer
    rows = calibration_rows(calibration.path, tok, calibration.samples, calibration.max_seq_len, seed)
    return model, tok, rows, activation_importance(model, rows, calibration.aggregation, depth_metric)


def write_pruned(model: Any, imp: Any, sizes: Sizes, tok: Any, rows: list[list[int]], out: Path,
                 record: dict[str, Any], calib_before: float | None = None) -> PruneResult:
    """Cut ``model`` to ``sizes``, save it to ``out`` (a plain HF directory) with ``prune.json``: the
    sizes, parameter counts and calibration log-likelihood before and after, and ``record``."""
    from posttrain.compress.importance import mean_loglik
    from posttrain.compress.slicing import prune_model
    from posttrain.train.checkpoint import save_hf_model

    small = prune_model(model, imp, sizes)
    before = mean_loglik(model, rows) if calib_before is None else calib_before
    after = mean_loglik(small, rows)
    save_hf_model(small, tok, out)
    res = PruneResult(out, sizes, sum(p.numel() for p in model.parameters()),
                      sum(p.numel() for p in small.parameters()), before, after)
    (out / "prune.json").write_text(json.dumps({
        **record, "sizes": sizes.__dict__, "params_before": res.params_before, "params_after": res.params_after,
        "calib_loglik_before": before, "calib_loglik_after": after}, indent=1) + "\n")
    return res


def run_prune(cfg: Any) -> PruneResult:
    """The whole command: see the module docstring. Target checked against config.json first."""
    from posttrain.models.loading import model_config

    check_inputs(cfg.model, cfg.calibration.path)
    target_sizes(model_config(cfg.model), cfg.target)  # fail on the target before any weight is read
    model, tok, rows, imp = load_and_score(cfg.model, cfg.calibration, cfg.depth_metric, cfg.seed)
    sizes = target_sizes(model.config, cfg.target)
    return write_pruned(model, imp, sizes, tok, rows, Path(cfg.out), {
        "source": cfg.model, "calibration": cfg.calibration.model_dump(), "depth_metric": cfg.depth_metric})

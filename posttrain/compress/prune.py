"""``posttrain prune``: calibration rows → importance → the target's sizes → a smaller HF checkpoint.

A ``params`` target is met by cutting the ``axes_mix`` axes by one shared fraction f of their size,
found by bisection on the parameter count of the config (meta-device models, no weights), with
each size rounded to what the axis allows (heads to a multiple of the KV groups, hidden to 8).
"""

from __future__ import annotations

import json
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


def sizes_for_params(cfg: Any, target_params: float, axes: list[str]) -> Sizes:
    """The shared cut fraction over ``axes`` whose model has at most ``target_params`` parameters."""
    from types import SimpleNamespace

    now = current_sizes(cfg)

    def at(f: float) -> Sizes:
        t = SimpleNamespace(mlp_hidden=None, heads=None, kv_heads=None, hidden=None, layers=None, mamba_heads=None,
                            experts=None)
        for a in axes:
            old = getattr(now, a)
            if old is None:
                raise PruneError(f"target.axes_mix: this {cfg.model_type} model has no axis {a!r}")
            n = max(1, round(old * (1 - f)))
            if a == "heads":
                n = max(now.kv_heads, n - n % now.kv_heads)
            if a == "hidden":
                n = max(8, n - n % 8)
            if a == "mamba_heads":
                n = max(cfg.n_groups, n - n % cfg.n_groups)
            if a == "experts":
                n = max(cfg.num_experts_per_tok, n - n % cfg.n_group)
            setattr(t, a, n)
        return check_target(cfg, t)

    def params(f: float) -> int:
        s = at(f)
        return count_params(new_config(cfg, s, list(range(s.layers))))

    if params(0.0) <= target_params:
        return at(0.0)
    if params(0.99) > target_params:
        raise PruneError(f"target.params={target_params:.3g} is out of reach by cutting {axes} alone "
                         f"(smallest: {params(0.99):.3g}); add axes to target.axes_mix")
    lo, hi = 0.0, 0.99
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if params(mid) <= target_params else (mid, hi)
    return at(hi)


def calibration_rows(path: str, tokenizer: Any, samples: int, max_len: int, seed: int = 0) -> list[list[int]]:
    import random

    from posttrain.data.conversations import read_conversations
    from posttrain.data.examples import tokenize_rows

    rows, _ = read_conversations(path, on_error="skip")
    random.Random(seed).shuffle(rows)
    examples, _ = tokenize_rows(tokenizer, rows[:samples], max_len)
    if not examples:
        raise PruneError(f"calibration.path={path}: no usable conversation rows")
    return [e.input_ids for e in examples]


def run_prune(cfg: Any) -> PruneResult:
    """The whole command: see the module docstring. Target checked against config.json first."""
    import torch
    from transformers import AutoConfig

    from posttrain.compress.importance import activation_importance, mean_loglik
    from posttrain.compress.slicing import prune_model
    from posttrain.models.loading import load_model, resolve_spec
    from posttrain.train.checkpoint import save_hf_model

    check_not_adapter(cfg.model)
    where = resolve_spec(cfg.model)
    if not Path(cfg.calibration.path).is_file():
        raise PruneError(f"calibration.path={cfg.calibration.path}: no such file")
    if isinstance(where, Path):  # fail on the target before any weight is read
        hf = AutoConfig.from_pretrained(where)
        if cfg.target.params is None:
            check_target(hf, cfg.target)
    loaded = load_model(cfg.model, device="cpu", dtype=torch.float32, seed=cfg.seed)
    model, tok = loaded.model, loaded.tokenizer
    sizes = (sizes_for_params(model.config, cfg.target.params, cfg.target.axes_mix) if cfg.target.params
             else check_target(model.config, cfg.target))
    rows = calibration_rows(cfg.calibration.path, tok, cfg.calibration.samples, cfg.calibration.max_seq_len, cfg.seed)
    imp = activation_importance(model, rows, cfg.calibration.aggregation, cfg.depth_metric)
    small = prune_model(model, imp, sizes)
    before, after = mean_loglik(model, rows), mean_loglik(small, rows)
    out = Path(cfg.out)
    save_hf_model(small, tok, out)
    res = PruneResult(out, sizes, sum(p.numel() for p in model.parameters()),
                      sum(p.numel() for p in small.parameters()), before, after)
    (out / "prune.json").write_text(json.dumps({
        "source": cfg.model, "sizes": sizes.__dict__, "params_before": res.params_before,
        "params_after": res.params_after, "calib_loglik_before": before, "calib_loglik_after": after,
        "calibration": cfg.calibration.model_dump(), "depth_metric": cfg.depth_metric}, indent=1) + "\n")
    return res

"""Which modules become FP8: the model's *units* and the selective policies over them.

A *unit* is one sub-layer of a decoder block: in a hybrid NemotronH block the ``mixer`` (a Mamba-2
mixer, an attention layer or an MoE layer); in a Llama-style block ``self_attn`` and ``mlp``
separately. A unit is what a policy keeps in BF16 or turns to FP8, and what the sensitivity search
ranks. Inside a unit, the quantizable weights are its ``nn.Linear`` modules (Mamba ``in_proj`` /
``out_proj``, attention ``q/k/v/o_proj``, MLP and shared-expert projections) and the fused expert
tensors of an MoE layer (``experts.up_proj`` / ``down_proj``, [experts, out, in]).

Never quantized, whatever the policy (the recipe): embeddings, the LM head, the Mamba ``conv1d``
(not a Linear), norms, and routers (the MoE ``gate``).

Policies (``configs/quant.py: PolicyConfig``):

* ``all``: every unit FP8.
* ``recipe`` (Nemotron 3 Nano, docs/recipe.md §5): every attention unit stays BF16, and so does
  the Mamba unit closest before each attention unit (the one "feeding" it); all other Mamba units,
  all MoE experts and MLPs go FP8; the KV cache goes FP8. On a dense model (no Mamba) this keeps
  attention BF16 and puts the MLPs in FP8.
* ``patterns``: modules whose name matches one of the ``keep_bf16`` regexes stay BF16.
* ``searched``: the ``budget`` most sensitive units of a sensitivity ranking stay BF16, or, with
  ``budget_params``, the most sensitive units that fit in that many BF16 parameters (greedy down
  the ranking; ``"recipe"``: the recipe rule's count, for a comparison at equal memory).
* ``none``: nothing in FP8 (the BF16 reference).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import UserError

UNIT_CHILDREN = ("mixer", "self_attn", "mlp", "block_sparse_moe", "feed_forward")


@dataclass
class Unit:
    name: str  # module path, e.g. model.layers.2.mixer
    kind: str  # attention | mamba | moe | mlp
    layer: int
    linears: list[str] = field(default_factory=list)  # full module names of the quantizable Linears
    experts: list[str] = field(default_factory=list)  # full parameter names of fused expert tensors


@dataclass
class Plan:
    """What the quantizer does: ``linears`` and ``experts`` go FP8, ``kv`` lists the attention
    modules whose K/V go FP8; ``ignore`` is every Linear left in BF16 (the export's ignore list)."""

    linears: list[str]
    experts: list[str]
    kv: list[str]
    ignore: list[str]
    bf16_units: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"fp8_linears": self.linears, "fp8_experts": self.experts, "fp8_kv": self.kv,
                "ignore": self.ignore, "bf16_units": self.bf16_units}


def _kind(module: Any) -> str:
    name = type(module).__name__.lower()
    for key, kind in (("attention", "attention"), ("mamba", "mamba"), ("moe", "moe"), ("sparse", "moe")):
        if key in name:
            return kind
    return "mlp"


def _is_router(name: str, module: Any) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last in ("gate", "router") or "router" in type(module).__name__.lower()


def _layers(model: Any) -> tuple[str, Any]:
    import torch

    for name, mod in model.named_modules():
        if name.endswith("layers") and isinstance(mod, torch.nn.ModuleList):
            return name, mod
    raise UserError(f"{type(model).__name__}: no decoder layer list (a ModuleList named *layers) to quantize")


def find_units(model: Any) -> list[Unit]:
    """The model's units, in layer order (see the module docstring)."""
    import torch

    prefix, layers = _layers(model)
    units = []
    for i, block in enumerate(layers):
        for child in UNIT_CHILDREN:
            sub = getattr(block, child, None)
            if sub is None:
                continue
            uname = f"{prefix}.{i}.{child}"
            unit = Unit(uname, _kind(sub), i)
            for n, m in sub.named_modules():
                full = f"{uname}.{n}" if n else uname
                if isinstance(m, torch.nn.Linear) and not _is_router(n, m):
                    unit.linears.append(full)
                elif "experts" in type(m).__name__.lower() and not isinstance(m, torch.nn.ModuleList):
                    unit.experts += [f"{full}.{p}" for p, t in m.named_parameters(recurse=False) if t.dim() == 3]
            if unit.linears or unit.experts:
                units.append(unit)
    return units


def recipe_bf16_units(units: list[Unit]) -> list[str]:
    """The recipe's rule: attention units and, for each, the closest Mamba unit before it."""
    keep = []
    for i, u in enumerate(units):
        if u.kind != "attention":
            continue
        keep.append(u.name)
        feeder = next((v for v in reversed(units[:i]) if v.kind == "mamba"), None)
        if feeder is not None and feeder.name not in keep:
            keep.append(feeder.name)
    return [u.name for u in units if u.name in keep]


def read_ranking(path: str | Path) -> list[str]:
    """Unit names, most sensitive first, from a ``sensitivity.json`` written by the search."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"policy.ranking: {p} not found (write one with `posttrain quantize --search`)")
    rows = json.loads(p.read_text())["ranking"]
    return [r["unit"] for r in rows]


def unit_params(model: Any, unit: Unit) -> int:
    """Quantizable parameters of a unit (its Linears' weights and its expert tensors)."""
    n = sum(model.get_submodule(m).weight.numel() for m in unit.linears)
    return n + sum(model.get_parameter(p).numel() for p in unit.experts)


def within_params(model: Any, units: list[Unit], ranking: list[str], budget_params: int) -> list[str]:
    """Down the ranking, the units that still fit in ``budget_params`` parameters."""
    by_name = {u.name: u for u in units}
    keep, used = [], 0
    for name in ranking:
        n = unit_params(model, by_name[name])
        if used + n <= budget_params:
            keep.append(name)
            used += n
    return keep


def make_plan(
    model: Any, policy: str, keep_bf16: list[str] | None = None, ranking: list[str] | None = None,
    budget: int = 0, kv_cache: str = "auto", units: list[Unit] | None = None,
    budget_params: int | str | None = None,
) -> Plan:
    units = units if units is not None else find_units(model)
    names = [u.name for u in units]
    keep_modules: list[str] = []
    if policy == "all":
        keep_units: list[str] = []
    elif policy == "none":
        keep_units = list(names)
    elif policy == "recipe":
        keep_units = recipe_bf16_units(units)
    elif policy == "searched":
        if ranking is None:
            raise UserError("policy searched needs policy.ranking (a sensitivity.json)")
        unknown = [r for r in ranking if r not in names]
        if unknown:
            raise UserError(f"policy.ranking names units this model lacks: {', '.join(unknown[:5])}")
        if budget_params is None:
            keep_units = ranking[:budget]
        else:
            if budget_params == "recipe":
                by_name = {u.name: u for u in units}
                budget_params = sum(unit_params(model, by_name[n]) for n in recipe_bf16_units(units))
            keep_units = within_params(model, units, ranking, int(budget_params))
    elif policy == "patterns":
        try:
            rx = [re.compile(p) for p in keep_bf16 or []]
        except re.error as e:
            raise UserError(f"policy.keep_bf16: bad regex ({e})") from None
        keep_units = [u.name for u in units if any(r.search(u.name) for r in rx)]
        keep_modules = [m for u in units for m in u.linears + u.experts if any(r.search(m) for r in rx)]
    else:
        raise UserError(f"unknown policy {policy!r}")
    fp8_units = [u for u in units if u.name not in keep_units]
    linears = [m for u in fp8_units for m in u.linears if m not in keep_modules]
    experts = [m for u in fp8_units for m in u.experts if m not in keep_modules]
    kv_on = kv_cache == "on" or (kv_cache == "auto" and policy == "recipe")
    kv = [u.name for u in units if u.kind == "attention"] if kv_on else []
    import torch

    all_linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    ignore = [n for n in all_linears if n not in set(linears)]
    return Plan(linears=linears, experts=experts, kv=kv, ignore=ignore,
                bf16_units=[u.name for u in units if u.name in keep_units])

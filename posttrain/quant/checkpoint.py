"""The exported checkpoint: the compressed-tensors ``float-quantized`` layout that vLLM loads.

Written by hand (docs/quantization.md says why: llm-compressor cannot be installed beside our
transformers), to the layout compressed-tensors 0.20 writes and reads:

* ``config.json`` gains ``quantization_config`` = ``{"quant_method": "compressed-tensors",
  "format": "float-quantized", "quantization_status": "compressed", "config_groups": {"group_0":
  {"targets": ["Linear"], "weights": {num_bits 8, type float, strategy channel|tensor, symmetric,
  dynamic false}, "input_activations": {... strategy token + dynamic true | strategy tensor +
  dynamic false} or null}}, "ignore": [every Linear left in BF16, lm_head included],
  "kv_cache_scheme": {... strategy tensor, dynamic false} or null}``;
* for each FP8 Linear ``X``: ``X.weight`` (float8_e4m3fn, [out, in]), ``X.weight_scale`` (float32,
  [out, 1] per channel or [1] per tensor), and ``X.input_scale`` (float32, [1]) for static
  activations; for each FP8-KV attention module ``A``: ``A.k_scale`` and ``A.v_scale`` ([1]);
* MoE experts **per expert**, the layout of the original NemotronH checkpoints and the one vLLM's
  FusedMoE loader reads (transformers fuses them into one [E, out, in] tensor in memory and splits
  them again in ``save_pretrained``): ``M.E.up_proj.weight`` / ``M.E.down_proj.weight`` for expert
  ``E`` of the experts module ``M``, in FP8 with ``weight_scale`` ([out, 1] or [1]) and, for static
  activations, ``input_scale`` (the same value for every expert: vLLM takes their max anyway), or
  in ``rest_dtype`` when the layer stays BF16 (then listed in ``ignore``);
* everything else in ``rest_dtype`` (bf16 by default).

``load_fp8`` reads it back into a simulated FP8 model (``simulate.FP8Linear``) without
compressed-tensors; transformers with compressed-tensors installed reads it too.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import UserError
from posttrain.quant.fp8 import FP8_DTYPE
from posttrain.quant.simulate import (
    EXPERT_PROJS,
    FP8Experts,
    FP8Linear,
    install_kv,
    set_module,
)

CT_VERSION = "0.20.1"  # the compressed-tensors release whose layout this follows


def _args(strategy: str, dynamic: bool) -> dict[str, Any]:
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": dynamic,
            "group_size": None, "block_structure": None, "actorder": None, "observer": None if dynamic else "minmax",
            "observer_kwargs": {}}


def quantization_config(plan: Any, weights: str, activations: str, ignore: list[str] | None = None) -> dict[str, Any]:
    acts = None
    if activations == "dynamic":
        acts = _args("token", True)
    elif activations == "static":
        acts = _args("tensor", False)
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": _args(weights, False),
                                      "input_activations": acts, "output_activations": None,
                                      "format": "float-quantized"}},
        "ignore": list(plan.ignore) + list(ignore or []),
        "kv_cache_scheme": _args("tensor", False) if plan.kv else None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
        "version": CT_VERSION,
    }


def export(model: Any, tokenizer: Any, plan: Any, out: str | Path, weights: str, activations: str,
           kv_scales: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None, rest_dtype: str = "bf16",
           extra: dict[str, Any] | None = None) -> Path:
    """Write the simulated FP8 ``model`` (after ``simulate.apply_plan``) as a compressed-tensors
    checkpoint in ``out`` (temp dir + rename: a reader never sees half a checkpoint)."""
    from safetensors.torch import save_file

    out = Path(out)
    rest = torch.bfloat16 if rest_dtype == "bf16" else torch.float32
    fp8_names = set(plan.linears)
    tensors: dict[str, torch.Tensor] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FP8Linear):
            if name not in fp8_names:
                raise ValueError(f"{name} is FP8 but not in the plan")
            tensors[f"{name}.weight"] = mod.weight_fp8.contiguous()
            tensors[f"{name}.weight_scale"] = mod.weight_scale.contiguous()
            if mod.input_scale is not None:
                tensors[f"{name}.input_scale"] = mod.input_scale.contiguous()
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.detach().to(rest).contiguous()
    fused = {n: m for n, m in model.named_modules() if _is_fused_experts(m)}
    bf16_experts: list[str] = []
    for mod_name, mod in fused.items():
        for e in range(mod.up_proj.shape[0]):
            for proj in EXPERT_PROJS:
                key = f"{mod_name}.{e}.{proj}"
                if isinstance(mod, FP8Experts):
                    w, s = mod.per_expert(proj, e)
                    tensors[f"{key}.weight"], tensors[f"{key}.weight_scale"] = w.clone(), s.clone()
                    scale = mod.up_input_scale if proj == "up_proj" else mod.down_input_scale
                    if scale is not None:
                        tensors[f"{key}.input_scale"] = scale.reshape(1).clone()
                else:
                    tensors[f"{key}.weight"] = getattr(mod, proj)[e].detach().to(rest).contiguous().clone()
                    bf16_experts.append(key)
    seen: dict[int, str] = {}
    for name, t in model.state_dict().items():
        mod_name = name.rpartition(".")[0]
        if mod_name in fp8_names or mod_name in fused:
            continue
        ptr = t.data_ptr()
        if ptr in seen and getattr(model.config, "tie_word_embeddings", False):
            continue  # tied lm_head: stored once, as transformers does
        seen[ptr] = name
        keep = t if not t.is_floating_point() else t.to(rest)
        tensors[name] = keep.detach().contiguous().clone()
    for attn, (k, v) in (kv_scales or {}).items():
        if attn in plan.kv:
            tensors[f"{attn}.k_scale"] = k.reshape(1).float()
            tensors[f"{attn}.v_scale"] = v.reshape(1).float()
    cfg = model.config.to_dict()
    cfg.pop("_attn_implementation_internal", None)  # the FP8-KV wrapper is posttrain's, not the model's
    cfg["quantization_config"] = quantization_config(plan, weights, activations, bf16_experts)
    cfg["dtype"] = "bfloat16" if rest_dtype == "bf16" else "float32"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        tokenizer.save_pretrained(tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        (tmp / "posttrain_quant.json").write_text(json.dumps({**(extra or {}), "plan": plan.to_dict(),
                                                              "weights": weights, "activations": activations,
                                                              "rest_dtype": rest_dtype}, indent=1))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _is_fused_experts(mod: Any) -> bool:
    """A module holding all experts of an MoE layer as [E, out, in] tensors (NemotronH's layout)."""
    if isinstance(mod, FP8Experts):
        return True
    ps = dict(mod.named_parameters(recurse=False))
    return set(ps) == set(EXPERT_PROJS) and all(p.dim() == 3 for p in ps.values())


EXPERT_KEY = re.compile(r"^(?P<mod>.*\.experts)\.(?P<e>\d+)\.(?P<proj>up_proj|down_proj)\.(?P<what>weight|weight_scale|input_scale)$")


def _read_experts(tensors: dict[str, torch.Tensor], path: Path) -> dict[str, dict[str, dict[int, dict[str, torch.Tensor]]]]:
    """Pop the per-expert tensors out of ``tensors``: {module: {proj: {expert: {what: tensor}}}}."""
    out: dict[str, dict[str, dict[int, dict[str, torch.Tensor]]]] = {}
    for k, m in [(k, m) for k in tensors if (m := EXPERT_KEY.match(k))]:
        out.setdefault(m["mod"], {}).setdefault(m["proj"], {}).setdefault(int(m["e"]), {})[m["what"]] = tensors.pop(k)
    for mod, projs in out.items():
        counts = {p: sorted(d) for p, d in projs.items()}
        n = len(counts.get("up_proj", []))
        if set(projs) != set(EXPERT_PROJS) or any(c != list(range(n)) for c in counts.values()):
            raise UserError(f"{path}: experts of {mod} are incomplete ({ {p: len(c) for p, c in counts.items()} })")
    return out


def _stack(per: dict[int, dict[str, torch.Tensor]], what: str) -> torch.Tensor:
    return torch.stack([per[e][what] for e in sorted(per)])


def is_fp8_checkpoint(spec: str | Path) -> bool:
    p = Path(spec).expanduser() / "config.json"
    if not p.is_file():
        return False
    try:
        q = json.loads(p.read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return False
    return q.get("quant_method") == "compressed-tensors" and q.get("format") == "float-quantized"


def load_fp8(path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """The exported checkpoint as a simulated FP8 model (no compressed-tensors needed): FP8 weights
    and scales used as stored, activations fake-quantized as the config says, K/V via hooks."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    cfg_tree = json.loads((path / "config.json").read_text())
    q = cfg_tree.get("quantization_config") or {}
    group = next(iter(q.get("config_groups", {}).values()), {})
    acts = group.get("input_activations")
    activations = "none" if acts is None else ("dynamic" if acts.get("dynamic") else "static")
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    try:
        tensors = load_file(str(path / "model.safetensors"))
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: cannot read model.safetensors ({type(e).__name__}: {e})") from None
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    experts = _read_experts(tensors, path)
    fp8 = sorted(k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale"))
    kv = sorted(k[: -len(".k_scale")] for k in tensors if k.endswith(".k_scale"))
    plain = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()
             if k.rpartition(".")[0] not in fp8 and not k.endswith((".k_scale", ".v_scale"))}
    fp8_experts = {}
    for mod, projs in experts.items():
        if all("weight_scale" in d for p in projs.values() for d in p.values()):
            fp8_experts[mod] = projs
        elif any("weight_scale" in d for p in projs.values() for d in p.values()):
            raise UserError(f"{path}: experts of {mod} are partly FP8")
        else:  # a BF16 MoE layer: fuse the per-expert weights back into [E, out, in]
            for p, per in projs.items():
                plain[f"{mod}.{p}"] = _stack(per, "weight").to(dtype)
    missing, unexpected = model.load_state_dict(plain, strict=False)
    if unexpected:
        raise UserError(f"{path}: tensors the model does not have: {', '.join(unexpected[:5])}")
    for name in fp8:
        w = tensors[f"{name}.weight"]
        if w.dtype != FP8_DTYPE:
            raise UserError(f"{path}: {name}.weight is {w.dtype}, expected float8_e4m3fn")
        bias = tensors.get(f"{name}.bias")
        set_module(model, name, FP8Linear(w, tensors[f"{name}.weight_scale"], None if bias is None else bias.to(dtype),
                                          activations, tensors.get(f"{name}.input_scale"), dtype))
    for mod, projs in fp8_experts.items():
        scales = {}
        for p in EXPERT_PROJS:
            s = _stack(projs[p], "weight_scale")
            scales[p] = s if s.dim() == 3 else s.reshape(-1, 1, 1)  # [E, out, 1] or per expert [E, 1, 1]
        ins = {p: _stack(projs[p], "input_scale").amax().reshape(1) if all("input_scale" in d for d in projs[p].values())
               else None for p in EXPERT_PROJS}
        old = model.get_submodule(mod)
        set_module(model, mod, FP8Experts(old.act_fn, _stack(projs["up_proj"], "weight"), scales["up_proj"],
                                          _stack(projs["down_proj"], "weight"), scales["down_proj"], activations,
                                          ins["up_proj"], ins["down_proj"], dtype))
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    still_missing = [m for m in missing if m.rpartition(".")[0] not in fp8 and m.rpartition(".")[0] not in fp8_experts and not
                     (getattr(config, "tie_word_embeddings", False) and m.startswith("lm_head"))]
    if still_missing:
        raise UserError(f"{path}: missing tensors {', '.join(still_missing[:5])}")
    install_kv(model, {attn: (tensors[f"{attn}.k_scale"], tensors[f"{attn}.v_scale"]) for attn in kv})
    model.eval()
    return model

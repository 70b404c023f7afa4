"""Calibration data and statistics.

* ``calibration_texts``: the run's SFT conversations rendered with the chat template (the recipe:
  ~1K samples of the post-training SFT data), or generic English prose (``generic_texts``: the
  docstrings of a fixed list of Python standard-library modules, a deterministic offline stand-in
  for the news text the recipe compared against).
* ``collect_amax``: max |x| of every quantized Linear's input and of every FP8-KV attention's K and
  V over the calibration batches (run on the BF16 model), for static scales.
* ``score``: mean next-token loss and, against reference log-probs, the mean per-token KL(ref ‖
  model), the two numbers the sensitivity search ranks by.
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import UserError

GENERIC_MODULES = (
    "argparse", "collections", "json", "logging", "pathlib", "subprocess", "threading", "unittest",
    "email", "http.client", "urllib.request", "datetime", "decimal", "fractions", "statistics",
    "random", "itertools", "functools", "contextlib", "dataclasses", "textwrap", "csv",
    "sqlite3", "zipfile", "tarfile", "shutil", "tempfile", "heapq", "bisect", "calendar", "string",
    "asyncio", "typing", "inspect", "ast", "pickle", "copy", "enum", "configparser", "optparse",
    "difflib", "pprint", "gettext", "mailbox", "smtplib", "ftplib", "imaplib", "html.parser",
    "xml.etree.ElementTree", "socket", "ssl", "queue", "sched", "selectors", "shelve", "gzip",
    "codecs", "uuid", "traceback", "os", "re", "io", "abc", "numbers", "weakref", "operator",
)


def generic_texts(n: int, seed: int = 0, min_chars: int = 200) -> list[str]:
    """Up to ``n`` passages of generic prose, shuffled by seed: the docstrings of the modules above,
    their classes, functions and methods, cut at paragraph breaks into passages of at least
    ``min_chars`` characters (about 1.4K of them: enough for the recipe's ~1K calibration texts)."""
    import importlib
    import warnings

    docs: list[str] = []
    with warnings.catch_warnings():  # getmembers touches deprecated aliases (typing.io, ...)
        warnings.simplefilter("ignore", DeprecationWarning)
        for mod_name in GENERIC_MODULES:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            objs = [mod] + [o for _, o in inspect.getmembers(mod) if inspect.isclass(o) or inspect.isfunction(o)]
            objs += [f for c in objs if inspect.isclass(c) for _, f in inspect.getmembers(c, inspect.isfunction)]
            for o in objs:
                doc = inspect.getdoc(o) or ""
                if doc and doc not in docs:
                    docs.append(doc)
    texts: list[str] = []
    seen: set[str] = set()
    for doc in docs:
        cur = ""
        for para in doc.split("\n\n"):
            cur = f"{cur}\n\n{para}" if cur else para
            if len(cur) >= min_chars:
                if cur not in seen:
                    seen.add(cur)
                    texts.append(cur)
                cur = ""
    random.Random(seed).shuffle(texts)
    return texts[:n]


def run_sft_files(model_spec: str) -> list[str]:
    """``data.train`` paths of the run a checkpoint belongs to (``config.yaml`` in it or above)."""
    import yaml

    p = Path(model_spec).expanduser()
    if not p.is_dir():
        return []
    for d in [p, *p.resolve().parents][:4]:
        cfg = d / "config.yaml"
        if cfg.exists():
            tree = yaml.safe_load(cfg.read_text()) or {}
            train = (tree.get("data") or {}).get("train") or []
            return [t["path"] if isinstance(t, dict) else str(t) for t in train]
    return []


def sft_texts(files: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` conversations drawn (seeded) from SFT JSONL files, rendered as the model sees them."""
    from posttrain.models.chat_template import render_text

    rows = []
    for f in files:
        path = Path(f)
        if not path.exists():
            raise UserError(f"calibration data {path} not found")
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    if not rows:
        raise UserError(f"calibration data {', '.join(files)}: no rows")
    random.Random(seed).shuffle(rows)
    return [render_text(r["messages"], r.get("tools")) for r in rows[:n]]


def calibration_texts(source: str, n: int, files: list[str], model_spec: str, seed: int = 0) -> list[str]:
    if source == "generic":
        texts = generic_texts(n, seed)
    else:
        files = files or run_sft_files(model_spec)
        if not files:
            raise UserError(
                f"calibration.source=sft needs SFT data: give calibration.data=[file.jsonl] (the model {model_spec!r} "
                "is not inside a run directory with a config.yaml naming data.train), or calibration.source=generic")
        texts = sft_texts(files, n, seed)
    if len(texts) < n:
        print(f"calibration: {len(texts)} texts available (asked for {n})")
    return texts


def batches(tokenizer: Any, texts: list[str], max_len: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_len, add_special_tokens=False)
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    return out


def _iter_logits(model: Any, data: list[dict[str, torch.Tensor]]) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    for b in data:
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False)
        logits = out.logits[:, :-1].float()
        yield logits, b["input_ids"][:, 1:], b["attention_mask"][:, 1:].bool()


@torch.no_grad()
def collect_amax(model: Any, data: list[dict[str, torch.Tensor]], linears: list[str], kv: list[str],
                 experts: list[str] | None = None,
                 ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Running max |x| of the listed Linears' inputs and of the K (after RoPE) and V that the listed
    attention modules read. Pad positions are included (their hidden states are ordinary
    activations of the pad token). For the fused-experts modules in ``experts``, the inputs of
    ``up_proj`` and ``down_proj`` over the tokens routed to any expert (keys ``<module>.up_proj`` /
    ``.down_proj``: one scale per projection for all experts, as vLLM's FP8 MoE uses the max over
    experts)."""
    from posttrain.quant.simulate import expert_mlp, observe_kv

    amax: dict[str, torch.Tensor] = {}

    def track(key: str, t: torch.Tensor) -> None:
        m = t.detach().abs().float().nan_to_num(0.0).amax().reshape(1)
        amax[key] = torch.maximum(amax[key], m) if key in amax else m

    handles = []
    for name in linears:
        mod = model.get_submodule(name)
        handles.append(mod.register_forward_pre_hook(lambda _m, inp, n=name: track(n, inp[0])))
    handles += observe_kv(model, kv, track)
    patched = []
    for name in experts or []:
        mod = model.get_submodule(name)

        def fwd(h, idx, w, mod=mod, name=name):
            def up(x):
                track(f"{name}.up_proj", x)
                return x

            def down(x):
                track(f"{name}.down_proj", x)
                return x

            return expert_mlp(mod, h, idx, w, mod.up_proj, mod.down_proj, up, down)

        mod.forward = fwd  # an instance attribute: deleted below, the class's forward is untouched
        patched.append(mod)
    body = getattr(model, "model", None)  # the decoder without the LM head (never quantized): ~20% less work
    try:
        for b in data:
            (body or model)(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False)
    finally:
        for h in handles:
            h.remove()
        for mod in patched:
            del mod.forward
    from posttrain.quant.fp8 import scale_from_amax

    keys = list(linears) + [f"{e}.{p}" for e in experts or [] for p in ("up_proj", "down_proj")]
    input_scales = {n: scale_from_amax(amax[n]) for n in keys if n in amax}
    kv_scales = {a: (scale_from_amax(amax[f"{a}:k"]), scale_from_amax(amax[f"{a}:v"])) for a in kv}
    return input_scales, kv_scales


@torch.no_grad()
def reference_logprobs(model: Any, data: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Log-probs of the reference (BF16) model, in float32: rounding them to bfloat16 to save memory
    put a floor of ~7e-5 nats under every KL (measured on the tiny NemotronH), larger than the
    per-unit differences the search has to rank."""
    return [torch.log_softmax(lg, -1) for lg, _, _ in _iter_logits(model, data)]


@torch.no_grad()
def score(model: Any, data: list[dict[str, torch.Tensor]], ref: list[torch.Tensor] | None = None) -> dict[str, float]:
    """Mean next-token loss over real tokens, and, when ``ref`` (from ``reference_logprobs`` on the
    same data) is given, the mean per-token KL(ref ‖ model) and the top-1 agreement (the share of
    positions where both models' most likely next token is the same)."""
    loss_sum, kl_sum, agree_sum, n = 0.0, 0.0, 0, 0
    for i, (logits, labels, mask) in enumerate(_iter_logits(model, data)):
        logp = torch.log_softmax(logits, -1)
        nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        loss_sum += float(nll[mask].sum())
        if ref is not None:
            r = ref[i].float()
            kl = (r.exp() * (r - logp)).sum(-1)
            kl_sum += float(kl[mask].sum())
            agree_sum += int((r.argmax(-1) == logp.argmax(-1))[mask].sum())
        n += int(mask.sum())
    out = {"loss": loss_sum / max(n, 1), "tokens": float(n)}
    if ref is not None:
        out["kl"] = kl_sum / max(n, 1)
        out["top1_agree"] = agree_sum / max(n, 1)
    return out


def save_scales(path: str | Path, fingerprint: str, input_scales: dict[str, torch.Tensor],
                kv_scales: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    t = {f"in:{k}": v.reshape(1).float().clone() for k, v in input_scales.items()}
    for a, (k, v) in kv_scales.items():
        t[f"k:{a}"], t[f"v:{a}"] = k.reshape(1).float().clone(), v.reshape(1).float().clone()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    save_file(t, str(tmp), metadata={"fingerprint": fingerprint})
    tmp.replace(path)


def load_scales(path: str | Path, fingerprint: str, linears: list[str], kv: list[str]
                ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Scales saved by ``save_scales`` for the same model and calibration settings; ``linears``
    (input-scale keys) and ``kv`` (attention modules) must all be in the file."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        saved = (f.metadata() or {}).get("fingerprint")
        if saved != fingerprint:
            raise UserError(f"calibration.scales {path}: calibrated with other settings ({saved}), not ({fingerprint})")
        t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    missing = [n for n in linears if f"in:{n}" not in t] + [a for a in kv if f"k:{a}" not in t]
    if missing:
        raise UserError(f"calibration.scales {path}: no scales for {', '.join(missing[:3])}")
    return {n: t[f"in:{n}"] for n in linears}, {a: (t[f"k:{a}"], t[f"v:{a}"]) for a in kv}

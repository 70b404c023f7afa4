"""The teacher's top-k log-probs of every row, computed once and read back (``teacher.cache: PATH``).

A teacher forward pass in every step costs about as much as the student's forward; when the same
rows are seen for several epochs, or several students learn from one teacher, computing the
teacher's view once is cheaper. Only top-k is cached: the full vocabulary is V floats per token.

The file is one safetensors file (lazy, memory-mapped reads; no pickle). Per split ``s`` —
``train.0``, ``train.1``, … (one per ``data.train`` file) and ``validation`` — it holds

* ``s.logprobs`` float32 (N_s, k): the teacher's log-probs *at temperature 1* of its k likeliest
  next tokens, at each of the split's N_s trained (assistant) positions, example after example in
  the split's order, positions in row order;
* ``s.ids`` int32 (N_s, k): those tokens;
* ``s.offsets`` int64 (n_examples + 1): example i's positions are rows offsets[i]:offsets[i+1].

The metadata is the fingerprint: the teacher (its spec and a sha256 of its config and weight files;
a tiny test model by name and seed), the data (a sha256 of every example's token ids and loss mask,
in split order: it covers the files, the held-out split, the reasoning transforms, the tokenizer and
``max_seq_len`` at once), k and the format version. A run whose fingerprint differs is refused in one
line that names what differs; a missing file is built.

Why float32: the cached targets then equal the in-step teacher's to float precision (tested); the
file is N·k·8 bytes (2M trained tokens at k = 64: about 1 GiB). Why no temperature in the
fingerprint: the loss softens the top-k log-probs by T itself, exactly for any T
(``losses.forward_kl``), so one cache serves every temperature.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from posttrain.errors import UserError

FORMAT = 1


class CacheMismatch(UserError):
    """A teacher cache computed for another teacher, other data or another k."""


def targets_from_logits(logits_NV: Any, k: int | None) -> tuple[Any, Any]:
    """The teacher's view of its logits at N positions: (log-probs at T = 1, ids), the ids None for
    the full vocabulary (K = V, in id order) or the k likeliest tokens per position."""
    import torch

    logprobs_NV = torch.log_softmax(logits_NV.float(), dim=-1)
    if k is None:
        return logprobs_NV, None
    top = logprobs_NV.topk(k, dim=-1)
    return top.values, top.indices


def teacher_fingerprint(spec: str) -> dict[str, str]:
    """What identifies the teacher's weights: a tiny model's name and seed, or a directory's config
    and weight files by content (sha256; a 135M model takes about a second)."""
    from posttrain.models.loading import resolve_spec

    where = resolve_spec(spec)
    if isinstance(where, str):
        return {"teacher": spec, "teacher_sha256": f"{where} seed 0"}  # load_model's default seed
    h = hashlib.sha256()
    files = [where / "config.json", *sorted(where.glob("*.safetensors")), *sorted(where.glob("*.bin"))]
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return {"teacher": spec, "teacher_sha256": h.hexdigest()}


def data_fingerprint(splits: dict[str, Sequence[Any]]) -> str:
    """sha256 of every example's token ids and loss mask, split by split in order."""
    h = hashlib.sha256()
    for name, examples in splits.items():
        h.update(f"[{name}:{len(examples)}]".encode())
        for ex in examples:
            h.update(json.dumps([ex.input_ids, ex.loss_mask], separators=(",", ":")).encode())
    return h.hexdigest()


def fingerprint(teacher_spec: str, splits: dict[str, Sequence[Any]], k: int) -> dict[str, str]:
    return {"format": str(FORMAT), **teacher_fingerprint(teacher_spec), "data_sha256": data_fingerprint(splits),
            "topk": str(k)}


def check_cache(path: str | Path, want: dict[str, str]) -> bool:
    """True when ``path`` holds a cache for exactly ``want``; False when there is none; a
    :class:`CacheMismatch` when it was made for something else."""
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            have = f.metadata() or {}
    except Exception as e:  # not a safetensors file, or a torn one
        raise CacheMismatch(f"teacher.cache {path} is not a readable teacher cache ({type(e).__name__}); delete "
                            "it to rebuild it, or set teacher.cache to a new path") from None
    differ = []
    if have.get("format") != want["format"]:
        differ.append(f"format (version {have.get('format', '?')}; this one reads {want['format']})")
    if have.get("teacher_sha256") != want["teacher_sha256"]:
        differ.append(f"teacher ({have.get('teacher', '?')}; here {want['teacher']}, or its weights changed)")
    if have.get("data_sha256") != want["data_sha256"]:
        differ.append("data (other rows, held-out split, tokenizer or data.max_seq_len)")
    if have.get("topk") != want["topk"]:
        differ.append(f"k (teacher.topk={have.get('topk', '?')}; here {want['topk']})")
    if differ:
        raise CacheMismatch(f"teacher.cache {path} was computed for another {', '.join(differ)}: delete it to "
                            "rebuild it for this run, or set teacher.cache to a new path")
    return True


def build_cache(path: str | Path, teacher: Any, splits: dict[str, Sequence[Any]], k: int, max_len: int,
                pad_id: int, pack: bool, amp: Callable[[], Any], meta: dict[str, str]) -> Path:
    """Run ``teacher`` (eval mode, no grad) over every split's rows once and write the cache
    atomically (a killed build leaves no file that a later run would trust)."""
    import torch
    from safetensors.torch import save_file

    from posttrain.data.packing import trainable_rows
    from posttrain.train.supervised import target_logits

    t0, path, device = time.time(), Path(path), next(teacher.parameters()).device
    tensors: dict[str, Any] = {}
    n_tokens = 0
    teacher.eval()
    for name, examples in splits.items():
        per_example: list[Any] = [None] * len(examples)
        with torch.no_grad(), amp():
            for row in trainable_rows(examples, max_len, pad_id, pack):
                lp_NK, ids_NK = targets_from_logits(target_logits(teacher, row.to_tensors(str(device)))[0], k)
                counts = [sum(examples[m].loss_mask[1:max_len]) for m in row.members or []]
                if sum(counts) != lp_NK.shape[0]:
                    raise AssertionError(f"{name}: {lp_NK.shape[0]} trained positions in a row of {counts} per example")
                for m, lp, ids in zip(row.members or [], lp_NK.split(counts), ids_NK.split(counts)):
                    per_example[m] = (lp.cpu(), ids.to(torch.int32).cpu())
        empty = (torch.zeros(0, k), torch.zeros(0, k, dtype=torch.int32))
        parts = [p if p is not None else empty for p in per_example]
        sizes = torch.tensor([0] + [p[0].shape[0] for p in parts], dtype=torch.int64)
        tensors[f"{name}.logprobs"] = torch.cat([p[0] for p in parts]).contiguous()
        tensors[f"{name}.ids"] = torch.cat([p[1] for p in parts]).contiguous()
        tensors[f"{name}.offsets"] = sizes.cumsum(0)
        n_tokens += int(sizes.sum())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"[distill-logits] teacher cache: top-{k} of {n_tokens} trained tokens in {len(splits)} splits → {path} "
          f"({time.time() - t0:.0f}s)")
    return path


class TeacherCache:
    """Read side: the cached top-k log-probs and ids of a list of (split, example) keys, concatenated
    in that order (the order of a packed row's examples)."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        self._f = safe_open(str(self.path), framework="pt")
        self._offsets = {key[: -len(".offsets")]: self._f.get_tensor(key).tolist()
                         for key in self._f.keys() if key.endswith(".offsets")}

    def targets(self, keys: Sequence[tuple[str, int]], device: Any = "cpu") -> tuple[Any, Any]:
        import torch

        lps, ids = [], []
        for split, i in keys:
            a, b = self._offsets[split][i], self._offsets[split][i + 1]
            lps.append(self._f.get_slice(f"{split}.logprobs")[a:b])
            ids.append(self._f.get_slice(f"{split}.ids")[a:b])
        return torch.cat(lps).to(device), torch.cat(ids).long().to(device)

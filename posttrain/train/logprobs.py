"""Trainer-side log-probs of sampled tokens: what the policy gradient differentiates.

Given sequences (prompt + everything after it, as token ids) and a mask that is 1 on the tokens the
model sampled, :func:`sampled_logprobs` returns, per sequence, ``log π_θ(y_t | y_<t)`` at every
masked position, in order, with the autograd graph attached. Three things keep it cheap and exact:

* **Packing** (attention-only models): the sequences of a micro-batch are concatenated into one
  row whose ``position_ids`` restart at 0 for each sequence; transformers reads the restarts as
  sequence boundaries and builds a block-diagonal causal mask, so no sequence attends to another
  and no compute goes to padding. Hybrid (Mamba) models carry a recurrent state across the row, so
  they get right-padded rows instead (padding at the end cannot reach earlier positions).
* **Logits only where needed**: the vocabulary projection is a large share of a small model's
  FLOPs and of its memory (positions × 49k floats), so ``logits_to_keep`` gets exactly the
  positions whose next token is sampled (packed), or the shortest suffix covering them (padded).
* **The sampler's temperature**: the sampler draws from ``softmax(logits / T)`` and reports that
  distribution's log-probs, so the trainer divides by the same T before the log-softmax; otherwise
  the importance ratio would measure the temperature, not the policy. (Top-p renormalisation is
  not reproduced: RL samples with top_p = 1.)

The log-softmax is taken through ``cross_entropy`` in fp32, so no positions × V log-prob tensor is
kept for the backward pass beyond the logits themselves.

Shape suffixes (docs/algorithms.md): B sequences, T positions, K kept positions, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def target_positions(loss_mask: Sequence[int]) -> list[int]:
    """Positions t (t ≥ 1) whose token is sampled; its logits come from position t − 1."""
    if loss_mask and loss_mask[0]:
        raise ValueError("the first token of a sequence cannot be a sampled token (it has no context)")
    return [t for t, m in enumerate(loss_mask) if m]


def _scaled_logprobs(logits_KV: Tensor, targets_K: Tensor, temperature: float) -> Tensor:
    logits_KV = logits_KV.float()
    if temperature != 1.0:
        logits_KV = logits_KV / temperature
    return -F.cross_entropy(logits_KV, targets_K, reduction="none")


def sampled_logprobs(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pack: bool = True,
    pad_id: int = 0,
) -> list[Tensor]:
    """Per sequence, a 1-D tensor of the trainer's log-probs at its mask-1 positions (one forward).

    All sequences go through the model together (one packed row, or one padded batch): the caller
    splits a step into micro-batches (:func:`micro_batches`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (the sampling temperature), got {temperature}")
    if len(token_ids) != len(loss_masks):
        raise ValueError(f"{len(token_ids)} sequences but {len(loss_masks)} masks")
    for ids, mask in zip(token_ids, loss_masks):
        if len(ids) != len(mask):
            raise ValueError(f"a sequence of {len(ids)} tokens has a mask of {len(mask)}")
    positions = [target_positions(m) for m in loss_masks]
    device = next(model.parameters()).device
    if pack:
        return _packed(model, token_ids, positions, temperature, device)
    return _padded(model, token_ids, positions, temperature, pad_id, device)


def _packed(model: Any, token_ids: Sequence[Sequence[int]], positions: list[list[int]], temperature: float,
            device: Any) -> list[Tensor]:
    ids: list[int] = []
    pos_ids: list[int] = []
    keep: list[int] = []  # row positions whose logits predict a sampled token
    targets: list[int] = []
    for seq, pos in zip(token_ids, positions):
        offset = len(ids)
        ids.extend(seq)
        pos_ids.extend(range(len(seq)))
        keep.extend(offset + t - 1 for t in pos)
        targets.extend(seq[t] for t in pos)
    if not keep:
        return [torch.zeros(0, device=device) for _ in token_ids]
    out = model(
        input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([pos_ids], device=device),
        logits_to_keep=torch.tensor(keep, device=device), use_cache=False,
    )
    logp_K = _scaled_logprobs(out.logits[0], torch.tensor(targets, device=device), temperature)
    return list(logp_K.split([len(p) for p in positions]))


def _padded(model: Any, token_ids: Sequence[Sequence[int]], positions: list[list[int]], temperature: float,
            pad_id: int, device: Any) -> list[Tensor]:
    width = max(len(s) for s in token_ids)
    input_BT = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    attention_BT = torch.zeros((len(token_ids), width), dtype=torch.long)
    for b, seq in enumerate(token_ids):
        input_BT[b, : len(seq)] = torch.tensor(seq)
        attention_BT[b, : len(seq)] = 1
    first = min((p[0] for p in positions if p), default=None)
    if first is None:
        return [torch.zeros(0, device=device) for _ in token_ids]
    keep = width - (first - 1)  # the shortest suffix of positions that covers every target's logits
    out = model(input_ids=input_BT.to(device), attention_mask=attention_BT.to(device), logits_to_keep=keep,
                use_cache=False)
    logits_BKV = out.logits  # row position p sits at column p − (width − keep)
    rows, cols, targets = [], [], []
    for b, pos in enumerate(positions):
        rows += [b] * len(pos)
        cols += [t - 1 - (width - keep) for t in pos]
        targets += [token_ids[b][t] for t in pos]
    logp_K = _scaled_logprobs(logits_BKV[torch.tensor(rows), torch.tensor(cols)], torch.tensor(targets, device=device),
                              temperature)
    return list(logp_K.split([len(p) for p in positions]))


def micro_batches(lengths: Sequence[int], max_tokens: int, pack: bool) -> list[list[int]]:
    """Split sequences (by index) into micro-batches of at most ``max_tokens`` tokens each.

    Packed, a micro-batch costs the sum of its lengths; padded, its row count × its longest length,
    so sequences are taken longest first to keep similar lengths together. A sequence longer than
    the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cost = 0
    for i in order:
        extra = lengths[i] if pack else (lengths[out[-1][0]] if out else lengths[i])
        if out and cost + extra <= max_tokens:
            out[-1].append(i)
            cost += extra
        else:
            out.append([i])
            cost = lengths[i]
    return out

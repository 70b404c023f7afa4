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

Top-k distillation (default off) needs two more views of the same kept logits: the teacher's k most
likely tokens at each sampled position (:func:`topk_logprobs`, no grad needed) and the student's
log-probs at those ids, with the graph (``sampled_logprobs(..., extra_ids=...)``). Both reuse the
packing / padding path above; only the head on the kept logits differs.

**Shared prompts** (packed path): the G rollouts of a task start with the same prompt ids. Packing
them as G separate sequences runs the prompt through the model G times; instead the row holds the
prompt once, followed by each completion, with an explicit 4-D attention mask (a completion sees
its prompt and itself, causally; nothing else) and position ids that continue from the prompt's
end. Logits, log-probs and gradients are those of the separate sequences (tested to float
tolerance); the forward and backward cost drops from G·(prompt + completion) to prompt +
G·completion tokens. A "prompt" is everything before a sequence's first sampled token, so a
multi-turn episode shares its first prompt only.

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
    extra_ids: Sequence[Tensor] | None = None,
    share_prompts: bool = True,
) -> list[Tensor]:
    """Per sequence, a 1-D tensor of the trainer's log-probs at its mask-1 positions (one forward).
    ``share_prompts`` (packed only): sequences with the same prompt share one copy of it.

    All sequences go through the model together (one packed row, or one padded batch): the caller
    splits a step into micro-batches (:func:`micro_batches`).

    ``extra_ids`` (top-k distillation; default off): per sequence an (n_sampled, k) id tensor; each
    result is then (n_sampled, 1 + k): column 0 the sampled token's log-prob as without it,
    columns 1.. the log-probs of those ids at the same positions (same temperature, with grad).
    """
    if extra_ids is None:
        head = lambda logits_KV, targets_K, _: _scaled_logprobs(logits_KV, targets_K, temperature)  # noqa: E731
    else:
        if len(extra_ids) != len(token_ids):
            raise ValueError(f"{len(token_ids)} sequences but {len(extra_ids)} extra_ids tensors")

        def head(logits_KV: Tensor, targets_K: Tensor, positions: list[list[int]]) -> Tensor:
            logp_KV = torch.log_softmax(logits_KV.float() / temperature, dim=-1)
            ids_KJ = torch.cat([e.reshape(len(p), -1) for e, p in zip(extra_ids, positions)]).to(logits_KV.device)
            return torch.cat([logp_KV.gather(1, targets_K[:, None]), logp_KV.gather(1, ids_KJ.long())], dim=1)
    return _run(model, token_ids, loss_masks, temperature, pack, pad_id, head, share_prompts)


def topk_logprobs(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    k: int,
    temperature: float = 1.0,
    pack: bool = True,
    pad_id: int = 0,
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per sequence, ``(sampled, topk_logprobs, topk_ids)`` at every mask-1 position, from one forward:
    the sampled token's log-prob (n_sampled,) as :func:`sampled_logprobs` gives it, and the k most
    likely next tokens' log-probs and ids (n_sampled, k), at ``temperature`` — a teacher's view for
    top-k distillation."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")

    def head(logits_KV: Tensor, targets_K: Tensor, positions: list[list[int]]) -> Tensor:
        logp_KV = torch.log_softmax(logits_KV.float() / temperature, dim=-1)
        top = logp_KV.topk(k, dim=-1)
        # one tensor so the per-sequence split is shared; ids are exact as floats below 2**24
        return torch.cat([logp_KV.gather(1, targets_K[:, None]), top.values, top.indices.float()], dim=1)

    out = [o.reshape(-1, 1 + 2 * k) for o in _run(model, token_ids, loss_masks, temperature, pack, pad_id, head)]
    return [(o[:, 0], o[:, 1 : 1 + k], o[:, 1 + k :].long()) for o in out]


def _run(model: Any, token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]], temperature: float,
         pack: bool, pad_id: int, head: Any, share_prompts: bool = True) -> list[Tensor]:
    """Check the inputs, run the packed or padded forward, apply ``head`` to the kept logits."""
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
        return _packed(model, token_ids, positions, head, device, share_prompts)
    return _padded(model, token_ids, positions, head, pad_id, device)


def prompt_key(seq: Sequence[int], loss_mask: Sequence[int]) -> tuple[int, ...]:
    """The ids before the first sampled token: sequences with equal keys can share them."""
    first = next((t for t, m in enumerate(loss_mask) if m), len(seq))
    return tuple(seq[:first])


def _packed(model: Any, token_ids: Sequence[Sequence[int]], positions: list[list[int]], head: Any,
            device: Any, share_prompts: bool = True) -> list[Tensor]:
    prompts = [tuple(seq[: pos[0]]) if pos else None for seq, pos in zip(token_ids, positions)]
    counts: dict[Any, int] = {}
    for key in prompts:
        counts[key] = counts.get(key, 0) + 1
    if share_prompts and any(n > 1 for key, n in counts.items() if key):
        return _packed_shared(model, token_ids, positions, prompts, head, device)
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
    logp_K = head(out.logits[0], torch.tensor(targets, device=device), positions)
    return list(logp_K.split([len(p) for p in positions]))


def _packed_shared(model: Any, token_ids: Sequence[Sequence[int]], positions: list[list[int]],
                   prompts: list[Any], head: Any, device: Any) -> list[Tensor]:
    """One row: each distinct prompt once, then the completions that continue it (module docstring)."""
    ids: list[int] = []
    pos_ids: list[int] = []
    group: list[int] = []  # per row position: which prompt it belongs to
    member: list[int] = []  # -1 on prompt tokens, else the sequence index
    keep: list[int] = []
    targets: list[int] = []
    placed: dict[Any, tuple[int, int]] = {}  # prompt → (row start, group id)
    for b, (seq, pos) in enumerate(zip(token_ids, positions)):
        p = pos[0] if pos else len(seq)
        key = prompts[b] if pos else ("unsampled", b)  # a sequence with nothing sampled shares nothing
        if key not in placed:
            placed[key] = (len(ids), len(placed))
            ids.extend(seq[:p])
            pos_ids.extend(range(p))
            group.extend([placed[key][1]] * p)
            member.extend([-1] * p)
        start, g = placed[key]
        comp = len(ids)
        ids.extend(seq[p:])
        pos_ids.extend(range(p, len(seq)))
        group.extend([g] * (len(seq) - p))
        member.extend([b] * (len(seq) - p))
        keep.extend(start + t - 1 if t - 1 < p else comp + t - 1 - p for t in pos)
        targets.extend(seq[t] for t in pos)
    if not keep:
        return [torch.zeros(0, device=device) for _ in token_ids]
    L = len(ids)
    g_L, m_L = torch.tensor(group, device=device), torch.tensor(member, device=device)
    causal_LL = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    allowed_LL = causal_LL & (g_L[:, None] == g_L[None, :]) & ((m_L[None, :] == -1) | (m_L[None, :] == m_L[:, None]))
    dtype = next(model.parameters()).dtype
    mask_11LL = torch.zeros(1, 1, L, L, dtype=dtype, device=device).masked_fill(~allowed_LL, torch.finfo(dtype).min)
    out = model(
        input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([pos_ids], device=device),
        attention_mask=mask_11LL, logits_to_keep=torch.tensor(keep, device=device), use_cache=False,
    )
    logp_K = head(out.logits[0], torch.tensor(targets, device=device), positions)
    return list(logp_K.split([len(p) for p in positions]))


def _padded(model: Any, token_ids: Sequence[Sequence[int]], positions: list[list[int]], head: Any,
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
    logp_K = head(logits_BKV[torch.tensor(rows), torch.tensor(cols)], torch.tensor(targets, device=device),
                  positions)
    return list(logp_K.split([len(p) for p in positions]))


def micro_batches(lengths: Sequence[int], max_tokens: int, pack: bool,
                  prompts: Sequence[tuple[Any, int]] | None = None) -> list[list[int]]:
    """Split sequences (by index) into micro-batches of at most ``max_tokens`` tokens each.

    Packed, a micro-batch costs the sum of its lengths; padded, its row count × its longest length,
    so sequences are taken longest first to keep similar lengths together. A sequence longer than
    the budget gets a micro-batch of its own.

    ``prompts`` (packed): per sequence ``(prompt key, prompt length)``; sequences with the same key
    are kept together and the shared prompt is counted once per micro-batch (see shared prompts).
    """
    if pack and prompts is not None:
        first: dict[Any, int] = {}
        for i, (key, _) in enumerate(prompts):
            first.setdefault(key, i)
        order = sorted(range(len(lengths)), key=lambda i: (first[prompts[i][0]], -lengths[i]))
    else:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    seen: set[Any] = set()  # prompts already in the current micro-batch
    cost = 0
    for i in order:
        if pack and prompts is not None and prompts[i][0] in seen:
            extra = lengths[i] - prompts[i][1]
        else:
            extra = lengths[i] if pack else (lengths[out[-1][0]] if out else lengths[i])
        if out and cost + extra <= max_tokens:
            out[-1].append(i)
            cost += extra
        else:
            out.append([i])
            cost = lengths[i]
            seen = set()
        if prompts is not None:
            seen.add(prompts[i][0])
    return out

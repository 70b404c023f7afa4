"""Sequence packing: several tokenized conversations in one row, none attending to another.

A packed row concatenates examples and restarts ``position_ids`` at 0 for each one. With no
attention mask, transformers derives a block-diagonal causal mask from those resets
(``masking_utils.find_packed_sequence_indices``), so a token only sees earlier tokens of its own
conversation — the test ``test_packing_isolates_sequences`` checks logits of a packed row against
each example run alone.

Mamba layers carry a recurrent state across the whole row and have no such reset on the PyTorch
path, so hybrid (NemotronH) models get padded rows instead (``pack=False``): one example per row,
right-padded, with an attention mask.

Shapes: ``B`` rows, ``T`` tokens. Labels are -100 where the loss mask is 0 (prompt, padding) and
are *not* shifted; the loss shifts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

IGNORE = -100


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Batch:
    input_ids_BT: list[list[int]]
    labels_BT: list[list[int]]
    position_ids_BT: list[list[int]]
    attention_mask_BT: list[list[int]] | None  # None for packed rows (mask comes from positions)
    n_examples: int
    members: list[int] | None = None  # which of the given examples the row holds, in row order

    @property
    def n_target_tokens(self) -> int:
        # labels are shifted by the loss, so the first label of each example is never a target;
        # an example's first token is always a prompt token (mask 0), so counting != IGNORE is exact.
        return sum(1 for row in self.labels_BT for x in row if x != IGNORE)

    def to_tensors(self, device: str = "cpu") -> dict:
        import torch

        out = {
            "input_ids": torch.tensor(self.input_ids_BT, dtype=torch.long, device=device),
            "labels": torch.tensor(self.labels_BT, dtype=torch.long, device=device),
            "position_ids": torch.tensor(self.position_ids_BT, dtype=torch.long, device=device),
        }
        if self.attention_mask_BT is not None:
            out["attention_mask"] = torch.tensor(self.attention_mask_BT, dtype=torch.long, device=device)
        return out


def truncate(ex: Example, max_len: int) -> Example:
    return Example(ex.input_ids[:max_len], ex.loss_mask[:max_len])


def pack_examples(examples: Sequence[Example], max_len: int, pad_id: int) -> list[Batch]:
    """First-fit-decreasing packing into rows of at most ``max_len`` tokens.

    Returns one ``Batch`` per row (rows differ in length; the trainer runs each row as a micro-batch
    so no compute is spent on padding).
    """
    exs = [truncate(e, max_len) for e in examples]
    order = sorted(range(len(exs)), key=lambda i: -len(exs[i]))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(exs[i])
        for b in range(len(bins)):
            if room[b] >= n:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max_len - n)
    rows = []
    for members in bins:
        ids, labels, pos = [], [], []
        for i in sorted(members):  # keep a stable order inside a row
            e = exs[i]
            ids.extend(e.input_ids)
            labels.extend(t if m else IGNORE for t, m in zip(e.input_ids, e.loss_mask))
            pos.extend(range(len(e)))
        rows.append(Batch([ids], [labels], [pos], None, len(members), sorted(members)))
    return rows


def pad_examples(examples: Sequence[Example], max_len: int, pad_id: int, rows_per_batch: int = 1) -> list[Batch]:
    """One example per row, right-padded within groups of ``rows_per_batch``."""
    exs = [truncate(e, max_len) for e in examples]
    out = []
    for s in range(0, len(exs), rows_per_batch):
        group = exs[s : s + rows_per_batch]
        width = max(len(e) for e in group)
        ids, labels, pos, att = [], [], [], []
        for e in group:
            pad = width - len(e)
            ids.append(e.input_ids + [pad_id] * pad)
            labels.append([t if m else IGNORE for t, m in zip(e.input_ids, e.loss_mask)] + [IGNORE] * pad)
            pos.append(list(range(len(e))) + [0] * pad)
            att.append([1] * len(e) + [0] * pad)
        out.append(Batch(ids, labels, pos, att, len(group), list(range(s, s + len(group)))))
    return out


def trainable_rows(examples: Sequence[Example], max_len: int, pad_id: int, pack: bool,
                   rows_per_batch: int = 1) -> list[Batch]:
    """``examples`` packed (attention-only models) or padded (hybrid ones), less the rows left with
    no trained token: what a training or held-out pass runs, one micro-batch per row."""
    rows = pack_examples(examples, max_len, pad_id) if pack else pad_examples(examples, max_len, pad_id, rows_per_batch)
    return [r for r in rows if r.n_target_tokens]

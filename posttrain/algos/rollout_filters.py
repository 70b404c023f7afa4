"""Rollout filters applied between scoring and the loss: overlong filtering, dynamic filtering.

* **Overlong filtering** (DAPO, and the recipe's RLVR): a rollout that stopped because it hit the
  token limit (``finish_reason == "length"``) has no final answer to judge, so a 0 reward for it
  would punish length rather than wrongness. It is dropped: its loss mask becomes all zero, which
  also takes it out of its group's statistics (see ``advantages.py``).
* **Dynamic filtering** (DAPO's dynamic sampling): a group whose rewards are all equal (all solved,
  all failed) has advantage 0 on every token, so it costs compute and contributes no gradient,
  while shrinking the effective batch. Such groups are dropped and, when the caller has more
  groups queued, replaced: :func:`fill_groups` pulls groups lazily from any iterable until it has
  enough informative ones, so the iterable may be a generator that samples and scores on demand.

Both are counted, because a rising drop rate is itself a training signal (the curriculum is too
easy or too hard, or the length limit is too tight).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence, TypeVar

import torch

Tensor = torch.Tensor
G = TypeVar("G")


def overlong_filter(finish_reasons_B: Sequence[str], mask_BT: Tensor) -> tuple[Tensor, int]:
    """Zero the loss mask of rollouts that hit the length limit; return (mask_BT, number dropped)."""
    if len(finish_reasons_B) != mask_BT.shape[0]:
        raise ValueError(f"{len(finish_reasons_B)} finish reasons for {mask_BT.shape[0]} rollouts")
    overlong_B = torch.tensor([r == "length" for r in finish_reasons_B], dtype=torch.bool)
    return mask_BT * (~overlong_B).to(mask_BT.dtype)[:, None], int(overlong_B.sum())


def group_is_informative(rewards: Sequence[float], atol: float = 1e-9) -> bool:
    """True when the rewards differ (max − min > atol), i.e. the group yields a non-zero advantage."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > atol


def dynamic_filter(
    rewards_B: Tensor, group_ids_B: Tensor, valid_B: Tensor | None = None, atol: float = 1e-9
) -> tuple[Tensor, int]:
    """Which rollouts belong to an informative group; return (keep_B, number of groups dropped).

    Only ``valid_B`` rollouts (e.g. not overlong) count when deciding whether rewards differ.
    """
    valid_B = torch.ones_like(rewards_B, dtype=torch.bool) if valid_B is None else valid_B.bool()
    keep_B = torch.zeros_like(valid_B)
    dropped = 0
    for g in torch.unique(group_ids_B):
        in_group = group_ids_B == g
        if group_is_informative(rewards_B[in_group & valid_B].tolist(), atol):
            keep_B |= in_group
        else:
            dropped += 1
    return keep_B, dropped


def fill_groups(
    groups: Iterable[G], n: int, rewards: Callable[[G], Sequence[float]], atol: float = 1e-9
) -> tuple[list[G], int]:
    """Take groups from ``groups`` (lazily) until ``n`` informative ones are found.

    Returns (kept, number dropped). ``kept`` is shorter than ``n`` only if ``groups`` ran out; the
    caller decides whether to train on a short batch. ``rewards(group)`` should leave out rollouts
    that other filters dropped (overlong ones), since they do not enter the advantage.
    """
    kept: list[G] = []
    dropped = 0
    if n <= 0:
        return kept, dropped
    for group in groups:
        if group_is_informative(rewards(group), atol):
            kept.append(group)
            if len(kept) == n:
                break
        else:
            dropped += 1
    return kept, dropped

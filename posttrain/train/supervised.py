"""The supervised term's log-probs: each trained token of a tokenized micro-batch, computing logits
only where they get a gradient. SFT trains on them, the RL stage's SFT anchor (PPO-ptx) and the
held-out loss read them; living here, the RL stage needs nothing of the SFT stage. The logits
themselves (:func:`target_logits`) are what a loss on whole distributions (``forward_kl``) reads."""

from __future__ import annotations

from typing import Any


def label_positions(labels_1d: Any) -> Any:
    """Positions whose *next* token is trained on: the only logits that get a gradient."""
    import torch

    nxt = labels_1d[1:] != -100
    return torch.nonzero(nxt, as_tuple=False).flatten()


def target_logits(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """(logits_NV, targets_N) of a one-row micro-batch: the logits at the N positions whose next
    token is trained on (``logits_to_keep``: no other position's vocabulary projection is computed)
    and those next tokens, in row order."""
    labels = batch["labels"]
    if labels.shape[0] != 1:
        raise ValueError(f"target_logits takes one row (packed, or one padded example); got {labels.shape[0]}")
    pos = label_positions(labels[0])
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                attention_mask=batch.get("attention_mask"), logits_to_keep=pos, use_cache=False)
    return out.logits[0], labels[0, pos + 1]


def row_logprobs(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """(log-prob of each trained token, its mask) for one micro-batch, computing logits only where
    needed: a packed row keeps exactly its target positions (``logits_to_keep``); padded rows
    (hybrid models) take full logits and mask by the labels."""
    import torch
    import torch.nn.functional as F

    from posttrain.algos.losses import token_logprobs

    labels = batch["labels"]
    if labels.shape[0] == 1:
        logits_NV, targets_N = target_logits(model, batch)
        # the log-softmax in fp32: the logits are bf16 under bf16 autocast and bf16_master, and a bf16
        # log-prob of 2-4 nats is rounded to steps of 2^-6 (0.016 nat), as large as what a step changes
        logprobs_BT = -F.cross_entropy(logits_NV.float(), targets_N, reduction="none")[None]
        return logprobs_BT, torch.ones_like(logprobs_BT, dtype=torch.bool)
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
    targets_BT = labels[:, 1:]
    return token_logprobs(out.logits[:, :-1], targets_BT), targets_BT != -100

"""The supervised term's log-probs: each trained token of a tokenized micro-batch, computing logits
only where they get a gradient. SFT trains on them, the RL stage's SFT anchor (PPO-ptx) and the
held-out loss read them; living here, the RL stage needs nothing of the SFT stage."""

from __future__ import annotations

from typing import Any


def label_positions(labels_1d: Any) -> Any:
    """Positions whose *next* token is trained on: the only logits that get a gradient."""
    import torch

    nxt = labels_1d[1:] != -100
    return torch.nonzero(nxt, as_tuple=False).flatten()


def row_logprobs(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """(log-prob of each trained token, its mask) for one micro-batch, computing logits only where
    needed: a packed row keeps exactly its target positions (``logits_to_keep``); padded rows
    (hybrid models) take full logits and mask by the labels."""
    import torch
    import torch.nn.functional as F

    from posttrain.algos.losses import token_logprobs

    labels = batch["labels"]
    if labels.shape[0] == 1:
        pos = label_positions(labels[0])
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    attention_mask=batch.get("attention_mask"), logits_to_keep=pos, use_cache=False)
        logprobs_BT = -F.cross_entropy(out.logits[0].float(), labels[0, pos + 1], reduction="none")[None]
        return logprobs_BT, torch.ones_like(logprobs_BT, dtype=torch.bool)
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
    targets_BT = labels[:, 1:]
    return token_logprobs(out.logits[:, :-1], targets_BT), targets_BT != -100

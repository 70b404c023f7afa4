"""MoE routing during post-training: watch the routers, balance the experts, freeze what RL must not move.

NemotronH (like DeepSeek-V3) routes each token with a sigmoid router: ``s = σ(W·h)`` over E experts;
the top-k experts are chosen by ``s + b`` where ``b`` (``e_score_correction_bias``) is a per-expert
bias that takes no gradient, while the expert outputs are mixed with the unbiased ``s``. In
transformers the router is ``NemotronHTopkRouter``; its forward returns
``(router_logits_NE, topk_weights_NK, topk_indices_NK)`` for the N = B·T flattened tokens.

Two balancing mechanisms, as in the recipe:

* **Aux-loss-free bias** (update rate 1e-3): after each optimizer step, every expert's bias moves by
  ``rate·sign(mean_load − load_i)``: under-loaded experts become more likely to be picked, over-loaded
  ones less. No gradient, so balancing does not fight the task loss.
* **Sequence-level load-balancing loss** (× 1e-4, applied by the caller), DeepSeek-V3's form: for each
  sequence of T tokens, ``f_i = E/(K·T) · #(tokens routed to i)`` and ``P_i = mean_t s'_{t,i}`` with
  ``s'`` the scores normalised to sum 1 per token; ``L = Σ_i f_i·P_i`` (1 when perfectly balanced),
  averaged over sequences; summed over MoE layers like any per-layer auxiliary loss.

During RL the router weights are frozen (:func:`freeze_routers`): a policy-gradient step should
change what experts compute, not reshuffle which expert sees which token, which would make the
trainer's log-probs drift from the sampler's. The bias keeps following the observed load.

:class:`RouterMonitor` is how the trainer sees routing without touching the model code: a context
manager with forward hooks that record each router's scores (with their graph, so the balancing
loss can be back-propagated) and top-k choices. With activation checkpointing the recomputed
forward fires the hooks again during backward: harmless for the bias (every load doubles, the signs
stay), but take the balance loss before ``backward()``.

Shape suffixes: N flattened tokens (B·T), T tokens of one sequence, E experts, K experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Tensor = torch.Tensor


def is_router(module: nn.Module) -> bool:
    """A DeepSeek-style sigmoid router: a weight (E×H) and a correction-bias buffer (E)."""
    return isinstance(getattr(module, "weight", None), torch.Tensor) and isinstance(
        getattr(module, "e_score_correction_bias", None), torch.Tensor
    )


def find_routers(model: nn.Module) -> dict[str, nn.Module]:
    """Every router of the model by module name, in model order."""
    return {name: m for name, m in model.named_modules() if is_router(m)}


def freeze_routers(model: nn.Module) -> list[str]:
    """Stop gradients to router weights (RL). The correction bias is a buffer and stays updatable."""
    routers = find_routers(model)
    for m in routers.values():
        m.weight.requires_grad_(False)
    return list(routers)


def load_balancing_loss(
    scores_TE: Tensor, topk_idx_TK: Tensor, n_experts: int, k: int, seq_ids_T: Tensor | None = None
) -> Tensor:
    """Sequence-level balance loss Σ_i f_i·P_i, averaged over sequences (see the module docstring).

    ``scores_TE`` are the router's (sigmoid) scores; the gradient flows through P, not f (counts).
    ``seq_ids_T`` says which sequence each token belongs to (all one sequence when None). Leave out
    padding tokens before calling.
    """
    if seq_ids_T is None:
        seq_ids_T = torch.zeros(scores_TE.shape[0], dtype=torch.long, device=scores_TE.device)
    _, seq_T = torch.unique(seq_ids_T, return_inverse=True)
    S = int(seq_T.max()) + 1
    probs_TE = scores_TE / scores_TE.sum(dim=-1, keepdim=True)
    tokens_S = torch.zeros(S, device=scores_TE.device).index_add_(0, seq_T, torch.ones_like(seq_T, dtype=torch.float))
    chosen_TE = torch.zeros_like(scores_TE, dtype=torch.float).scatter_(1, topk_idx_TK, 1.0)
    count_SE = torch.zeros(S, n_experts, device=scores_TE.device).index_add_(0, seq_T, chosen_TE)
    f_SE = count_SE * n_experts / (k * tokens_S[:, None])
    P_SE = torch.zeros(S, n_experts, dtype=probs_TE.dtype, device=scores_TE.device).index_add_(0, seq_T, probs_TE)
    P_SE = P_SE / tokens_S[:, None]
    return (f_SE * P_SE).sum(dim=1).mean()


def expert_load(topk_idx_NK: Tensor, n_experts: int) -> Tensor:
    """How many token slots each expert received."""
    return torch.bincount(topk_idx_NK.reshape(-1), minlength=n_experts).float()


def update_expert_bias(bias_E: Tensor, load_E: Tensor, rate: float = 1e-3) -> Tensor:
    """Aux-loss-free update: ``b + rate·sign(mean(load) − load)`` (a new tensor; no gradient)."""
    load_E = load_E.to(bias_E.dtype)
    return bias_E + rate * torch.sign(load_E.mean() - load_E)


@dataclass
class RouterRecord:
    scores_NE: Tensor  # sigmoid scores, with autograd graph when grad is enabled
    topk_idx_NK: Tensor
    batch_shape: tuple[int, ...]  # the leading shape of the router's input, e.g. (B, T)


class RouterMonitor:
    """Context manager recording every router's forward passes; see the module docstring.

    >>> with RouterMonitor(model) as mon:
    ...     out = model(input_ids)
    ...     loss = ce + 1e-4 * mon.load_balancing_loss(attention_mask)
    ...     loss.backward(); optimizer.step()
    ...     mon.update_biases(rate=1e-3)
    """

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no MoE routers to monitor")
        self.records: dict[str, list[RouterRecord]] = {name: [] for name in self.routers}
        self._handles: list[Any] = []

    def __enter__(self) -> "RouterMonitor":
        for name, mod in self.routers.items():
            self._handles.append(mod.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, name: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
            router_logits, _, topk_idx = output
            shape = tuple(args[0].shape[:-1]) if args else (router_logits.shape[0],)
            self.records[name].append(RouterRecord(router_logits.sigmoid(), topk_idx.detach(), shape))

        return hook

    def clear(self) -> None:
        for recs in self.records.values():
            recs.clear()

    def observed_load(self) -> dict[str, Tensor]:
        """Per router, tokens routed to each expert over all recorded passes."""
        out = {}
        for name, recs in self.records.items():
            bias = self.routers[name].e_score_correction_bias
            E = bias.shape[0]
            out[name] = sum((expert_load(r.topk_idx_NK, E) for r in recs), torch.zeros(E, device=bias.device))
        return out

    def load_balancing_loss(self, attention_mask: Tensor | None = None) -> Tensor:
        """Sum over routers (and recorded passes) of the sequence-level balance loss.

        ``attention_mask`` (B, T), when given, leaves padding tokens out; it must match the shape
        of the recorded passes (one forward per mask).
        """
        total: Tensor | float = 0.0
        for name, recs in self.records.items():
            router = self.routers[name]
            E, K = router.weight.shape[0], getattr(router, "top_k", None)
            for r in recs:
                k = K if K is not None else r.topk_idx_NK.shape[1]
                device = r.scores_NE.device
                n_seq = r.batch_shape[0] if len(r.batch_shape) == 2 else 1
                seq_ids = torch.arange(n_seq, device=device).repeat_interleave(r.scores_NE.shape[0] // n_seq)
                if attention_mask is None:
                    keep = torch.ones_like(seq_ids, dtype=torch.bool)
                else:
                    keep = attention_mask.reshape(-1).bool().to(device)
                if keep.any():
                    total = total + load_balancing_loss(
                        r.scores_NE[keep], r.topk_idx_NK[keep], E, k, seq_ids[keep]
                    )
        return torch.as_tensor(total)

    @torch.no_grad()
    def update_biases(self, rate: float = 1e-3) -> dict[str, Tensor]:
        """Apply the aux-loss-free bias update from the load seen since the last clear; then clear.

        Returns the load each router saw (for metrics such as max/mean load).
        """
        loads = self.observed_load()
        for name, load in loads.items():
            bias = self.routers[name].e_score_correction_bias
            bias.copy_(update_expert_bias(bias, load.to(bias.device), rate))
        self.clear()
        return loads

"""bf16 weights with an fp32 master copy: ``train.precision: bf16_master``.

The dtypes, and why. Under ``bf16`` (autocast) the weights are fp32 and autocast casts them to bf16
per matmul, while everything between the matmuls (RMSNorm, SiLU, residual adds, the attention
softmax, autograd's own bookkeeping) runs in fp32 on fp32 activations. Here the model's parameters
*are* bf16: forward and backward run in bf16 throughout, with no per-op casts of the weights and
activations half the size (HF's RMSNorm and eager attention's softmax still compute in fp32 inside,
casting in and out), and backward produces bf16 gradients.

bf16 keeps 8 significant bits: a weight near 1 can only move in steps of 2^-8 ≈ 0.004, and an
update smaller than half a step is rounded away. AdamW's update is about ``lr`` per weight whatever
the weight's size, so at the default ``lr`` = 5e-5 every update to a bf16 weight larger than ~0.03
in magnitude (every RMSNorm gain, ~1) is lost, step after step, and more as the schedule decays
the lr. Hence the master copy: every parameter has an fp32 twin, and the optimizer only ever sees
the twins::

    backward (bf16 grads) → fp32 master grads → clip (fp32) → AdamW steps the masters (fp32 states)
                          → bf16 params ← round(masters)

Small updates accumulate in the masters until they move the bf16 weight. What stays fp32: the
masters, their gradients during the step, the AdamW moments, the loss (the losses upcast the logits
before the log-softmax: ``algos/losses.py``, ``train/supervised.py``) and the rotary-embedding
frequencies (only parameters are cast: ``model.to(bfloat16)`` would also round the RoPE ``inv_freq``
buffer, an angle error that grows with position).

What is measured during the run (the held-out loss) is the bf16 weights', as under autocast it is
the bf16 matmuls'. Checkpoints are written from the masters, so they are fp32 and load in plain
transformers as every other checkpoint does; a resumed run loads those fp32 weights into new
masters and rounds them again, which is exactly the bf16 model the unbroken run had (kill -9 +
resume is bit-identical).
Frozen parameters (``train.freeze_layers``) keep an fp32 copy too, only so that they are saved
unrounded. The optimizer state is that of an AdamW over the masters, in the same order as an fp32
run's over its parameters.

Why a class of our own: torch.optim's AdamW keeps its states in the parameter's dtype and has no
master-weights option (a PR adding one to fused Adam was declined in 2026 as BC-breaking); apex's
and TransformerEngine's ``FusedAdam(master_weights=True)`` are CUDA-only; torchao's AdamW offers
bf16 stochastic rounding instead of masters. The whole mechanism is the few lines below.

Not supported (refused before any weight loads, :func:`refusal`): LoRA (the frozen base would be
saved merged from bf16), hybrid Mamba models (the recurrent scan in bf16 is unmeasured), MoE models
(the aux-loss-free expert biases move by ~1e-3 a step: lost in bf16), and the RL/DPO stages (their
numerics need fp32: ``models/precision.py``; ``configs/train.py: refuse_bf16_master``).
"""

from __future__ import annotations

from typing import Any


class MasterWeights:
    """The model's parameters cast to bf16 in place, each with an fp32 master (see the module docstring).

    ``masters`` are the trainable parameters' fp32 twins, in ``model.parameters()`` order: build the
    optimizer over them, clip them. Per step: :meth:`grads_to_masters` after backward, then
    :meth:`step` (the optimizer's step, then :meth:`masters_to_model`).
    """

    def __init__(self, model: Any) -> None:
        import torch

        self.model = model
        params = list(model.parameters())  # deduplicated: a tied embedding / output head is one tensor
        with torch.no_grad():
            self._fp32 = [p.detach().float().clone() for p in params]  # every parameter, frozen ones too
            for p in params:
                p.data = p.data.to(torch.bfloat16)  # the same Parameter objects: ties and requires_grad survive
        self._pairs = [(p, m) for p, m in zip(params, self._fp32) if p.requires_grad]
        self.masters = [m for _, m in self._pairs]

    def grads_to_masters(self) -> None:
        """The step's bf16 gradients, as fp32, on the masters; the model's own gradients are dropped."""
        for p, m in self._pairs:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    def step(self, opt: Any) -> None:
        """``opt`` (over :attr:`masters`) steps the masters; the bf16 parameters follow."""
        opt.step()
        self.masters_to_model()

    def masters_to_model(self) -> None:
        """The bf16 parameters ← the masters (round to nearest)."""
        import torch

        with torch.no_grad():
            torch._foreach_copy_([p for p, _ in self._pairs], self.masters)

    def state_dict(self) -> dict[str, Any]:
        """The model's state dict with every parameter replaced by its fp32 master: what is saved."""
        by_param = {id(p): m for p, m in zip(self.model.parameters(), self._fp32)}
        state = self.model.state_dict()
        for name, p in self.model.named_parameters(remove_duplicate=False):  # tied names share one master
            state[name] = by_param[id(p)]
        return state


def refusal(model_spec: str) -> str | None:
    """Why ``bf16_master`` cannot train ``model_spec`` (a hybrid or MoE model), or None; reads only the
    model's config, so the run stops before any weight loads."""
    from posttrain.models.facts import is_hybrid
    from posttrain.models.loading import model_config

    config = model_config(model_spec)
    kind = getattr(config, "model_type", "?")
    if is_hybrid(config):
        return f"{model_spec} ({kind}) is a hybrid Mamba model: its recurrent scan in bf16 weights is not measured"
    if any(getattr(config, a, None) for a in ("n_routed_experts", "num_local_experts", "num_experts")):
        return f"{model_spec} ({kind}) is an MoE model: its expert-bias updates (~1e-3 a step) would be lost in bf16"
    return None

"""The loop's step under bf16 autocast (``train/loop.py: update``): one autocast region over every
micro-batch, backward with autocast off inside it. The weights' bf16 casts are then made once a
step, not once a micro-batch, and the step is the same to the bit as one autocast context per
micro-batch with backward outside (what the loop did before)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

ROWS = [[5, 9, 13, 2, 7, 11], [3, 3, 8], [21, 4, 6, 17, 30, 2, 9, 40], [12, 1], [7, 8, 9, 10, 11]]
MICRO = [[0, 1], [2], [3, 4]]


class Stage:
    name, balance_loss = "ce", False

    def __init__(self) -> None:
        self.num_tokens = float(sum(len(r) - 1 for r in ROWS))

    def loss_inputs(self, model, idx):
        from posttrain.algos.losses import LossInputs, token_logprobs

        T = max(len(ROWS[i]) for i in idx)
        ids = torch.zeros(len(idx), T, dtype=torch.long)
        mask = torch.zeros(len(idx), T - 1, dtype=torch.bool)
        for b, i in enumerate(idx):
            ids[b, : len(ROWS[i])] = torch.tensor(ROWS[i])
            mask[b, : len(ROWS[i]) - 1] = True
        logits = model(input_ids=ids).logits
        return LossInputs(token_logprobs(logits[:, :-1].float(), ids[:, 1:]), mask, num_tokens=self.num_tokens)

    def after_update(self):
        pass


def _trainer(model):
    from posttrain.configs.train import MoEConfig, OptimConfig
    from posttrain.train.autocast import autocast, autocast_off
    from posttrain.train.loop import Trainer

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    cfg = SimpleNamespace(optim=OptimConfig(lr=1e-3, grad_clip=1.0), moe=MoEConfig())
    return Trainer(cfg, model, None, "cpu", opt, list(model.parameters()), lambda: autocast("bf16", "cpu"), None,
                   None, amp_off=lambda: autocast_off("bf16", "cpu"))


def _weight_casts(fn, shapes: set[tuple[int, ...]]) -> int:
    """dtype casts of tensors shaped like a weight matrix (rows here are too short for an
    activation to share a shape): the bf16 casts of the forward and the fp32 casts of their grads."""
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        fn()
    return sum(e.count for e in prof.key_averages(group_by_input_shape=True)
               if e.key == "aten::_to_copy" and e.input_shapes and tuple(e.input_shapes[0]) in shapes)


def test_one_autocast_region_per_step_same_update_fewer_casts(one_thread):
    from posttrain.algos.losses import make_loss
    from posttrain.models.tiny import build_tiny
    from posttrain.train.loop import update

    def fresh():
        m = build_tiny("tiny-llama", seed=0)
        m.config.use_cache = False
        return m.train()

    model = fresh()
    t = _trainer(model)
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    casts = _weight_casts(lambda: update(t, Stage(), MICRO, make_loss("ce")), shapes)

    ref = fresh()  # the step as before: an autocast context per micro-batch, backward outside
    tr = _trainer(ref)
    loss_fn, stage = make_loss("ce"), Stage()

    def by_hand():
        tr.opt.zero_grad(set_to_none=True)
        for mb in MICRO:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(stage.loss_inputs(ref, mb)).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.params, 1.0)
        tr.opt.step()

    ref_casts = _weight_casts(by_hand, shapes)
    for (k, w), w_ref in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(w, w_ref), k
    # three micro-batches, 15 weight matrices (the tied LM head among them; the embedding lookup
    # casts nothing): each was cast to bf16 three times before and once now; its gradient is cast
    # back to fp32 once a micro-batch either way
    n_weights = sum(1 for p in model.parameters() if p.dim() == 2)
    assert ref_casts == 6 * n_weights and casts == 4 * n_weights

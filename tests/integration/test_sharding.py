"""The sharded trainer without Ray (``train/sharding.py``): two gloo processes holding the tiny
Llama with FSDP2 take the same step as one process on the whole batch.

The step is the loop's own ``update`` (micro-batches, token normalisation over the whole step,
clipping, AdamW) on five rows of different lengths: one process runs them as three micro-batches;
two ranks split the rows (2 and 3) into 1 and 2 micro-batches, so rank 0 also runs one padding pass;
and, as when a step trains fewer rows than there are ranks, rank 0 with no rows at all (padding only).
fp32 throughout. Tolerances: the loss and its metrics to 1e-6 relative, the gradient norm to 1e-5
relative (the ranks' float sums are added in another order), every weight after the AdamW step to
1e-6 absolute (lr 1e-3, so a step moves a weight by ~1e-3: the update agrees to ~0.1%).
"""

from __future__ import annotations

import socket
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

ROWS = [[5, 9, 13, 2, 7, 11], [3, 3, 8], [21, 4, 6, 17, 30, 2, 9, 40], [12, 1], [7, 8, 9, 10, 11]]
SINGLE = [[0, 1], [2], [3, 4]]  # one process: three micro-batches of the whole batch
SHARES = {"split": [[[0, 1]], [[2], [3, 4]]],  # two ranks: rows 0-1 on rank 0, rows 2-4 on rank 1
          "rank0_empty": [[], [[0, 1], [2, 3, 4]]]}  # rank 0 has nothing to train on: padding passes only


class CEStep:
    """Loss inputs of micro-batch ``idx`` (row indices): next-token log-probs of each row, the
    denominator the whole step's token count, as the RL and SFT stages do."""

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
        logits = model(input_ids=ids).logits  # right padding under a causal mask: rows unaffected
        return LossInputs(token_logprobs(logits[:, :-1], ids[:, 1:]), mask, num_tokens=self.num_tokens)


class Stage(CEStep):
    name, balance_loss = "ce", False

    def after_update(self):
        pass


def _step(rank: int, world: int, port: int, out: str, layout: str = "split") -> None:
    from posttrain.algos.losses import make_loss
    from posttrain.configs.train import MoEConfig, OptimConfig
    from posttrain.models.tiny import build_tiny
    from posttrain.train import sharding
    from posttrain.train.loop import Trainer, update

    torch.set_num_threads(1)
    ranks = sharding.init(rank, world, "gloo", "127.0.0.1", port, timeout_s=120) if world > 1 else None
    model = build_tiny("tiny-llama", seed=0)
    model.config.use_cache = False
    if ranks is not None:
        sharding.shard_model(model, ranks)
    params = list(model.parameters())
    # eps 1e-6, not AdamW's 1e-8: Adam's first step moves a weight by lr * g / (|g| + eps), which for
    # a gradient near eps turns the gradient's float-order error into a visible share of the update
    # (an AVX2 EPYC: 2 of 8192 weights whose gradient was ~7e-9 moved 4.18e-4 vs 4.15e-4, 3e-6 apart).
    # At 1e-6 no gradient of this step sits in that regime, and the comparison is of sharding alone.
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-6)
    cfg = SimpleNamespace(optim=OptimConfig(lr=1e-3, grad_clip=1.0), moe=MoEConfig())
    t = Trainer(cfg, model, None, "cpu", opt, params, nullcontext, None, None, ranks=ranks)
    micro = SINGLE if ranks is None else sharding.interleave(SHARES[layout])
    m = update(t, Stage(), micro, make_loss("ce"))
    weights = sharding.full_state(model)[0] if ranks is not None else model.state_dict()
    if rank == 0:
        torch.save({"metrics": m, "weights": {k: v.clone() for k, v in weights.items()}}, out)
    sharding.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "one.pt"
    _step(0, 1, 0, str(out))
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module", params=list(SHARES))
def steps(request, one_process, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding") / "two.pt"
    mp.spawn(_step, args=(2, _free_port(), str(out), request.param), nprocs=2)
    return one_process, torch.load(out, weights_only=False)


def test_two_ranks_give_the_loss_of_one_process(steps):
    one, two = steps
    assert set(one["metrics"]) == set(two["metrics"])
    for k in ("loss", "nll"):
        assert two["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-6)
    assert two["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-5)
    assert one["metrics"]["grad_norm"] > 1.0  # clipping was active: the sharded norm is the global one


def test_two_ranks_after_one_adamw_step_have_the_weights_of_one_process(steps):
    one, two = steps
    assert set(two["weights"]) == set(one["weights"])  # HF names, lm_head (tied) included
    for k, w in one["weights"].items():
        assert torch.allclose(two["weights"][k], w, rtol=0, atol=1e-6), k
    from posttrain.models.tiny import build_tiny

    init = build_tiny("tiny-llama", seed=0).state_dict()
    moved = max(float((one["weights"][k] - init[k]).abs().max()) for k in init)
    assert moved > 5e-4  # the step did move the weights (lr 1e-3)


def test_interleave_and_share_give_every_rank_the_same_number_of_passes():
    from posttrain.train.sharding import Ranks, interleave, share

    micro = interleave([[["a"]], [["b"], ["c"]]])
    assert micro == [["a"], ["b"], None, ["c"]]
    assert share(micro, Ranks(0, 2, "cpu")) == [["a"], None]
    assert share(micro, Ranks(1, 2, "cpu")) == [["b"], ["c"]]
    assert share([1, 2, 3], Ranks(1, 2, "cpu")) == [2, None]  # any list: padded to the same count
    assert interleave([[1, 2]]) == [1, 2] and share([1, 2], None) == [1, 2]

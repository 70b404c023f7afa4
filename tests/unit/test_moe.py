"""MoE routing helpers: hand-computed balance loss and bias update; router freezing on tiny NemotronH."""

import copy

import pytest
import torch

from posttrain.models.moe import (
    RouterMonitor,
    expert_load,
    find_routers,
    freeze_routers,
    load_balancing_loss,
    update_expert_bias,
)


def test_load_balancing_loss_one_sequence():
    # E = 2, K = 1, T = 2, both tokens routed to expert 0:
    #   f = E/(K·T)·count = 2/2·[2, 0] = [2, 0]
    #   normalised scores: [.6, .2]/.8 = [.75, .25]; [.3, .3]/.6 = [.5, .5] → P = [.625, .375]
    #   L = 2·.625 + 0·.375 = 1.25
    scores = torch.tensor([[0.6, 0.2], [0.3, 0.3]], requires_grad=True)
    loss = load_balancing_loss(scores, torch.tensor([[0], [0]]), n_experts=2, k=1)
    assert loss.item() == pytest.approx(1.25)
    loss.backward()
    assert scores.grad.abs().sum() > 0  # the gradient flows through P (the scores)


def test_load_balancing_loss_is_one_when_balanced():
    # tokens to experts 0 and 1: f = [1, 1]; L = Σ P_i = 1 whatever the scores
    loss = load_balancing_loss(torch.tensor([[0.6, 0.2], [0.3, 0.3]]), torch.tensor([[0], [1]]), 2, 1)
    assert loss.item() == pytest.approx(1.0)


def test_load_balancing_loss_averages_over_sequences():
    # sequence a = the 1.25 case above; sequence b: one token, scores [.1, .3] → P = [.25, .75],
    # routed to expert 1: f = 2/(1·1)·[0, 1] = [0, 2] → L = 2·.75 = 1.5. Mean: (1.25 + 1.5)/2 = 1.375
    scores = torch.tensor([[0.6, 0.2], [0.1, 0.3], [0.3, 0.3]])
    idx = torch.tensor([[0], [1], [0]])
    loss = load_balancing_loss(scores, idx, 2, 1, seq_ids_T=torch.tensor([5, 9, 5]))
    assert loss.item() == pytest.approx(1.375)


def test_load_balancing_loss_top2():
    # E = 3, K = 2, T = 1: scores [.5, .3, .2] (sum 1), experts {0, 1}: f = 3/(2·1)·[1, 1, 0] = [1.5, 1.5, 0]
    # L = 1.5·.5 + 1.5·.3 = 1.2
    loss = load_balancing_loss(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([[0, 1]]), 3, 2)
    assert loss.item() == pytest.approx(1.2)


def test_update_expert_bias_direction():
    # load [10, 2, 4, 4], mean 5 → sign(5 − load) = [−1, +1, +1, +1]: lower the busy expert, raise the rest
    new = update_expert_bias(torch.zeros(4), torch.tensor([10.0, 2.0, 4.0, 4.0]), rate=1e-3)
    torch.testing.assert_close(new, torch.tensor([-1e-3, 1e-3, 1e-3, 1e-3]))
    # perfectly balanced → unchanged
    torch.testing.assert_close(update_expert_bias(torch.ones(3), torch.full((3,), 7.0)), torch.ones(3))


def test_expert_load_counts_slots():
    assert expert_load(torch.tensor([[0, 2], [2, 1]]), 4).tolist() == [1, 1, 2, 0]


@pytest.fixture(scope="module")
def tiny_moe():
    from posttrain.models.loading import load_model

    return load_model("tiny-nemotronh", device="cpu").model


def test_find_routers_on_tiny_nemotronh(tiny_moe):
    routers = find_routers(tiny_moe)
    assert list(routers) == ["model.layers.1.mixer.gate", "model.layers.3.mixer.gate"]
    assert all(r.weight.shape == (4, 64) and r.e_score_correction_bias.shape == (4,) for r in routers.values())


def test_monitor_records_scores_and_topk_and_unhooks(tiny_moe):
    ids = torch.randint(3, 500, (2, 5), generator=torch.Generator().manual_seed(0))
    with RouterMonitor(tiny_moe) as mon, torch.no_grad():
        tiny_moe(ids)
    for name, recs in mon.records.items():
        (rec,) = recs
        assert rec.batch_shape == (2, 5)
        assert rec.scores_NE.shape == (10, 4) and rec.topk_idx_NK.shape == (10, 2)
        assert ((rec.scores_NE > 0) & (rec.scores_NE < 1)).all()  # sigmoid scores
        # with one expert group, the choice is the top 2 of score + bias
        bias = mon.routers[name].e_score_correction_bias
        expect = torch.topk(rec.scores_NE + bias, 2).indices.sort(dim=1).values
        assert torch.equal(rec.topk_idx_NK.sort(dim=1).values, expect)
    assert sum(mon.observed_load()[name].sum() for name in mon.records) == 2 * 10 * 2
    # the monitor's loss: rows 0–4 are sequence 0, rows 5–9 sequence 1; padding (mask 0) left out
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    keep = mask.reshape(-1).bool()
    seq_ids = torch.tensor([0] * 5 + [1] * 5)
    expect = sum(
        load_balancing_loss(r.scores_NE[keep], r.topk_idx_NK[keep], 4, 2, seq_ids[keep])
        for (r,) in mon.records.values()
    )
    torch.testing.assert_close(mon.load_balancing_loss(mask), expect)
    assert not torch.allclose(mon.load_balancing_loss(), expect)  # the padding did change it
    with torch.no_grad():
        tiny_moe(ids)  # outside the context: nothing more is recorded
    assert all(len(recs) == 1 for recs in mon.records.values())


def _train_step(model):
    """One AdamW step on LM loss + 1e-4 · balance loss, then the aux-loss-free bias update."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with RouterMonitor(model) as mon:
        logits = model(ids).logits
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss = ce + 1e-4 * mon.load_balancing_loss(mask)
        loss.backward()
        opt.step()
        return mon.update_biases(rate=1e-3)


def test_frozen_routers_do_not_move_but_biases_do(tiny_moe):
    frozen = copy.deepcopy(tiny_moe)
    unfrozen = copy.deepcopy(tiny_moe)
    assert freeze_routers(frozen) == list(find_routers(frozen))
    before = {n: (r.weight.clone(), r.e_score_correction_bias.clone()) for n, r in find_routers(frozen).items()}
    embed_before = frozen.get_input_embeddings().weight.clone()

    loads = _train_step(frozen)
    for name, router in find_routers(frozen).items():
        w0, b0 = before[name]
        assert torch.equal(router.weight, w0)  # bit-identical
        assert loads[name].sum() == 2 * 6 * 2  # B·T tokens × K slots
        # each expert moved by rate·sign(mean − load) from the load this step observed
        torch.testing.assert_close(router.e_score_correction_bias, update_expert_bias(b0, loads[name], 1e-3))
    # with 12 tokens over 4 experts some router is unbalanced, so some bias did move
    assert any(not torch.equal(r.e_score_correction_bias, before[n][1]) for n, r in find_routers(frozen).items())
    assert not torch.equal(frozen.get_input_embeddings().weight, embed_before)  # the rest trained

    # the control: without freezing the same step moves the router weights
    _train_step(unfrozen)
    assert any(not torch.equal(r.weight, before[n][0]) for n, r in find_routers(unfrozen).items())

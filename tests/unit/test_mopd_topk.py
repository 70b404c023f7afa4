"""MOPD's top-k KL variant: the pure KL over the teacher's top-k (hand-computed), its term in the pg
loss, the log-prob heads in models/logprobs.py against a naive full-vocabulary computation, and the
whole path (teacher pool → batch.extras → the RL stage's backward) on tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algos.losses import LossInputs, make_loss, topk_kl
from posttrain.configs import ConfigError, load_config
from posttrain.configs.distill import DistillConfig, TeachersConfig
from posttrain.scorers.teachers import ScoringTeacherPool
from posttrain.models.loading import load_model
from posttrain.models.tiny import build_tiny, tiny_tokenizer
from posttrain.models.logprobs import sampled_logprobs, topk_logprobs
from posttrain.configs.rl import AlgoConfig
from posttrain.episodes.collect import Rollout
from posttrain.train.rl import filtered_batch

pytestmark = pytest.mark.usefixtures("one_thread")

L = math.log


def test_topk_kl_hand_computed():
    # teacher top-2 probs .6, .2 → renormalised .75, .25; student .3, .3 → .5, .5
    t = torch.tensor([[[L(0.6), L(0.2)]]])
    s = torch.tensor([[[L(0.3), L(0.3)]]])
    fwd = 0.75 * L(0.75 / 0.5) + 0.25 * L(0.25 / 0.5)  # 0.130812
    rev = 0.5 * L(0.5 / 0.75) + 0.5 * L(0.5 / 0.25)  # 0.143841
    torch.testing.assert_close(topk_kl(s, t, "forward"), torch.tensor([[fwd]]))
    torch.testing.assert_close(topk_kl(s, t, "reverse"), torch.tensor([[rev]]))
    proportional = torch.tensor([[[L(0.3), L(0.1)]]])  # same shape on the set: zero either way
    for direction in ("forward", "reverse"):
        assert float(topk_kl(proportional, t, direction).abs()) < 1e-6


def test_topk_kl_term_adds_to_the_pg_loss():
    s = torch.tensor([[[L(0.3), L(0.3)], [0.0, 0.0]]], requires_grad=True)
    t = torch.tensor([[[L(0.6), L(0.2)], [0.0, 0.0]]])
    x = LossInputs(torch.zeros(1, 2, requires_grad=True), torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2),
                   topk_logprobs_BTK=s, topk_target_logprobs_BTK=t)
    loss = make_loss("pg", [{"type": "topk_kl", "coef": 0.5, "direction": "forward"}], is_mode="none")
    assert loss.dense  # a gradient where the advantage is 0: the RL stage must not skip rows for it
    out = loss(x)
    fwd = 0.75 * L(1.5) + 0.25 * L(0.5)
    assert float(out.loss.detach()) == pytest.approx(0.5 * fwd, abs=1e-6)
    assert out.metrics["topk_kl"] == pytest.approx(fwd, abs=1e-6)
    out.loss.backward()
    # d/ds of forward KL with renormalised student q = softmax(s): q − p_T → (.5 − .75, .5 − .25) · 0.5
    torch.testing.assert_close(s.grad[0, 0], torch.tensor([-0.125, 0.125]))
    assert s.grad[0, 1].abs().sum() == 0  # masked position
    with pytest.raises(ValueError, match="topk_kl term needs"):
        loss(LossInputs(x.logprobs_BT, x.mask_BT, x.advantages_BT))
    assert not make_loss("pg").dense


SEQS = [([5, 17, 33, 40, 41, 42], [0, 0, 0, 1, 1, 1]), ([7, 8, 9, 10, 11, 12, 13], [0, 0, 1, 1, 0, 1, 1])]


@pytest.mark.parametrize("pack", [True, False])
def test_logprob_heads_match_full_vocabulary(pack):
    model = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.eval()
    ids, masks = [s for s, _ in SEQS], [m for _, m in SEQS]
    with torch.no_grad():
        full = [torch.log_softmax(model(input_ids=torch.tensor([i])).logits[0].float() / 0.7, -1) for i in ids]
        want = [torch.stack([lp[t - 1] for t, m in enumerate(mask) if m]) for lp, mask in zip(full, masks)]  # n × V
        plain = sampled_logprobs(model, ids, masks, 0.7, pack)
        top = topk_logprobs(model, ids, masks, 3, 0.7, pack)
        extra = sampled_logprobs(model, ids, masks, 0.7, pack, extra_ids=[t[2] for t in top])
    for (seq, mask), w_NV, p, (sampled, lp, tid), e in zip(SEQS, want, plain, top, extra):
        ref = w_NV.topk(3, dim=-1)
        torch.testing.assert_close(lp, ref.values, atol=2e-5, rtol=1e-5)
        assert torch.equal(tid, ref.indices) and torch.equal(sampled, p)
        assert torch.equal(e[:, 0], p)  # column 0 is exactly the plain result
        torch.testing.assert_close(e[:, 1:], lp, atol=1e-6, rtol=1e-6)  # the student = teacher here


def _rollouts():
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(3):
        prompt = torch.randint(3, 500, (4,), generator=g).tolist()
        completion = torch.randint(3, 500, (3 + i,), generator=g).tolist()
        out.append(Rollout("math", f"t{i}", i, prompt + completion, [0] * 4 + [1] * len(completion),
                           [-6.2] * len(completion), "stop", 0.0))
    return out


def _topk_step(pg_backward, teacher_seed):
    student = load_model("tiny-llama", device="cpu", dtype=torch.float32).model
    teacher = build_tiny("tiny-llama", len(tiny_tokenizer()), teacher_seed)
    pool = ScoringTeacherPool(TeachersConfig(models=[{"name": "t", "model": "x", "domains": ["math"]}], topk=4),
                       tiny_tokenizer(), loader=lambda spec: (teacher, tiny_tokenizer()))
    rollouts = _rollouts()
    batch, _ = filtered_batch(rollouts, AlgoConfig(overlong_filter=False, dynamic_filter=False))
    pool(rollouts, batch)
    assert batch.extras["topk_ids_BTK"].shape == (3, 5, 4)
    with torch.no_grad():
        plain = sampled_logprobs(teacher, [r.token_ids for r in rollouts], [r.loss_mask for r in rollouts])
    for b, lp in enumerate(plain):  # the sampled column still comes out as the plain path gives it
        torch.testing.assert_close(batch.teacher_logprobs_BT[b, : lp.shape[0]], lp)
    zero_adv = torch.zeros_like(batch.mask_BT)  # only the top-k term can produce a gradient
    out = pg_backward(student, rollouts, batch, zero_adv,
                      make_loss("pg", [{"type": "topk_kl", "coef": 1.0}], is_mode="none"))
    assert out["rollouts_trained"] == 3  # zero advantage, but the KL term trains: nothing skipped
    return out["topk_kl"], sum(float(p.grad.abs().sum()) for p in student.parameters() if p.grad is not None)


def test_topk_path_through_the_pool_and_the_backward(pg_backward):
    kl_same, grad_same = _topk_step(pg_backward, teacher_seed=0)  # teacher = student
    kl_other, grad_other = _topk_step(pg_backward, teacher_seed=1)
    assert kl_same < 1e-6 and kl_other > 1e-4
    assert grad_other > 0 and grad_same < 1e-3 * grad_other  # float noise only when they agree


def test_topk_config_must_be_consistent():
    base = ["envs=[{name: math}]", "teachers.models=[{name: a, model: m, domains: [math]}]"]
    with pytest.raises(ConfigError, match="needs both teachers.topk"):
        load_config(DistillConfig, None, [*base, "teachers.topk=4"])
    with pytest.raises(ConfigError, match="needs both teachers.topk"):
        load_config(DistillConfig, None, [*base, "algo.loss_terms=[{type: topk_kl, coef: 0.1}]"])
    cfg = load_config(DistillConfig, None, [*base, "teachers.topk=4", "algo.loss_terms=[{type: topk_kl, coef: 0.1}]"])
    assert cfg.teachers.topk == 4
    with pytest.raises(ConfigError, match="local teachers"):
        load_config(DistillConfig, None, ["envs=[{name: math}]", "teachers.topk=4",
                                          "teachers.models=[{name: a, url: 'http://x/v1', domains: [math]}]"])

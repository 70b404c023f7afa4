"""engines/static_llama.py: the static-cache decode loop against the model's own forward.

Teacher forcing is the reference: the logits a row's prefill + single-token steps produce must be
the logits ``model.forward`` gives the whole sequence (fp32: to float rounding; bf16 on prepacked
weights and fused small ops: to bf16 rounding). Then the engine: rows that stop at different steps
(cache compaction), capacity growth past the first allocation, repacking after a weight update,
and which modules may take the packed path at all.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.engines import static_llama
from posttrain.engines.base import SamplingParams
from posttrain.engines.hf import HFGenerator, inverse_cdf
from posttrain.models.loading import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 17, 33, 2, 9], [40, 41], [7, 7, 8, 100, 101, 102, 103]]  # unequal: left padding


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu", dtype=torch.float32)


def decode_logits(model, prompts, tokens, packed):
    """Logits [rows, steps + 1, V] from the decoder: prefill, then each row's ``tokens`` one at a time."""
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        valid[i, width - len(p):] = True
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    pack = static_llama.PackedWeights(model) if packed else None
    with torch.inference_mode():
        dec = static_llama.StaticCacheDecoder(model, len(prompts), width, tokens.shape[1], pack)
        out = [dec.prefill(ids, valid, positions, torch.arange(len(prompts)))]
        pos = positions[:, -1] + 1
        for s in range(tokens.shape[1]):
            out.append(dec.step(tokens[:, s], pos + s))
    return torch.stack(out, 1), dec


def forward_logits(model, prompts, tokens):
    rows = []
    with torch.inference_mode():
        for p, t in zip(prompts, tokens.tolist()):
            logits = model(torch.tensor([p + t])).logits[0].float()
            rows.append(logits[len(p) - 1:])
    return torch.stack(rows)


def test_fp32_decode_matches_forward_across_capacity_growth(tiny):
    steps = static_llama.GROW_SLOTS + 9  # past the first allocation: the buffers grow once
    tokens = torch.randint(0, tiny.model.config.vocab_size, (len(PROMPTS), steps), generator=torch.Generator().manual_seed(0))
    got, dec = decode_logits(tiny.model, PROMPTS, tokens, packed=False)
    assert dec.capacity > max(map(len, PROMPTS)) + static_llama.GROW_SLOTS
    want = forward_logits(tiny.model, PROMPTS, tokens)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_bf16_packed_decode_matches_bf16_forward(tiny):
    model = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.to(torch.bfloat16)
    assert static_llama.PackedWeights.eligible(model)
    tokens = torch.randint(0, model.config.vocab_size, (len(PROMPTS), 12), generator=torch.Generator().manual_seed(1))
    got, _ = decode_logits(model, PROMPTS, tokens, packed=True)
    want = forward_logits(model, PROMPTS, tokens)
    # different rounding order (fused norm, one rotary pass, fp32-accumulated matmuls): bf16 error only
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.02, err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


def test_eligibility(tiny):
    assert static_llama.supports(tiny.model)
    assert not static_llama.PackedWeights.eligible(tiny.model)  # fp32: the module path
    model = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.to(torch.bfloat16)
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out)
    try:
        assert not static_llama.PackedWeights.eligible(model)  # a hook must run: module calls
    finally:
        handle.remove()
    assert static_llama.PackedWeights.eligible(model)
    plain = model.model.layers[0].self_attn.q_proj
    model.model.layers[0].self_attn.q_proj = torch.nn.Sequential(plain)  # an adapter-like wrapper
    assert not static_llama.PackedWeights.eligible(model)
    model.model.layers[0].self_attn.q_proj = plain
    assert not static_llama.PackedWeights.eligible(model.to("meta"))  # not on the CPU
    nh = load_model("tiny-nemotronh", device="cpu", dtype=torch.float32)
    assert not static_llama.supports(nh.model)


def teacher_forced(model, c):
    with torch.inference_mode():
        logits = model(torch.tensor([c.prompt_ids + c.token_ids])).logits[0, len(c.prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]


def test_packed_engine_rows_stop_apart_and_match_teacher_forcing(tiny):
    gen = HFGenerator(tiny.model, tiny.tokenizer, batch_size=16, dtype="bf16")
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=4, seed=7)
    msgs = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "hi"}]]
    first = gen.generate(msgs, params)
    # stop on the two tokens the rows sample most: rows now end at different steps, so the cache is
    # compacted mid-batch (without hooks, which would take the packed path away)
    counts = torch.bincount(torch.tensor([t for comps in first for c in comps for t in c.token_ids]))
    gen.stop_ids = frozenset(counts.topk(2).indices.tolist())
    out = gen.generate(msgs, params)
    reasons = [c.finish_reason for comps in out for c in comps]
    assert "stop" in reasons and len({len(c.token_ids) for comps in out for c in comps}) > 2
    for comps in out:
        for c in comps:
            assert abs(teacher_forced(gen.model, c) - torch.tensor(c.logprobs)).max() < 0.05
    assert [[c.token_ids for c in comps] for comps in gen.generate(msgs, params)] == [[c.token_ids for c in comps] for comps in out]


def test_weight_update_repacks(tiny):
    model = load_model("tiny-llama", device="cpu", dtype=torch.float32).model
    gen = HFGenerator(model, tiny.tokenizer, dtype="bf16", greedy_in_dtype=True)
    msgs = [[{"role": "user", "content": "What is 2 + 2?"}]]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = gen.generate(msgs, greedy)[0][0]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.3)  # an "optimizer step" that changes every logit
    gen.update_weights(model)
    after = gen.generate(msgs, greedy)[0][0]
    fresh = HFGenerator(model, tiny.tokenizer, dtype="bf16", greedy_in_dtype=True).generate(msgs, greedy)[0][0]
    assert after.token_ids == fresh.token_ids and after.logprobs == fresh.logprobs
    assert after.token_ids != before.token_ids
    # a weight replaced rather than changed in place (``p.data = ...``) also repacks
    bf16 = gen.model
    pack = gen._packed(bf16)
    bf16.lm_head.weight.data = bf16.lm_head.weight.data.clone().neg_()
    assert gen._packed(bf16) is not pack


@pytest.mark.parametrize("vocab", [3, 256, 1000, 49152])
def test_inverse_cdf_is_the_full_cumsum_pick(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=g) * 3
    logits[:, ::7] = float("-inf")  # zero-mass tokens, never to be picked
    probs = torch.softmax(logits, -1)
    u = torch.rand(64, generator=g)
    u[:4] = torch.tensor([0.0, 0.5, 0.999999, 1 - 2**-24])
    cdf = probs.cumsum(-1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=vocab - 1)
    got = inverse_cdf(probs, u)
    assert (probs.gather(-1, got[:, None]) > 0).all()
    # the two levels round differently from one long cumsum: a draw on a boundary may move one token
    assert (got == want).float().mean() >= 0.95
    assert ((got - want).abs() <= 1).all()

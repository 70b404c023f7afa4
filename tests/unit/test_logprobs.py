"""models/logprobs.py: packed and padded trainer log-probs equal a naive full-logits computation, one
sequence at a time; gradients flow; micro-batches respect the token budget."""

from __future__ import annotations

import pytest
import torch

from posttrain.models.loading import load_model
from posttrain.models.logprobs import micro_batches, prompt_key, sampled_logprobs, target_positions

# (token ids, mask): single-turn completions, and a multi-turn one with two sampled segments
SEQS = [
    ([5, 17, 33, 40, 41, 42], [0, 0, 0, 1, 1, 1]),
    ([7, 8, 9, 10, 11, 12, 13, 14, 15], [0, 0, 1, 1, 0, 0, 1, 1, 1]),
    ([3, 4, 5, 6], [0, 0, 0, 1]),
]


def naive(model, ids, mask, temperature):
    """Full logits of the sequence alone, log_softmax(logits / T), gathered at the sampled tokens."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return torch.stack([logp[t - 1, ids[t]] for t, m in enumerate(mask) if m])


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-nemotronh"])
def model(request):
    torch.set_num_threads(1)
    return load_model(request.param, device="cpu", dtype=torch.float32).model.eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equal_to_naive_full_logits(model, temperature):
    ids, masks = [s for s, _ in SEQS], [m for _, m in SEQS]
    hybrid = "nemotron_h" in model.config.model_type
    with torch.no_grad():
        want = [naive(model, i, m, temperature) for i, m in SEQS]
        modes = [False] if hybrid else [True, False]  # a Mamba state would leak across a packed row
        for pack in modes:
            got = sampled_logprobs(model, ids, masks, temperature, pack=pack, pad_id=0)
            assert [g.shape[0] for g in got] == [sum(m) for m in masks]
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


def test_gradient_flows_through_packed_logprobs():
    m = load_model("tiny-llama", device="cpu", dtype=torch.float32).model
    got = sampled_logprobs(m, [s for s, _ in SEQS], [k for _, k in SEQS], 1.0, pack=True)
    torch.cat(got).sum().backward()
    assert m.get_input_embeddings().weight.grad.abs().sum() > 0


def test_target_positions_and_bad_inputs():
    assert target_positions([0, 0, 1, 0, 1]) == [2, 4]
    with pytest.raises(ValueError, match="first token"):
        target_positions([1, 0])
    with pytest.raises(ValueError, match="temperature"):
        sampled_logprobs(None, [[1, 2]], [[0, 1]], temperature=0.0)
    with pytest.raises(ValueError, match="mask of"):
        sampled_logprobs(None, [[1, 2]], [[0, 1, 1]])


def test_micro_batches_respect_the_budget():
    lengths = [10, 3, 7, 4, 12]
    packed = micro_batches(lengths, 14, pack=True)
    assert sorted(i for b in packed for i in b) == list(range(5))
    assert all(sum(lengths[i] for i in b) <= 14 or len(b) == 1 for b in packed)
    padded = micro_batches(lengths, 14, pack=False)
    assert all(len(b) * max(lengths[i] for i in b) <= 14 or len(b) == 1 for b in padded)
    assert micro_batches([], 8, pack=True) == []


# two groups sharing prompts (as GRPO's G rollouts of a task do), a multi-turn member with an
# observation (mask 0) between its sampled turns, a lone sequence, and one with nothing sampled
SHARED = [
    ([5, 17, 33, 40, 41, 42], [0, 0, 0, 1, 1, 1]),
    ([3, 4, 5, 6, 2], [0, 0, 0, 1, 1]),
    ([5, 17, 33, 9], [0, 0, 0, 1]),
    ([5, 17, 33, 40, 11, 12, 13, 14], [0, 0, 0, 1, 1, 0, 0, 1]),
    ([3, 4, 5, 8, 8, 8, 8], [0, 0, 0, 1, 1, 1, 1]),
    ([9, 9, 9], [0, 0, 0]),
    ([1, 2, 3, 4], [0, 1, 1, 1]),
]


def test_shared_prompts_give_the_same_logprobs_and_gradients():
    """One copy of each prompt + a 4-D mask = the separate sequences, values and gradients."""
    torch.manual_seed(0)
    m = load_model("tiny-llama", device="cpu", dtype=torch.float32).model
    ids, masks = [s for s, _ in SHARED], [k for _, k in SHARED]
    grads, outs = [], []
    for share in (False, True):
        m.zero_grad()
        got = sampled_logprobs(m, ids, masks, 0.7, pack=True, share_prompts=share)
        (torch.cat(got) * torch.linspace(-1, 1, sum(map(sum, masks)))).sum().backward()
        outs.append([g.detach() for g in got])
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4, msg=n)
    with torch.no_grad():  # and equal to each sequence run alone
        for (s, k), g in zip(SHARED, outs[1]):
            if sum(k):
                torch.testing.assert_close(g, naive(m, s, k, 0.7), atol=2e-5, rtol=1e-5)


def test_micro_batches_keep_prompt_groups_together_and_count_the_prompt_once():
    lengths = [10, 10, 10, 10, 6, 10]
    prompts = [(("a",), 8), (("b",), 4), (("a",), 8), (("b",), 4), (("c",), 2), (("a",), 8)]
    # a: 10 + 2 + 2 = 14 (prompt counted once), b: 10 + 6 = 16, c: 6
    assert micro_batches(lengths, 16, True, prompts) == [[0, 2, 5], [1, 3], [4]]
    assert micro_batches(lengths, 100, True, prompts) == [[0, 2, 5, 1, 3, 4]]
    assert prompt_key([4, 5, 6, 7], [0, 0, 1, 1]) == (4, 5)

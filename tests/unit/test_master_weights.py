"""``train.precision: bf16_master`` (train/master_weights.py): bf16 weights, fp32 masters that the
optimizer steps. Why the masters matter, shown on one weight and on a few tiny-llama steps; what is
cast and what is saved; what is refused, and that the probe alone never picks it."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.train.master_weights import MasterWeights, refusal


def _step(model, opt, x, master=None) -> None:
    opt.zero_grad(set_to_none=True)
    model(x.to(next(model.parameters()).dtype)).sum().backward()
    if master is not None:
        master.grads_to_masters()
    opt.step() if master is None else master.step(opt)


def test_an_update_below_bf16_resolution_is_lost_in_bf16_weights_and_kept_by_the_masters():
    """A weight of 1.0 moves in bf16 steps of 2^-8 below 1; AdamW with a constant gradient moves it by
    ~lr = 1e-4 a step, under half a step, so a bf16 weight rounds every update away, 50 times over,
    while the fp32 master accumulates them (as fp32 weights do) and the bf16 weight follows it."""
    fp32 = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        fp32.weight.fill_(1.0)
    bf16, mastered = copy.deepcopy(fp32).bfloat16(), copy.deepcopy(fp32)
    master = MasterWeights(mastered)
    x = torch.ones(1, 4)
    runs = [(fp32, fp32.parameters(), None), (bf16, bf16.parameters(), None), (mastered, master.masters, master)]
    runs = [(m, torch.optim.AdamW(p, lr=1e-4, weight_decay=0.0), mw) for m, p, mw in runs]
    for _ in range(50):
        for model, opt, mw in runs:
            _step(model, opt, x, mw)
    assert torch.allclose(fp32.weight, torch.full((1, 4), 0.995), atol=1e-5)  # 50 updates of ~1e-4
    assert torch.equal(bf16.weight, torch.ones(1, 4, dtype=torch.bfloat16))  # every update lost
    assert master.masters[0].dtype == torch.float32 and torch.allclose(master.masters[0], fp32.weight, atol=1e-6)
    assert mastered.weight.dtype == torch.bfloat16
    assert torch.equal(mastered.weight, fp32.weight.detach().bfloat16())  # 0.99609375: it moved


def _sft_steps(kind: str, batches, lr: float) -> tuple[dict[str, torch.Tensor], list[float]]:
    """A few of the SFT stage's steps (packed rows, token-mean CE, clip, AdamW) on tiny-llama:
    fp32 weights, bf16_master, or bf16 weights without masters (AdamW straight on them)."""
    from posttrain.data.packing import pack_examples
    from posttrain.models.loading import load_model
    from posttrain.train.supervised import row_logprobs

    model = load_model("tiny-llama").model.train()
    master = MasterWeights(model) if kind == "bf16_master" else None
    if kind == "bf16":
        for p in model.parameters():
            p.data = p.data.bfloat16()
    params = master.masters if master else list(model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    losses = []
    for examples in batches:
        rows = pack_examples(examples, 256, 0)
        n = sum(r.n_target_tokens for r in rows)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for r in rows:
            logprobs, mask = row_logprobs(model, r.to_tensors())
            loss = -logprobs[mask].sum() / n
            loss.backward()
            total += float(loss.detach())
        if master:
            master.grads_to_masters()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step() if master is None else master.step(opt)
        losses.append(total)
    weights = master.state_dict() if master else {k: v.float() for k, v in model.state_dict().items()}
    return weights, losses


def test_sft_steps_with_masters_track_fp32_and_bf16_weights_alone_do_not(one_thread):
    """4 SFT steps at lr 1e-5 on tiny-llama (weights ~0.02, so a bf16 step is ~1e-4): bf16_master's
    update is within 5% of fp32's (relative L2 over every weight matrix; measured 1.7%) and its losses
    within 1e-3 nat; bf16 weights without masters lose most updates (measured: the update is off by
    more than its own size; 85% of weights never moved)."""
    from posttrain.data.examples import tokenize_rows
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.models.loading import load_model, load_tokenizer

    examples, _ = tokenize_rows(load_tokenizer("tiny-llama"), list(arithmetic_rows(32, seed=0, max_digits=2)), 256)
    batches = [examples[i * 8:(i + 1) * 8] for i in range(4)]
    init = load_model("tiny-llama").model.state_dict()
    runs = {k: _sft_steps(k, batches, 1e-5) for k in ("fp32", "bf16_master", "bf16")}
    ref = runs["fp32"][0]
    keys = [k for k in ref if k.endswith("weight")]
    moved = sum(float((ref[k] - init[k]).norm() ** 2) for k in keys) ** 0.5

    def off(kind: str) -> float:  # distance to the fp32 weights, relative to how far fp32 moved
        return sum(float((runs[kind][0][k] - ref[k]).norm() ** 2) for k in keys) ** 0.5 / moved

    assert off("bf16_master") < 0.05
    assert off("bf16") > 0.5 and off("bf16") > 10 * off("bf16_master")
    assert max(abs(a - b) for a, b in zip(runs["bf16_master"][1], runs["fp32"][1])) < 1e-3


def test_only_parameters_turn_bf16_and_what_is_saved_is_the_fp32_masters():
    from posttrain.models.facts import freeze_bottom
    from posttrain.models.loading import load_model

    model = load_model("tiny-llama").model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    freeze_bottom(model, 1)  # embeddings (tied to the head) and block 0: no master in the optimizer
    master = MasterWeights(model)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE frequencies stay unrounded
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(master.masters) == len(trainable) and all(m.dtype == torch.float32 for m in master.masters)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie survives the cast
    saved = master.state_dict()
    assert saved.keys() == before.keys()
    assert all(saved[k].dtype == torch.float32 and torch.equal(saved[k], before[k]) for k in before)
    assert saved["lm_head.weight"] is saved["model.embed_tokens.weight"]


def test_refused_for_hybrid_and_moe_models_from_the_config_alone(tmp_path):
    from transformers import MixtralConfig

    assert refusal("tiny-llama") is None
    assert "hybrid Mamba" in refusal("tiny-nemotronh")
    MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, num_local_experts=4).save_pretrained(tmp_path)  # a config, no weights
    assert "MoE" in refusal(str(tmp_path))


def test_refused_with_lora_and_in_the_rl_and_dpo_stages():
    from posttrain.configs import load_config
    from posttrain.configs.base import ConfigError
    from posttrain.configs.dpo import DPOConfig
    from posttrain.configs.rl import RLConfig
    from posttrain.configs.sft import SFTConfig

    assert load_config(SFTConfig, None, ["train.precision=bf16_master"]).train.precision == "bf16_master"
    with pytest.raises(ConfigError, match="bf16_master does not train LoRA"):
        load_config(SFTConfig, None, ["train.precision=bf16_master", "lora.enabled=true"])
    for cls, stage in ((RLConfig, "rl"), (DPOConfig, "dpo")):
        with pytest.raises(ConfigError, match=f"the {stage} stage needs fp32 weights"):
            load_config(cls, None, ["train.precision=bf16_master"])


def test_the_probe_alone_never_picks_bf16_master(monkeypatch):
    """``resolve`` decides bf16 autocast or fp32; only the SFT stage's own setup takes the masters
    (``train/autocast.py``, tests/unit/test_precision.py), so distill-logits and the rest keep autocast."""
    from posttrain.models.precision import PROBE_ENV, resolve

    monkeypatch.setenv(PROBE_ENV, "fp32=100,bf16=10000")
    assert resolve("auto", "sft").precision == "bf16"
    assert resolve("bf16_master", "sft").precision == "bf16_master"

"""bench/sft_throughput.py's bf16_master trainer (``posttrain auto`` where bf16 is faster), on
tiny-llama (the bench itself runs the embedded model): its step is the loop's (masters stepped, bf16
weights their rounding), and the next trainer starts from the fp32 weights again."""

import torch

from tests.script_module import script_module


def test_the_bf16_master_trainer_steps_the_masters_and_hands_back_fp32_weights(one_thread):
    from posttrain.models.loading import load_model

    with script_module("bench", "sft_throughput") as s:
        loaded = load_model("tiny-llama")
        model, tok = loaded.model.train(), loaded.tokenizer
        init = {k: v.clone() for k, v in model.state_dict().items()}
        opt, master = s.fresh(model, init, "bf16_master")
        assert master is not None and all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert s.posttrain_step(model, opt, s.make_examples(tok, 4, seed=0), 0, 256, "bf16_master", master) > 0
        saved = master.state_dict()
        assert not torch.equal(saved["model.layers.1.mlp.up_proj.weight"], init["model.layers.1.mlp.up_proj.weight"])
        assert all(torch.equal(v, saved[k].bfloat16()) for k, v in model.state_dict().items())
        opt, master = s.fresh(model, init, "fp32")
        assert master is None and all(p.dtype == torch.float32 for p in model.parameters())
        assert all(torch.equal(v, init[k]) for k, v in model.state_dict().items())

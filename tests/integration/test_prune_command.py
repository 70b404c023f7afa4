"""``posttrain prune`` end to end on tiny Llama and tiny NemotronH; the result loads in plain transformers."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from posttrain.cli import main


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    p = tmp_path_factory.mktemp("calib") / "arith.jsonl"
    assert main(["make-data", "arithmetic", "--n", "40", "--out", str(p)]) == 0
    return p


@pytest.mark.parametrize("spec, target", [
    ("tiny-llama", ["target.mlp_hidden=64", "target.heads=2", "target.hidden=48", "target.layers=1"]),
    ("tiny-nemotronh", ["target.mlp_hidden=16", "target.heads=2", "target.hidden=48", "target.layers=3",
                        "target.mamba_heads=4", "target.experts=2"]),
    ("tiny-llama", ["target.params=60000", "target.axes_mix=[mlp_hidden,layers]"]),
])
def test_prune_writes_a_plain_hf_checkpoint(tmp_path, calib, spec, target):
    out = tmp_path / "small"
    rc = main(["prune", f"model={spec}", f"calibration.path={calib}", "calibration.samples=8", f"out={out}", *target])
    assert rc == 0
    info = json.loads((out / "prune.json").read_text())
    assert info["params_after"] < info["params_before"]
    m = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in m.parameters()) == info["params_after"]
    assert (out / "tokenizer_config.json").exists() and "chat_template" in (out / "tokenizer_config.json").read_text() \
        or (out / "chat_template.jinja").exists()
    logits = m(torch.tensor([[1, 5, 9]])).logits
    assert torch.isfinite(logits).all()

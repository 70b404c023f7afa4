"""``posttrain distill-logits`` end to end on tiny Llamas, the Minitron way: SFT a teacher, prune it,
distil the pruned student back toward it; the held-out KL falls and the checkpoint loads in plain
transformers. The cached teacher gives the in-step teacher's figures; a resumed run ends where an
uninterrupted one does."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from posttrain.cli import main

COMMON = ["data.val_frac=0.2", "train.batch_size=8", "optim.lr=3e-3", "optim.warmup_steps=0",
          "train.precision=fp32"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(data, teacher: a tiny Llama after 20 SFT steps, student: the teacher pruned to one block)."""
    root = tmp_path_factory.mktemp("minitron")
    data = root / "arith.jsonl"
    assert main(["make-data", "arithmetic", "--n", "60", "--out", str(data)]) == 0
    assert main(["sft", "model=tiny-llama", f"data.train=[{{path: {data}}}]", "train.steps=20", "optim.lr=3e-3",
                 "optim.warmup_steps=2", "train.batch_size=8", "train.precision=fp32", f"run_dir={root / 'sft'}",
                 "--no-progress"]) == 0
    teacher = root / "sft" / "checkpoints" / "step_000020"
    student = root / "small"
    assert main(["prune", f"model={teacher}", f"calibration.path={data}", "calibration.samples=8", f"out={student}",
                 "target.mlp_hidden=64", "target.layers=1"]) == 0
    return data, teacher, student


def distill(pair, run_dir, *extra):
    data, teacher, student = pair
    return main(["distill-logits", f"model={student}", f"teacher.model={teacher}", f"data.train=[{{path: {data}}}]",
                 f"run_dir={run_dir}", *COMMON, *extra, "--no-progress"])


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_heldout_kl_falls_and_the_student_loads_in_transformers(pair, tmp_path):
    run = tmp_path / "run"
    assert distill(pair, run, "train.steps=8") == 0
    m = metrics(run)
    before, after = m[0]["val_kl"], m[-1]["val_kl"]
    assert after < 0.6 * before, (before, after)
    ckpt = run / "checkpoints" / "step_000008"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    pruned = json.loads((pair[2] / "prune.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == pruned["params_after"]
    assert torch.isfinite(model(torch.tensor([[1, 5, 9]])).logits).all()


def test_bf16_master_distils_as_fp32_does_and_saves_fp32(pair, tmp_path):
    """``train.precision=bf16_master`` (bf16 student weights, fp32 masters: train/master_weights.py):
    the held-out KL falls as in the fp32 test above, and the checkpoint loads as fp32."""
    run = tmp_path / "run"
    assert distill(pair, run, "train.steps=8", "train.precision=bf16_master") == 0
    m = metrics(run)
    assert json.loads((run / "precision.json").read_text())["precision"] == "bf16_master"
    assert m[-1]["val_kl"] < 0.6 * m[0]["val_kl"], (m[0]["val_kl"], m[-1]["val_kl"])
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000008")
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_cached_teacher_gives_the_in_step_figures_and_a_mismatch_is_refused(pair, tmp_path, capsys):
    cache = tmp_path / "teacher.safetensors"
    args = ["train.steps=2", "teacher.topk=8", "loss.temperature=2", "loss.ce_weight=0.1"]
    assert distill(pair, tmp_path / "in_step", *args) == 0
    assert distill(pair, tmp_path / "cached", *args, f"teacher.cache={cache}") == 0
    assert cache.exists()
    for a, b in zip(metrics(tmp_path / "in_step"), metrics(tmp_path / "cached"), strict=True):
        for key in ("val_kl", "kl", "nll", "loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=1e-5), key
    capsys.readouterr()
    assert distill(pair, tmp_path / "other_k", "train.steps=2", "teacher.topk=4", f"teacher.cache={cache}") == 2
    err = capsys.readouterr().err.strip()
    assert "another k" in err and "\n" not in err, err


def test_resumed_run_ends_with_the_uninterrupted_weights(pair, tmp_path):
    from safetensors.torch import load_file

    from posttrain.compress.distill_logits import train_distill_logits
    from posttrain.configs import load_config
    from posttrain.configs.prune import DistillLogitsConfig

    data, teacher, student = pair
    base = [f"model={student}", f"teacher.model={teacher}", f"data.train=[{{path: {data}}}]", *COMMON,
            "train.steps=4", "train.save_every=2", "teacher.topk=16"]
    whole = load_config(DistillLogitsConfig, None, [*base, f"run_dir={tmp_path / 'whole'}"])
    train_distill_logits(whole, progress=False)
    parts = load_config(DistillLogitsConfig, None, [*base, f"run_dir={tmp_path / 'parts'}"])
    train_distill_logits(parts, progress=False, stop_after=2)
    res = train_distill_logits(parts, progress=False)
    assert res.checkpoint.name == "step_000004"
    a = load_file(tmp_path / "whole" / "checkpoints" / "step_000004" / "model.safetensors")
    b = load_file(res.checkpoint / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

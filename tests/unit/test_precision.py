"""``precision: auto``: the decision is a pure function of injected probe figures (no timing here);
the probe is cached per machine key; every run logs what it ran in."""

from __future__ import annotations

import json

import pytest

from posttrain.models import precision as P
from posttrain.models.precision import Probe, decide, resolve

FAST_BF16 = Probe(fp32_gflops=110.0, bf16_gflops=495.0, source="injected")  # AMD EPYC with avx512_bf16
AVX2 = Probe(fp32_gflops=175.0, bf16_gflops=1.0, source="injected")  # bf16 emulated by oneDNN


def test_fast_bf16_machine_uses_bf16_only_where_numerically_safe():
    assert {s: decide(FAST_BF16, s).precision for s in ("sft", "rl", "dpo", "sampling")} == {
        "sft": "bf16", "rl": "fp32", "dpo": "fp32", "sampling": "bf16"}
    assert "not numerically safe" in decide(FAST_BF16, "rl").reason


def test_avx2_machine_uses_fp32_everywhere():
    for s in ("sft", "rl", "dpo", "sampling"):
        d = decide(AVX2, s)
        assert d.precision == "fp32" and "0.0057x" in d.reason


def test_a_small_edge_is_not_enough():
    assert decide(Probe(100.0, 100.0 * P.MIN_SPEEDUP * 0.99), "sft").precision == "fp32"
    assert decide(Probe(100.0, 100.0 * P.MIN_SPEEDUP), "sft").precision == "bf16"
    with pytest.raises(ValueError, match="unknown precision stage"):
        decide(FAST_BF16, "pretrain")  # type: ignore[arg-type]


def test_explicit_precision_wins_and_env_injection_is_parsed(monkeypatch):
    monkeypatch.setenv(P.PROBE_ENV, "fp32=110, bf16=495")
    assert resolve("auto", "sft").precision == "bf16"
    assert resolve("fp32", "sft").precision == "fp32" and resolve("bf16", "rl").precision == "bf16"
    d = resolve("auto", "sft")
    assert d.metrics()["probe_bf16_gflops"] == 495.0 and d.metrics()["probe_source"] == "injected"
    monkeypatch.setenv(P.PROBE_ENV, "fast")
    with pytest.raises(ValueError, match="expected 'fp32=<GFLOP/s>,bf16=<GFLOP/s>'"):
        resolve("auto", "sft")


def test_probe_runs_once_per_machine_and_is_cached(monkeypatch, tmp_path):
    monkeypatch.delenv(P.PROBE_ENV, raising=False)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(P, "measure", lambda: calls.append(1) or (110.0, 495.0))
    monkeypatch.setattr(P, "machine_key", lambda: "cpu A")
    first, again = P.machine_probe(), P.machine_probe()
    assert (first.source, again.source, len(calls)) == ("measured", "cached", 1)
    assert again.bf16_gflops == 495.0
    monkeypatch.setattr(P, "machine_key", lambda: "cpu B")  # another CPU / flags / torch: probe again
    assert P.machine_probe().source == "measured" and len(calls) == 2
    assert set(json.loads((tmp_path / "precision_probe.json").read_text())) == {"cpu A", "cpu B"}
    (tmp_path / "precision_probe.json").write_text("{not json")  # a damaged cache is re-measured
    assert P.machine_probe().source == "measured" and len(calls) == 3


def test_machine_key_names_cpu_flags_and_torch():
    import torch

    key = P.machine_key()
    assert "flags" in key and torch.__version__ in key


def test_every_run_logs_the_decision(monkeypatch, tmp_path):
    """An SFT run on a fast-bf16 machine trains bf16 weights with fp32 masters, an RL run on it in fp32
    and samples from bf16 weights; both say so."""
    from posttrain.configs import load_config
    from posttrain.configs.rl import RLConfig
    from posttrain.configs.sft import SFTConfig
    from posttrain.data.conversations import write_jsonl
    from posttrain.data.synthetic import arithmetic_rows
    from posttrain.train.metrics import read_metrics
    from posttrain.train.rl import train_rl
    from posttrain.train.sft import train_sft

    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=495")
    data = tmp_path / "a.jsonl"
    write_jsonl(arithmetic_rows(16, seed=0, max_digits=1), data)
    sft = load_config(SFTConfig, None, ["model=tiny-llama", f"run_dir={tmp_path / 'sft'}", "train.steps=1",
                                        "train.batch_size=4", "train.threads=1", f"data.train=[{{path: {data}}}]"])
    train_sft(sft, progress=False)
    rl = load_config(RLConfig, None, ["model=tiny-llama", f"run_dir={tmp_path / 'rl'}", "train.steps=1",
                                      "train.eval_every=0", "train.threads=1", "rollout.prompts_per_step=2",
                                      "rollout.max_new_tokens=4", "algo.overlong_filter=false"])
    train_rl(rl, progress=False)
    for run, want in (("sft", "bf16_master"), ("rl", "fp32")):
        first = next(r for r in read_metrics(tmp_path / run) if "precision" in r)
        assert first["step"] == 1 and first["precision"] == want and first["probe_bf16_gflops"] == 495.0, run
        assert json.loads((tmp_path / run / "precision.json").read_text())["precision"] == want
    assert next(r for r in read_metrics(tmp_path / "rl") if "precision_sampling" in r)["precision_sampling"] == "bf16"


def test_auto_takes_fp32_masters_only_where_they_apply(monkeypatch):
    """``auto`` upgrades bf16 autocast to bf16 weights + fp32 masters for the SFT stage on a CPU, on a
    model that allows it; everything else keeps what ``resolve`` decided."""
    from posttrain.train.autocast import decide_precision

    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=495")
    d = decide_precision("auto", "cpu", "sft", masters_ok=True, model_spec="tiny-llama")
    assert d.precision == "bf16_master" and "fp32 masters" in d.reason and d.probe is not None
    hybrid = decide_precision("auto", "cpu", "sft", masters_ok=True, model_spec="tiny-nemotronh")
    assert hybrid.precision == "bf16" and "hybrid Mamba" in hybrid.reason  # says why not
    assert decide_precision("auto", "cpu", "sft", masters_ok=False, model_spec="tiny-llama").precision == "bf16"  # LoRA, distill
    assert decide_precision("bf16", "cpu", "sft", masters_ok=True, model_spec="tiny-llama").precision == "bf16"  # explicit
    assert decide_precision("auto", "cpu", "rl", masters_ok=True, model_spec="tiny-llama").precision == "fp32"
    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=1.1")  # AVX2: bf16 emulated, fp32 stays
    assert decide_precision("auto", "cpu", "sft", masters_ok=True, model_spec="tiny-llama").precision == "fp32"


def test_bf16_training_on_cpu_uses_eager_attention_and_fp32_keeps_sdpa():
    from posttrain.models.loading import load_model
    from posttrain.models.precision import attention_for

    tiny = load_model("tiny-llama", device="cpu").model
    assert tiny.config._attn_implementation == "sdpa"
    assert attention_for(tiny, "fp32", "cpu") is None and tiny.config._attn_implementation == "sdpa"
    assert attention_for(tiny, "bf16", "cuda") is None
    assert attention_for(tiny, "bf16", "cpu", max_len=2048) is None  # long rows: eager's T x T scores lose
    assert tiny.config._attn_implementation == "sdpa"
    assert attention_for(tiny, "bf16", "cpu", max_len=512) == "eager" and tiny.config._attn_implementation == "eager"
    hybrid = load_model("tiny-nemotronh", device="cpu").model
    assert attention_for(hybrid, "bf16", "cpu") is None


def test_pipeline_eval_precision_auto_follows_the_probe_and_fp32_ignores_it(monkeypatch):
    """``pipeline --quick`` measures in bf16 only where the probe says bf16 is faster; the default
    measures in fp32 whatever the machine."""
    from posttrain.configs.pipeline import QUICK, PipelineConfig
    from posttrain.experiments.stages import eval_dtype

    quick = PipelineConfig(**QUICK)
    assert quick.eval_precision == "auto" and PipelineConfig().eval_precision == "fp32"
    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=220")
    assert eval_dtype(quick) == "bf16" and eval_dtype(PipelineConfig()) == "fp32"
    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=1.1")  # an AVX2-only CPU: bf16 emulated
    assert eval_dtype(quick) == "fp32"


def test_the_precision_command_names_the_sft_stages_masters(monkeypatch, capsys):
    import argparse

    from posttrain.commands import precision as command

    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=495")
    assert command.run(argparse.Namespace(refresh=False)) == 0
    out = capsys.readouterr().out
    assert "sft       bf16" in out and "takes bf16_master" in out and "rl        fp32" in out
    monkeypatch.setenv(P.PROBE_ENV, "fp32=110,bf16=1.1")  # AVX2: no bf16, no masters line
    command.run(argparse.Namespace(refresh=False))
    assert "bf16_master" not in capsys.readouterr().out

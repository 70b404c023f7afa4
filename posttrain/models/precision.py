"""Which precision each stage computes in, decided by measuring this machine once.

Why measure: torch's reported CPU capability does not say whether bf16 matmuls are fast. An AMD
EPYC with ``avx512_bf16`` reports plain "AVX512" (oneDNN still uses the bf16 instructions: a bf16
matmul runs ~4.5x a fp32 one there), while on an AVX2-only CPU oneDNN emulates bf16 and it is
~100x *slower* than fp32. So ``precision: auto`` runs a short matmul probe (fp32 and bf16 GFLOP/s
on 512x512 matrices, one thread, alternating, a few hundred ms) the first time it is needed on a
machine and caches the figures in ``<cache dir>/precision_probe.json`` under a key made of the CPU
model, a hash of its flags and the torch version; another machine (or another torch) re-probes.
``posttrain precision [--refresh]`` prints the probe and the decision per stage.

Speed is half of the decision; the other half is whether the stage's numerics tolerate bf16.
Measured on the embedded SmolLM2-135M by bench/precision.py (packed 512-token SFT row, 311 target
tokens, fp32 weights; one loaded run, 2026-11-30: its row in bench/results/precision.jsonl),
per-token log-prob error against fp32:

===================  =============  ======  =====  =====================
compute              mean |dlogp|   p99     max    mean |ratio - 1|
===================  =============  ======  =====  =====================
bf16 autocast        0.031          0.18    0.47   0.031 (max 0.37)
bf16 weights         0.044          0.28    0.59   0.044 (max 0.52)
===================  =============  ======  =====  =====================

* ``sft`` (and the other cross-entropy stages that read no stored log-probs): bf16 autocast where it
  is faster. A 0.03-nat error per token is noise next to a ~2-nat loss and averages out in the mean;
  weights, gradients' accumulation and AdamW states stay fp32 (autocast casts per op).
* ``rl`` (GRPO, RLHF, GenRM, MOPD): fp32. The PG ratio ``exp(logp_train - logp_sampler)`` is exactly
  1 on-policy; bf16 moves it by 3% on average and 18% at the 99th percentile, the size of the clip
  range (0.2/0.28), so clipping would fire on tokens that are on-policy.
* ``dpo``: fp32. Its margin is a difference of sequence log-prob sums (policy minus reference), in
  which per-token bf16 errors add up rather than average out.
* ``sampling`` (the HF engine's sampling weights, ``rollout.engine.dtype: auto``): bf16 where it is
  faster. The rollouts' log-probs enter the loss only through the masked importance weight
  ``ρ = exp(logp_trainer − logp_sampler)`` (algos/losses.py), which exists to absorb exactly this
  mismatch (a bf16 vLLM sampler against an fp32 trainer in the recipe): in 24 steps of the
  pipeline's RLVR stage the gap was 0.011 nat/token and the mask (0.5–2) dropped 0.08% of trained
  tokens (1.2% in the worst step; docs/benchmarks.md), while the clipped PPO ratio is the trainer's own
  (exactly 1 on-policy) and does not see it. Greedy decoding (validation, evals) always runs on
  the fp32 module, so a measurement never depends on the machine's sampling precision.

``decide`` is a pure function of the probe figures, so tests inject them (``POSTTRAIN_PRECISION_PROBE
="fp32=100,bf16=450"``, or a ``Probe``) and nothing in a test depends on timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from posttrain.configs.base import cache_dir
from posttrain.models.cpuinfo import cpu_info

Stage = Literal["sft", "rl", "dpo", "sampling"]
PROBE_ENV = "POSTTRAIN_PRECISION_PROBE"
MIN_SPEEDUP = 1.3
"""bf16 must beat fp32 by this factor in the probe: autocast's casts and fp32 islands (norms,
softmax, loss) eat part of a small edge."""
BF16_SAFE: dict[str, bool] = {"sft": True, "rl": False, "dpo": False, "sampling": True}
"""Whether ``auto`` may use bf16 for the stage when it is faster (the reasons: module docstring)."""


@dataclass(frozen=True)
class Probe:
    fp32_gflops: float
    bf16_gflops: float
    machine: str = ""
    source: str = "measured"  # measured | cached | injected

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_gflops / max(self.fp32_gflops, 1e-9)


@dataclass(frozen=True)
class Decision:
    precision: str  # "bf16" (autocast) | "bf16_master" (bf16 weights, fp32 masters) | "fp32"
    stage: str
    reason: str
    probe: Probe | None = None

    def metrics(self) -> dict[str, object]:
        """What every run logs (metrics.jsonl's first line, precision.json)."""
        m: dict[str, object] = {"precision": self.precision, "precision_stage": self.stage,
                                "precision_reason": self.reason}
        if self.probe is not None:
            m.update(probe_fp32_gflops=round(self.probe.fp32_gflops, 1), probe_bf16_gflops=round(self.probe.bf16_gflops, 1),
                     probe_source=self.probe.source, probe_machine=self.probe.machine)
        return m

    def line(self) -> str:
        p = self.probe
        figures = f" (probe, {p.source}: bf16 {p.bf16_gflops:.0f} vs fp32 {p.fp32_gflops:.0f} GFLOP/s)" if p else ""
        return f"precision {self.precision} for {self.stage}: {self.reason}{figures}"


def decide(probe: Probe, stage: Stage) -> Decision:
    """bf16 when the probe says it is >= MIN_SPEEDUP faster *and* the stage's numerics allow it."""
    if stage not in BF16_SAFE:
        raise ValueError(f"unknown precision stage {stage!r} (one of {', '.join(BF16_SAFE)})")
    fast = probe.bf16_speedup >= MIN_SPEEDUP
    if fast and BF16_SAFE[stage]:
        return Decision("bf16", stage, f"bf16 {probe.bf16_speedup:.1f}x faster than fp32", probe)
    if not fast:
        return Decision("fp32", stage, f"bf16 only {probe.bf16_speedup:.2g}x fp32 on this CPU", probe)
    return Decision("fp32", stage, f"bf16 {probe.bf16_speedup:.1f}x faster but not numerically safe here "
                    "(models/precision.py)", probe)


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The CPU flags that decide a run's speed here: the same ``pipeline --quick`` takes 4 min on an
AVX-512 CPU with bf16 and 15 min on an AVX2-only one (docs/results/pipeline.md)."""


def machine_key() -> str:
    """CPU model + a hash of its flags + torch version (+ MKL's AMD shim when on, models/blas.py: it
    changes the fp32 figure): what makes probe figures transferable."""
    import torch

    from posttrain.models import blas

    model, flags = cpu_info()
    digest = hashlib.sha1(" ".join(sorted(flags)).encode()).hexdigest()[:10]
    return f"{model} | flags {digest} | torch {torch.__version__}" + (" | mkl-amd shim" if blas.STATE == "on" else "")


def measure(n: int = 512, budget_s: float = 0.3, min_reps: int = 3, threads: int = 1,
            sizes: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(fp32, bf16) best-of square-matmul GFLOP/s, on one thread by default.

    The two dtypes alternate rep by rep, so load from other processes hits both alike, and the best
    rep is kept (one undisturbed rep is enough); one thread for the probe, because the ratio is what
    is decided on and a second thread on a busy machine waits for the slower core. At least
    ``min_reps`` each, then until ``budget_s`` has passed per size (a few hundred ms; ~1 s on an AVX2
    CPU, where each bf16 rep is slow). The benches ask for the peak at their own thread count and over
    several ``sizes`` (the fastest size differs by dtype and threads: measured here, 2 threads, bf16
    974-980 GFLOP/s at 512-1024 but 537 at 2048).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    best = {torch.float32: 0.0, torch.bfloat16: 0.0}
    try:
        for size in sizes or (n,):
            mats = {dt: (torch.randn(size, size, dtype=dt), torch.randn(size, size, dtype=dt)) for dt in best}
            for a, b in mats.values():
                a @ b  # warm-up (oneDNN primitive creation)
            start, reps = time.perf_counter(), 0
            while reps < min_reps or time.perf_counter() - start < budget_s:
                for dt, (a, b) in mats.items():
                    t = time.perf_counter()
                    a @ b
                    best[dt] = max(best[dt], 2 * size**3 / (time.perf_counter() - t))
                reps += 1
    finally:
        torch.set_num_threads(before)
    return best[torch.float32] / 1e9, best[torch.bfloat16] / 1e9


def _injected(text: str) -> Probe:
    try:
        parts = dict(p.split("=", 1) for p in text.replace(" ", "").split(","))
        return Probe(float(parts["fp32"]), float(parts["bf16"]), "injected", "injected")
    except (KeyError, ValueError):
        raise ValueError(f"{PROBE_ENV}={text!r}: expected 'fp32=<GFLOP/s>,bf16=<GFLOP/s>'") from None


def machine_probe(refresh: bool = False) -> Probe:
    """This machine's probe: injected (``$POSTTRAIN_PRECISION_PROBE``), cached, or measured now and
    cached. A cache that cannot be read or written is re-measured, never an error."""
    text = os.environ.get(PROBE_ENV)
    if text:
        return _injected(text)
    key = machine_key()
    path = cache_dir() / "precision_probe.json"
    try:
        cached = json.loads(path.read_text())
        if not isinstance(cached, dict):
            cached = {}
    except (OSError, ValueError):
        cached = {}
    row = cached.get(key)
    if not refresh and isinstance(row, dict) and {"fp32_gflops", "bf16_gflops"} <= row.keys():
        return Probe(float(row["fp32_gflops"]), float(row["bf16_gflops"]), key, "cached")
    fp32, bf16 = measure()
    cached[key] = {"fp32_gflops": fp32, "bf16_gflops": bf16, "time": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        tmp.replace(path)
    except OSError:
        pass
    return Probe(fp32, bf16, key, "measured")


def resolve(precision: str, stage: Stage, device: str = "cpu") -> Decision:
    """The precision a stage runs in: an explicit ``bf16``/``bf16_master``/``fp32`` wins; ``auto``
    decides between ``bf16`` and ``fp32``; the SFT stage then takes ``bf16_master`` where it allows
    (``train/autocast.py: decide_precision``)."""
    if precision in ("bf16", "bf16_master", "fp32"):
        return Decision(precision, stage, "set in the config")
    if precision != "auto":
        raise ValueError(f"precision must be auto, bf16, bf16_master or fp32, got {precision!r}")
    if device.startswith("cuda"):
        import torch

        ok = torch.cuda.is_bf16_supported() and BF16_SAFE[stage]
        return Decision("bf16" if ok else "fp32", stage, "CUDA" + ("" if ok else ": fp32 for this stage"))
    return decide(machine_probe(), stage)


EAGER_MAX_LEN = 512
"""Longest training row for which bf16 CPU training switches to eager attention (see ``attention_for``)."""


def attention_for(model: object, precision: str, device: str, max_len: int | None = None) -> str | None:
    """Switch a CPU model that trains in bf16 from sdpa to eager attention; returns the new setting.

    Measured (docs/benchmarks.md, "SFT attention"): over a packed 512-token row, torch's CPU
    flash-attention kernel under the block-diagonal mask is slower in bf16 than eager attention's
    bf16 matmuls (fwd+bwd of one row 4.5 s vs 5.9 s on one loaded core; in fp32 they tie, so fp32
    keeps sdpa). Eager attention materialises the T×T scores of every head and layer, so it loses
    on long rows: the embedded model, one packed bf16 row, fwd+bwd, one loaded core: 2048 tokens
    eager 40–42 s vs sdpa 22–23 s; 1024 tokens (unpacked) 10.2–10.7 s vs 7.6–8.6 s; 512 tokens
    2.7–3.0 s vs 3.2–3.8 s. So rows longer than ``EAGER_MAX_LEN`` (``max_len``, the stage's
    longest row; None: short rows) keep sdpa. Hybrid (Mamba) models are left alone. The setting is
    not saved in checkpoints. ``bf16_master`` (bf16 weights) follows ``bf16``: its matmuls are the
    same bf16 ones (not measured separately).
    """
    from posttrain.models.facts import is_hybrid

    config = getattr(model, "config", None)
    if (precision not in ("bf16", "bf16_master") or device != "cpu" or is_hybrid(model) or (max_len or 0) > EAGER_MAX_LEN
            or getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation")):
        return None
    model.set_attn_implementation("eager")  # type: ignore[attr-defined]
    return "eager"

"""``posttrain precision``: this machine's matmul probe and what ``precision: auto`` picks per stage."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--refresh", action="store_true", help="re-measure instead of reading the cached probe")


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import cache_dir
    from posttrain.models import blas
    from posttrain.models.precision import BF16_SAFE, decide, machine_probe

    probe = machine_probe(refresh=args.refresh)
    print(f"machine: {probe.machine}")
    print(f"fp32 BLAS: MKL vendor shim {blas.STATE} (models/blas.py)")
    print(f"probe ({probe.source}; cache {cache_dir() / 'precision_probe.json'}): fp32 {probe.fp32_gflops:.1f} "
          f"GFLOP/s, bf16 {probe.bf16_gflops:.1f} GFLOP/s (bf16/fp32 {probe.bf16_speedup:.2f}x)")
    for stage in BF16_SAFE:
        d = decide(probe, stage)  # type: ignore[arg-type]
        print(f"  {stage:9s} {d.precision}: {d.reason}")
        if stage == "sft" and d.precision == "bf16":  # train/autocast.py: masters_where_they_apply
            print(f"  {'':9s} the SFT stage itself takes bf16_master (bf16 weights, fp32 masters) on a CPU, "
                  "for a model without LoRA that is neither hybrid nor MoE")
    return 0

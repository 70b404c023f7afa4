"""torch's fp32 matmuls on AMD CPUs: Intel MKL's vendor check, and the one-line shim that lifts it.

torch's x86 wheels do their fp32 GEMMs in Intel MKL (``torch.__config__.show()``: "BLAS_INFO=mkl").
MKL picks its tuned kernels only when its internal ``mkl_serv_intel_cpu_true()`` says the CPU is
an Intel one; on an AMD CPU it runs a slower generic path, whatever vector units the CPU has (the
``MKL_DEBUG_CPU_TYPE`` switch that once chose the path is ignored since MKL 2020). A shared object
defining that one function to return 1, loaded into the global symbol scope *before* torch, wins
the dynamic linker's lookup; MKL then dispatches on the CPU's feature flags like on an Intel CPU
(AVX2 kernels on an AVX2 CPU: MKL still checks the instructions exist).

Measured (``python bench/gemm_shapes.py --mkl-amd-compare``: each setting in its own process,
alternating; docs/benchmarks.md, rows in bench/results/gemm_shapes.jsonl), fp32 ``linear`` on the
embedded model's shapes, 2 threads, torch 2.13.0 / MKL 2024.2: the 49k-word output layer at 32 rows
(one decode step of a 32-row batch) 38.0 -> 97.0 GFLOP/s on an AVX2 EPYC (Zen 2), 49.9 -> 67.8 on an
AVX-512 EPYC (Zen 4); at 512 rows (training) 1.30x and 1.47x.

Why a compiled shim and not a pure-Python switch: MKL reads the vendor through that symbol only,
and only the dynamic linker can replace it. It is built once per machine with the system C
compiler into the cache directory (``<cache>/blas/``); no compiler, no shim (a slower, correct run).
``POSTTRAIN_MKL_AMD=0`` turns it off. It must be loaded before ``import torch``: ``posttrain``'s
``__init__`` calls :func:`enable`, so any program that imports posttrain first gets it; one that
imported torch earlier keeps MKL's default and ``STATE`` says so.

The results differ from MKL's generic path by fp32 rounding only (another kernel, another summation
order), as any change of BLAS or thread count does.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV = "POSTTRAIN_MKL_AMD"
SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
LIB_NAME = "libposttrain_mkl_intel_cpu_true.so"

STATE = "not tried"
"""What :func:`enable` did: ``on``, or ``off: <why>``. Bench rows and ``posttrain precision`` print it."""


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``vendor_id`` of the first processor (``AuthenticAMD``, ``GenuineIntel``), "" if unreadable."""
    from posttrain.models.cpuinfo import cpu_fields

    return cpu_fields(cpuinfo).get("vendor_id", "")


def build_shim(directory: Path) -> Path | None:
    """The shim's shared object in ``directory``, compiled now if absent; None without a C compiler
    or a writable directory. Built under a per-process name and renamed, so two processes starting at
    once never load a half-written file."""
    lib = directory / LIB_NAME
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        src, tmp = directory / f"shim.{os.getpid()}.c", directory / f"{LIB_NAME}.{os.getpid()}.tmp"
        src.write_text(SOURCE)
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src)], capture_output=True)
        src.unlink(missing_ok=True)
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            return None
        tmp.replace(lib)
        return lib
    except OSError:
        return None


def enable(cpuinfo: str = "/proc/cpuinfo", directory: Path | None = None) -> str:
    """Load the shim into the global symbol scope where it helps (AMD CPU, torch not yet imported,
    not turned off); sets and returns ``STATE``. Never raises: without the shim MKL is slower, not
    wrong."""
    global STATE
    if os.environ.get(ENV, "1") == "0":
        STATE = f"off: {ENV}=0"
    elif cpu_vendor(cpuinfo) != "AuthenticAMD":
        STATE = "off: not an AMD CPU (MKL's default path is its fast one)"
    elif "torch" in sys.modules:
        STATE = "off: torch was imported before posttrain (the shim must load first)"
    else:
        if directory is None:
            from posttrain.configs.base import cache_dir

            directory = cache_dir() / "blas"
        lib = build_shim(directory)
        if lib is None:
            STATE = "off: no C compiler (cc) or unwritable cache to build the shim"
        else:
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                STATE = "on"
            except OSError as e:
                STATE = f"off: {e}"
    return STATE

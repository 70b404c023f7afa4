"""models/blas.py: MKL's AMD vendor check lifted by a shim loaded before torch."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

from posttrain.models import blas

AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n"
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2\n"


def cpuinfo(tmp_path: Path, text: str) -> str:
    p = tmp_path / "cpuinfo"
    p.write_text(text)
    return str(p)


def test_vendor_is_read_from_cpuinfo(tmp_path):
    assert blas.cpu_vendor(cpuinfo(tmp_path, AMD)) == "AuthenticAMD"
    assert blas.cpu_vendor(cpuinfo(tmp_path, INTEL)) == "GenuineIntel"
    assert blas.cpu_vendor(str(tmp_path / "missing")) == ""


def test_shim_is_built_once_and_says_intel(tmp_path):
    lib = blas.build_shim(tmp_path)
    assert lib is not None and lib.exists(), "no C compiler: the shim cannot be built (CI has gcc)"
    mtime = lib.stat().st_mtime_ns
    assert blas.build_shim(tmp_path) == lib and lib.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert ctypes.CDLL(str(lib)).mkl_serv_intel_cpu_true() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [blas.LIB_NAME]  # no source or temp file left


def test_no_compiler_means_no_shim(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert blas.build_shim(tmp_path / "d") is None


def test_enable_says_why_it_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv(blas.ENV, "0")
    assert blas.enable(cpuinfo(tmp_path, AMD), tmp_path) == "off: POSTTRAIN_MKL_AMD=0"
    monkeypatch.delenv(blas.ENV)
    assert blas.enable(cpuinfo(tmp_path, INTEL), tmp_path).startswith("off: not an AMD CPU")
    # torch is loaded in this process: too late to interpose MKL's symbol
    assert blas.enable(cpuinfo(tmp_path, AMD), tmp_path).startswith("off: torch was imported before posttrain")
    assert not (tmp_path / blas.LIB_NAME).exists()


def test_import_posttrain_puts_the_shim_first_in_the_global_scope(tmp_path):
    """A fresh process: ``import posttrain`` on an AMD CPU loads the shim, and after ``import torch``
    the process-wide lookup of MKL's vendor check finds the shim's definition."""
    code = f"""
import ctypes, json, posttrain, torch
from posttrain.models import blas
out = {{"state": blas.STATE, "vendor": blas.cpu_vendor()}}
if blas.STATE == "on":
    shim = ctypes.CDLL({str(tmp_path / 'cache' / 'blas' / blas.LIB_NAME)!r})
    glob = ctypes.CDLL(None)
    out["same"] = (ctypes.cast(glob.mkl_serv_intel_cpu_true, ctypes.c_void_p).value
                   == ctypes.cast(shim.mkl_serv_intel_cpu_true, ctypes.c_void_p).value)
print(json.dumps(out))
"""
    env = {**os.environ, "POSTTRAIN_CACHE": str(tmp_path / "cache")}
    env.pop(blas.ENV, None)
    res = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout.strip().splitlines()[-1])
    if res["vendor"] == "AuthenticAMD":
        assert res["state"] == "on" and res["same"]
    else:
        assert res["state"].startswith("off: not an AMD CPU")

"""bench/gpu_check.sh, the GPU check: the script parses, --help answers, and on a machine without CUDA
it refuses with one line unless --cpu-smoke (the check itself runs only on a GPU; docs/scale.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.script_module import ROOT, script_module

SCRIPT = ROOT / "bench" / "gpu_check.sh"


@pytest.fixture(scope="module")
def gpu_check():
    with script_module("bench", "gpu_check") as m:
        yield m


@pytest.mark.parametrize("name", ["gpu_check.sh", "gpu_check_pack.sh"])
def test_scripts_parse(name):
    subprocess.run(["bash", "-n", str(ROOT / "bench" / name)], check=True)


def test_help_answers_without_running_anything():
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.startswith("usage: bash bench/gpu_check.sh")
    assert "--cpu-smoke" in out.stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--frobnicate"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown argument --frobnicate" in bad.stderr


def test_the_guard_refuses_a_machine_without_cuda_in_one_line(gpu_check):
    why = gpu_check.cuda_guard(cpu_smoke=False, cuda_available=False)
    assert why is not None and "\n" not in why and "--cpu-smoke" in why
    assert gpu_check.cuda_guard(cpu_smoke=True, cuda_available=False) is None
    assert gpu_check.cuda_guard(cpu_smoke=False, cuda_available=True) is None


def test_the_script_stops_at_the_guard_on_this_cpu(tmp_path, gpu_check):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the guard lets the check run")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(OMP_NUM_THREADS="1", PYTHON=sys.executable)
    args = ["--work", str(tmp_path / "work"), "--results", str(tmp_path / "rows.jsonl")]
    out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "gpu_check: " + gpu_check.cuda_guard(False, False) in out.stdout.splitlines()  # the one line
    assert "== sft" not in out.stdout and "== fsdp2" not in out.stdout  # nothing else ran
    assert "RESULT gpu_check: env FAILED" in out.stdout


def test_the_result_line_names_each_part(gpu_check):
    line = gpu_check.summary_line({
        "env": {"status": "ok", "gpu": "NVIDIA H200"},
        "sft": {"status": "ok", "tokens_per_s": [12345.0, 10.0], "step_s": [0.5, 0.01]},
        "grpo_vllm": {"status": "skipped", "why": "vllm does not import"},
        "fsdp2": {"status": "failed", "why": "x"}})
    assert line == ("RESULT gpu_check: env NVIDIA H200; sft 12345 tok/s 0.500 s/step; grpo_vllm SKIPPED; "
                    "fsdp2 FAILED")

"""bench/distill_logits_defaults.py --smoke --mopd end to end (tiny Llama, about 15 s on one core): every
setting is trained and scored on the same dev conversations, MOPD runs in two calls (a resume), and the
row is recorded with its provenance. Opt-in: ``pytest -m slow``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = str(ROOT / "bench" / "distill_logits_defaults.py")


@pytest.mark.slow
def test_smoke_run_records_every_setting_and_the_mopd_arm(tmp_path):
    results = tmp_path / "row.jsonl"
    out = subprocess.run([sys.executable, BENCH, "--smoke", "--mopd", "--work", str(tmp_path / "w"),
                          "--results", str(results)], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1].startswith("RESULT distill_logits_defaults: ")
    row = json.loads(results.read_text())
    assert row["split"] == "dev" and row["args"]["smoke"]
    assert set(row["runs"]) == {"default", "topk64", "T2", "ce0.5", "lr3e-4", "lr3e-5"}
    n = len(row["tokens"])
    assert n == 16 and all(len(r[0]["nll"]) == n for r in row["runs"].values())
    assert set(row["picks"]) == {"teacher.topk", "loss.temperature", "loss.ce_weight", "optim.lr"}
    mopd = row["mopd"]["arms"]["mopd"][0]
    assert mopd["steps"] == 2 and len(mopd["calls"]) == 2  # one step, then a resume
    assert (tmp_path / "w" / "seed0" / "topk64" / "teacher_top64.safetensors").exists()


def test_smoke_refuses_the_real_results_file():
    out = subprocess.run([sys.executable, BENCH, "--smoke"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "not evidence" in out.stderr

"""bench/prune.py --smoke end to end (tiny Llama, about 20 s on one core): every variant is trained,
scored on the same test tasks and recorded with its provenance. Opt-in: ``pytest -m slow``."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_smoke_run_records_every_variant(tmp_path):
    results = tmp_path / "prune.jsonl"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "prune.py"), "--smoke", "--work", str(tmp_path / "w"),
                          "--results", str(results)], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1].startswith("RESULT prune_recovery: ")
    row = json.loads(results.read_text())
    assert row["split"] == "test" and row["args"]["smoke"]
    scores = row["targets"][0]["scores"]
    assert set(scores) == {"width", "depth", "searched", "sft_control"}
    tasks = set(row["teacher"]["tasks"])
    assert len(tasks) == 12 and all(set(s["tasks"]) == tasks for s in scores.values())


def test_smoke_refuses_the_real_results_file():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "prune.py"), "--smoke"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 2 and "not evidence" in out.stderr


@pytest.mark.slow
def test_smoke_run_of_one_variant_trains_and_scores_only_it(tmp_path):
    """``--variants width`` (a budget study): only the width run is distilled and scored, the RESULT
    line heads with it, and no paired gap to an SFT control that was not trained is printed."""
    results = tmp_path / "prune.jsonl"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "prune.py"), "--smoke", "--work", str(tmp_path / "w"),
                          "--results", str(results), "--variants", "width"], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT prune_recovery: ") and "; width at ≤" in last and "SFT control" not in last
    row = json.loads(results.read_text())
    assert set(row["targets"][0]["scores"]) == {"width"}
    work = next((tmp_path / "w").glob("params_*"))
    assert (work / "width").is_dir() and not (work / "depth").exists() and not (work / "sft_control").exists()
    # a second run reads the finished search back, even with the candidates' distillation runs deleted
    for ckpts in (work / "search" / "candidates").glob("*/distill/checkpoints"):
        shutil.rmtree(ckpts)
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "prune.py"), "--smoke", "--work", str(tmp_path / "w"),
                            "--no-record", "--variants", "width"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "this search is finished, its pick" in again.stdout and "[prune-search]" not in again.stdout
    assert again.stdout.strip().splitlines()[-1] == last


@pytest.mark.slow
def test_a_second_seed_reuses_the_search_and_prune_seeds_reads_both_rows(tmp_path):
    """``--seed 1`` in the seed-0 run's folder: the search is read back, seed 1 trains under seed_1/
    with its own teacher cache (its transformed rows differ), on the same held-out rows and test
    tasks; bench/prune_seeds.py then averages the two rows."""
    results = tmp_path / "prune.jsonl"
    base = [sys.executable, str(ROOT / "bench" / "prune.py"), "--smoke", "--work", str(tmp_path / "w"),
            "--results", str(results), "--variants", "width", "sft_control"]
    subprocess.run(base, capture_output=True, text=True, check=True, cwd=ROOT)
    out = subprocess.run(base + ["--seed", "1"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "this search is finished, its pick" in out.stdout
    work = next((tmp_path / "w").glob("params_*"))
    assert (work / "seed_1" / "width").is_dir() and (work / "seed_1" / "sft_control").is_dir()
    assert list((work / "seed_1").glob("teacher_top*.safetensors"))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["targets"][0]["seed"] for r in rows] == [0, 1]
    assert rows[0]["teacher"]["tasks"] == rows[1]["teacher"]["tasks"]
    both = subprocess.run([sys.executable, str(ROOT / "bench" / "prune_seeds.py"), "--rows", "1", "2", "--source",
                           str(results), "--params", "8.0e4", "--no-record"], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert both.stdout.strip().splitlines()[-1].startswith("RESULT prune_seeds: ") and "2 seeds 0, 1" in both.stdout

"""The curated-vs-unfiltered experiment on the tiny random model: the orchestration, not the result.

A random model almost never answers arithmetic right, so the verifier threshold is set to 0 here
(``min_reward=0``): the filters still run, so curated rows are the candidates that pass the filters
and unfiltered rows are drawn from all candidates. What is checked: every candidate is accounted
for, both files hold the same number of rows, rows carry provenance, a rerun skips done prompts and
samples nothing again, and the comparison trains and measures three models.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.data.conversations import read_conversations
from posttrain.configs.curate import DEFAULT_ORDER, FiltersConfig
from posttrain.experiments.curation import compare, curation_stage, draw_unfiltered, read_candidates, recount

# a random model seldom stops within a few tokens: without the truncation filter, rows get through
# (the other filters, dedup and k still apply), so the equal-size draw has something to match
FILTERS = FiltersConfig(order=[f for f in DEFAULT_ORDER if f != "truncated"])
SIZES = dict(n_candidates=4, k=2, temperature=1.0, max_new_tokens=10, seed=0, max_digits=1, min_reward=0.0,
             num_threads=1, filters=FILTERS)


def lines(path: str | Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> tuple[Path, dict, dict]:
    run_dir = tmp_path_factory.mktemp("curation")
    first = curation_stage("tiny-llama", run_dir, n_prompts=6, **SIZES)
    # more prompts with the same seed: the first six are the same problems, already done
    second = curation_stage("tiny-llama", run_dir, n_prompts=10, **SIZES)
    return run_dir, first, second


def test_counts_add_up_and_files_match(stages):
    run_dir, first, second = stages
    for s in (first, second):
        assert s["candidates"] == s["accepted"] + sum(s["dropped"].values())
        assert s["candidates"] == s["candidates_logged"] == 4 * s["prompts_logged"]
        assert s["rows_curated"] == s["rows_unfiltered"] <= s["accepted"]
    # the files are the second run's (the first run's prompts plus four more)
    assert len(lines(second["paths"]["curated"])) == len(lines(second["paths"]["unfiltered"])) == second["rows_curated"]
    assert first["rows_curated"] < second["rows_curated"]
    assert second["rows_curated"] > 0, "the filters should let some tiny-model samples through"
    assert (first["prompts_logged"], second["prompts_logged"]) == (6, 10)


def test_rerun_skips_done_prompts(stages):
    run_dir, first, second = stages
    assert second["prompts_skipped_done"] == 6
    assert second["candidates"] == 40  # 24 from the first run + 16 new, none sampled twice
    prompt_ids = [r["prompt_id"] for r in read_candidates(run_dir / "candidates.jsonl")]
    assert len(prompt_ids) == 40 and len(set(prompt_ids)) == 10


def test_rows_are_valid_sft_rows_with_provenance(stages):
    run_dir, _, second = stages
    for name in ("curated", "unfiltered"):
        rows, report = read_conversations(second["paths"][name])
        assert not report.bad
        for r in rows:
            prov = r["provenance"]
            assert prov["teacher"] == "tiny-llama" and prov["sampling"]["temperature"] == 1.0
            assert r["messages"][0]["role"] == "user" and r["messages"][-1]["role"] == "assistant"
            assert r["prompt_id"].startswith("arith-")
    # only curated rows went through the verifier
    assert all("reward" in r["provenance"] for r in lines(second["paths"]["curated"]))
    assert not any("reward" in r["provenance"] for r in lines(second["paths"]["unfiltered"]))


def test_unfiltered_draw_is_seeded_and_refuses_too_many():
    cands = [{"id": f"p{i}#cand.0", "prompt_id": f"p{i}", "provenance": {"prompt_messages": 1},
              "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{i}" if i else " "}]}
             for i in range(6)]
    a, b = draw_unfiltered(cands, 3, seed=1), draw_unfiltered(cands, 3, seed=1)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert "p0#cand.0" not in {r["id"] for r in draw_unfiltered(cands, 5, seed=2)}  # the empty reply
    with pytest.raises(ValueError, match="only 5 non-empty"):
        draw_unfiltered(cands, 6, seed=0)


def test_compare_trains_both_and_measures_three(stages):
    run_dir, _, second = stages
    out = compare("tiny-llama", run_dir, second, steps=2, batch_size=2, lr=1e-3, n_eval=4, seed=0,
                  max_digits=1, max_new_tokens=8, n_val_rows=4)
    for name in ("base", "unfiltered", "curated"):
        assert out[name]["n_eval"] == 4 and 0.0 <= out[name]["accuracy"] <= 1.0
    assert out["unfiltered"]["sft"]["steps"] == out["curated"]["sft"]["steps"] == 2
    assert out["unfiltered"]["sft"]["checkpoint"] != out["curated"]["sft"]["checkpoint"]
    assert out["examples_seen_per_run"] == 4
    assert (run_dir / "stages" / "curated.json").exists()


def test_recount_replays_the_log_to_the_same_counts(stages, tmp_path):
    # what curation_stage falls back to when a killed run left no summary for its prompts
    from posttrain.configs.curate import CurateConfig
    from posttrain.data.synthetic import arithmetic_tasks
    from posttrain.envs.base import make_env

    run_dir, _, second = stages
    cfg = CurateConfig(out=run_dir / "curated.jsonl", k=2, min_reward=0.0, seed=0, resume=True, filters=FILTERS)
    tasks = arithmetic_tasks(10, 0, "train", max_digits=1)
    counts = recount(read_candidates(run_dir / "candidates.jsonl"), tasks, make_env("math").verify, cfg,
                     tmp_path / "curated.jsonl")
    assert (counts["candidates"], counts["accepted"], counts["dropped"]) == (
        second["candidates"], second["accepted"], second["dropped"])

"""Train, dev and test (envs/splits.py): one hash rule, disjoint splits in every environment, and no
recipe, bench or stage that chooses anything on ``test``."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from posttrain.envs.base import make_env
from posttrain.envs.splits import SPLITS, check_split, held_out_split, split_of

ROOT = Path(__file__).resolve().parents[2]


def test_split_of_is_a_stable_hash_with_a_tenth_dev_and_a_tenth_test():
    keys = [f"task-{i}" for i in range(20000)]
    first = [split_of(k) for k in keys]
    assert first == [split_of(k) for k in keys]
    share = Counter(first)
    assert set(share) == set(SPLITS)
    assert 0.09 < share["dev"] / len(keys) < 0.11 and 0.09 < share["test"] / len(keys) < 0.11


def test_dev_is_the_old_validation_bucket_of_the_content_hashed_environments():
    """math, mcq and structured hashed ids this way before (one validation bucket of 10%): their
    history of what was tried stays on dev, and test is new."""
    import hashlib

    def old(key: str) -> str:
        bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
        return "validation" if bucket < 0.1 else "train"

    keys = [f"math-{i:05d}" for i in range(5000)]
    assert all((old(k) == "validation") == (split_of(k) == "dev") for k in keys)


def test_held_out_split_halves_a_held_out_set():
    share = Counter(held_out_split(f"row-{i}") for i in range(4000))
    assert set(share) == {"dev", "test"} and 0.45 < share["dev"] / 4000 < 0.55
    # independent of split_of's bucket: the members of one bucket are halved too (GenRM's val_frac)
    dev_bucket = [f"row-{i}" for i in range(4000) if split_of(f"row-{i}") == "dev"]
    halves = Counter(held_out_split(k) for k in dev_bucket)
    assert 0.35 < halves["dev"] / len(dev_bucket) < 0.65


def test_check_split_says_what_validation_became():
    assert [check_split(s) for s in SPLITS] == list(SPLITS)
    with pytest.raises(ValueError, match="'dev' .* or 'test'"):
        check_split("validation")
    with pytest.raises(ValueError, match="unknown split 'holdout'"):
        check_split("holdout")


LOCAL_ENVS = ["arithmetic", "math", "mcq", "structured", "instruction", "code", "workplace", "banking", "longctx"]


@pytest.mark.parametrize("name", LOCAL_ENVS)
def test_every_environment_has_three_disjoint_reproducible_splits(name):
    env = make_env(name)
    ids = {s: [t.id for t in env.tasks(s, 12, seed=3)] for s in SPLITS}
    assert all(len(set(v)) == 12 for v in ids.values()), ids
    assert not set(ids["train"]) & set(ids["test"]) and not set(ids["dev"]) & set(ids["test"])
    assert not set(ids["train"]) & set(ids["dev"])
    assert ids["test"] == [t.id for t in env.tasks("test", 12, seed=3)]
    with pytest.raises(ValueError, match="dev"):
        env.tasks("validation", 2)


def test_the_pipeline_reports_test_problems_and_trains_on_train_only():
    from posttrain.data.synthetic import arithmetic_rows, arithmetic_tasks
    from posttrain.envs.arithmetic import Problem, split_of_problem

    reported = arithmetic_tasks(200, 2, "test")
    trained = list(arithmetic_rows(2000, 0, "train"))
    assert {t.id for t in reported}.isdisjoint({f"arith-{r['messages'][0]['content'].split('?')[0]}" for r in trained})
    for t in reported:
        a, op, b = re.fullmatch(r"arith-(\d+)([-+*])(\d+)", t.id).groups()
        assert split_of_problem(Problem(int(a), int(b), op)) == "test"


def test_rl_validation_and_its_best_checkpoint_read_dev():
    """The RL run keeps its best checkpoint by its validation reward: a choice, so it reads dev."""
    from types import SimpleNamespace

    from posttrain.train.validation import validate

    asked: list[str] = []

    class Recording:
        name, multi_turn = "x", False

        def tasks(self, split, n=None, seed=0):
            asked.append(split)
            raise LookupError("recorded")  # the split is all this test needs

    cfg = SimpleNamespace(envs=[SimpleNamespace(name="x", val_tasks=2, task_seed=0)],
                          rollout=SimpleNamespace(max_new_tokens=4, reasoning=False, max_turns=1))
    with pytest.raises(LookupError):
        validate(object(), {"x": Recording()}, cfg)
    assert asked == ["dev"]


# Where ``test`` may be read: places that only report a figure and choose nothing by it. A new use of
# the test split anywhere else fails below until it is added here with its reason.
REPORTING_ONLY = {
    "posttrain/experiments/stages.py": "the pipeline's held-out problems, measured and printed per stage",
    "posttrain/eval/evaluate.py": "`posttrain eval`'s default split: a reported figure",
    "posttrain/commands/eval.py": "`posttrain eval` and its benchmarks report figures",
    "posttrain/eval/tool_decisions.py": "`posttrain tool-decisions` reports decision rates",
    "posttrain/commands/tool_decisions.py": "its CLI default",
    "posttrain/commands/genrm.py": "the GenRM agreement printed after training",
    "posttrain/envs/genrm/evaluate.py": "GenRM agreement: a reported figure",
    "bench/genrm_judge.py": "judge figures from held-out replies: reported, nothing chosen by them",
    "posttrain/envs/splits.py": "the rule itself",
    "posttrain/serving/gym_client.py": "cuts a held-out dataset into dev and test",
    "posttrain/data/synthetic.py": "arithmetic_tasks' default: the reported problems",
    "posttrain/experiments/evidence.py": "scores the final checkpoints for the report's test table; the RL run "
                                         "chose its checkpoint on dev",
    "posttrain/experiments/pipeline_report.py": "writes the test table",
    "bench/pipeline.py": "reads the reports' test figures (chooses nothing: one row per run)",
    "bench/external_benchmarks.py": "reports benchmark figures",
    "bench/quant_evidence.sh": "the FP8 policies' accuracy recovery, reported; the searched policy is chosen on "
                               "calibration text, not on these problems",
    "bench/results_row.py": "names the splits a row may record (provenance); reads none",
    "bench/curation_vs_unfiltered.py": "its row records that measure()'s accuracies are on test; chooses nothing",
    "bench/prune_seeds.py": "bench/prune.py's test rows of several seeds, averaged and reported; chooses nothing",
    "bench/prune.py": "the pruned variants' recovery on test, reported; the searched architecture is chosen by "
                      "prune-search on held-out rows of the distillation data, never on test",
    "bench/eval_precision.py": "counts how many greedy answers bf16 moves on the headline problems; chooses nothing",
    "bench/mopd_evidence.py": "scores the teachers and students on test once for the report; the teachers are "
                              "picked on dev, the equal-time GRPO step by step times, never by a score",
    "bench/genrm_supervised.sh": "judges each arm's checkpoint on test once, after the dev rule chose it",
    "bench/genrm_expected.py": "measures both verdict modes; the mode is chosen on its --split dev run, test reported once",
    "bench/rlhf_judge.py": "the RLHF runs' test table: end-of-run checkpoints, a design fixed beforehand, nothing chosen",
    "posttrain/commands/validate.py": "`posttrain validate --split test` scores a model for a report; the RL run "
                                      "and its best checkpoint use dev",
    "bench/dpo_evidence.sh": "the DPO runs' before/after measurements on test: settings of the first run, nothing chosen",
    "bench/dpo_tool_hallucination.py": "prints and records the measurement files' figures; chooses nothing",
    "bench/synth_sft.py": "the two SFT arms' instruction scores on test, reported with a design fixed beforehand; "
                          "reads the test prompts only to refuse a train row that is one of them",
}
TEST_USE = re.compile(r"""(?x)
    (?:\(|,)\s*["']test["']\s*[,)]         # f(..., "test", ...) as a positional split
  | split\s*[=:]\s*["']?test\b             # split="test", split: test
  | ["']--split["'],\s*["']test["']        # a CLI call with --split test
  | --split[ =]test\b
""")


def _sources() -> list[Path]:
    files = [*ROOT.glob("posttrain/**/*.py"), *ROOT.glob("bench/**/*.py"), *ROOT.glob("scripts/**/*.py"),
             *ROOT.glob("bench/**/*.sh"), *ROOT.glob("scripts/**/*.sh")]
    return [f for f in files if "__pycache__" not in f.parts]


def test_no_recipe_reads_the_test_split():
    recipes = list(ROOT.glob("recipes/**/*.yaml"))
    assert recipes
    bad = [str(p.relative_to(ROOT)) for p in recipes if TEST_USE.search(p.read_text())]
    assert not bad, f"recipes read the test split (choose on dev): {bad}"


def test_the_test_split_is_read_only_where_figures_are_reported():
    offenders = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if TEST_USE.search(line) and rel not in REPORTING_ONLY:
                offenders.append(f"{rel}:{no}: {line.strip()}")
    assert not offenders, ("the test split is read outside a reporting path (choose on dev; or add the file to "
                           "REPORTING_ONLY with why it chooses nothing):\n" + "\n".join(offenders))


def test_the_scan_finds_a_selection_on_test():
    """The scan above cannot pass vacuously: it sees the forms a selection on test would take."""
    for line in ['tasks = env.tasks("test", 200)', "evaluate(gen, env, split='test')", "split: test",
                 '["--split", "test"]', "posttrain eval --split test"]:
        assert TEST_USE.search(line), line
    for line in ['env.tasks("dev", 20)', "pytest tests/unit", '"tests_passed"']:
        assert not TEST_USE.search(line), line

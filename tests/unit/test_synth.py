"""posttrain synth, pure parts: config checks, the column DAG, samplers, the expression evaluator,
templates, validators and retry counting (a scripted generator; no model)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from posttrain.configs.base import ConfigError, load_config
from posttrain.configs.synth import SynthConfig
from posttrain.data.synth import (SynthError, Tally, build_context, column_order, generate_chunk, jaccard,
                                  load_progress, render, safe_eval, sample_value, synthesize, validate)
from posttrain.engines.base import Completion

ROOT = Path(__file__).resolve().parents[2]


def cfg_of(columns: dict, **kw) -> SynthConfig:
    messages = kw.pop("messages", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])
    return SynthConfig.model_validate({"rows": kw.pop("rows", 4), "columns": columns, "messages": messages, **kw})


# --------------------------------------------------------------------------- config and DAG

def test_shipped_configs_load_and_order():
    paths = sorted((ROOT / "recipes/synth").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"two_step_qa", "instruction_personas", "instruction_sft"}
    for path in paths:
        cfg = load_config(SynthConfig, path)
        order = column_order(cfg)
        assert set(order) == set(cfg.columns)
        for col, spec in cfg.columns.items():  # every column after what it references
            from posttrain.data.synth import references
            assert all(order.index(r) < order.index(col) for r in references(spec))


def test_two_step_answer_never_sees_the_passage():
    cfg = load_config(SynthConfig, ROOT / "recipes/synth/two_step_qa.yaml")
    from posttrain.data.synth import references
    for name in ("answer", "answer_check"):
        assert references(cfg.columns[name]) == {"question"}


def test_missing_reference_names_the_column():
    cfg = cfg_of({"q": {"type": "model", "prompt": "about {topik}"}, "topic": {"type": "category", "values": [1]}})
    with pytest.raises(SynthError, match="column 'q' references 'topik'"):
        column_order(cfg)


def test_cycle_is_one_line_naming_the_columns():
    cfg = cfg_of({"a": {"type": "model", "prompt": "{b}"}, "b": {"type": "expr", "expr": "a + 1"}})
    with pytest.raises(SynthError, match=r"cycle: a -> b -> a|cycle: b -> a -> b") as e:
        column_order(cfg)
    assert "\n" not in str(e.value)


def test_validator_has_no_value_and_messages_checked():
    cfg = cfg_of({"a": {"type": "category", "values": ["x"]}, "v": {"type": "length", "column": "a"},
                  "b": {"type": "expr", "expr": "v"}})
    with pytest.raises(SynthError, match="validator column 'v'"):
        column_order(cfg)
    cfg = cfg_of({"a": {"type": "category", "values": ["x"]}},
                 messages=[{"role": "user", "content": "{nope}"}, {"role": "assistant", "content": "{a}"}])
    with pytest.raises(SynthError, match=r"messages\[0\] references 'nope'"):
        column_order(cfg)


def test_config_errors_before_any_work(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("rows: 2\ncolumns:\n  a: {type: categry, values: [1]}\nmessages:\n"
                   "  - {role: assistant, content: x}\n")
    with pytest.raises(ConfigError, match="columns.a"):
        load_config(SynthConfig, bad)
    with pytest.raises(ValueError, match="weights"):
        cfg_of({"a": {"type": "category", "values": [1, 2], "weights": [1]}})
    with pytest.raises(ValueError, match="last message"):
        cfg_of({"a": {"type": "category", "values": [1]}}, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(ValueError):  # not a JSON schema
        cfg_of({"a": {"type": "model", "prompt": "x", "output": "json", "schema": {"type": 3}}})


# --------------------------------------------------------------------------- samplers and expressions

def test_samplers_reproducible_per_seed_and_row():
    cfg = cfg_of({"c": {"type": "category", "values": ["a", "b", "c"], "weights": [1, 1, 8]},
                  "u": {"type": "uniform", "low": 0, "high": 1}, "i": {"type": "int", "low": 1, "high": 6},
                  "s": {"type": "seed", "path": str(ROOT / "recipes/synth/seed_passages.jsonl"), "field": "topic"},
                  "e": {"type": "expr", "expr": "i * 2 + len(s)"}}, rows=50)
    ctx = build_context(cfg)

    def draw(seed: int) -> list[dict]:
        c = cfg.model_copy(update={"seed": seed})
        return [v for _, v, _ in generate_chunk(c, column_order(c), list(range(50)), None, ctx, Tally())]

    a, b, other = draw(0), draw(0), draw(1)
    assert a == b and a != other
    assert all(1 <= r["i"] <= 6 and 0 <= r["u"] <= 1 and r["e"] == r["i"] * 2 + len(r["s"]) for r in a)
    assert sum(r["c"] == "c" for r in a) > 25  # weight 8 of 10
    # a row's values do not depend on the chunk it is drawn in
    part = [v for _, v, _ in generate_chunk(cfg, column_order(cfg), [7, 8], None, ctx, Tally())]
    assert part == a[7:9]


@pytest.mark.parametrize("expr", [
    "x.__class__", "().__class__.__bases__", "__import__('os')", "open('/etc/passwd')", "eval('1')",
    "[y for y in x]", "lambda: 1", "getattr(x, 'a')", "str.upper('a')", "len(x, key=1)",
])
def test_expression_evaluator_refuses_attributes_and_calls(expr):
    with pytest.raises(SynthError):
        safe_eval(expr, {"x": [1, 2]})


def test_expression_evaluator_computes():
    names = {"a": 3, "s": "Hello", "d": {"k": [5, 6]}}
    assert safe_eval("a * 2 + 1", names) == 7
    assert safe_eval("lower(s) if a > 2 else s", names) == "hello"
    assert safe_eval("d['k'][1] - max(a, 4)", names) == 2
    assert safe_eval("1 < a <= 3 and not False", names) is True
    assert safe_eval("s[1:3]", names) == "el"
    with pytest.raises(SynthError, match="exponent"):
        safe_eval("9 ** 9 ** 9", {})
    with pytest.raises(SynthError, match="unknown name"):
        safe_eval("b + 1", names)


def test_template_renders_fields_not_attributes():
    assert render("{a} and {d.k.1} {{x}}", {"a": "A", "d": {"k": [0, "one"]}}) == "A and one {x}"
    assert render("{o}", {"o": {"x": 1}}) == '{"x": 1}'
    assert render("{a.__class__}", {"a": {"__class__": "safe"}}) == "safe"  # a dict key, never an attribute
    with pytest.raises(KeyError):
        render("{a.__class__}", {"a": {}})


# --------------------------------------------------------------------------- validators

def test_length_agreement_and_schema_validators():
    ctx = build_context(cfg_of({"a": {"type": "category", "values": [1]}}))
    length = SynthConfig.model_fields  # noqa: F841 - keep the import side effect-free
    from posttrain.configs.synth import AgreementValidator, JsonSchemaValidator, LengthValidator

    lv = LengthValidator(type="length", column="x", min_words=2, max_words=3)
    assert validate("v", lv, {"x": "one"}, ctx) == "too_short"
    assert validate("v", lv, {"x": "one two"}, ctx) is None
    assert validate("v", lv, {"x": "a b c d"}, ctx) == "too_long"
    av = AgreementValidator(type="agreement", columns=["x", "y"], min_jaccard=0.5)
    assert jaccard("the cat sat", "The cat sat.") == 1.0
    assert validate("v", av, {"x": "the cat sat", "y": "the cat ran"}, ctx) is None  # 2/4
    assert validate("v", av, {"x": "the cat sat", "y": "dogs bark loudly"}, ctx) == "disagree"
    sv = JsonSchemaValidator.model_validate({"type": "json_schema", "column": "x", "schema": {
        "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}})
    assert validate("v", sv, {"x": '```json\n{"n": 3}\n```'}, ctx) is None
    assert validate("v", sv, {"x": '{"n": "3"}'}, ctx) == "schema:n:type"
    assert validate("v", sv, {"x": "no json here"}, ctx) == "invalid_json"


def test_env_validator_is_the_instruction_verifier():
    cfg = cfg_of({"task": {"type": "env_task", "env": "instruction", "pool": 5},
                  "r": {"type": "category", "values": ["x"]},
                  "v": {"type": "env", "column": "r", "task": "task"}})
    ctx = build_context(cfg)
    from posttrain.configs.synth import EnvValidator

    v = EnvValidator(type="env", column="r", task="task")
    task = ctx.env_tasks["task"][0]
    value = {"id": task.id, "prompt": "..."}
    assert validate("v", v, {"task": value, "r": task.metadata["reference_response"]}, ctx) is None
    assert validate("v", v, {"task": value, "r": "ok."}, ctx).startswith("verifier:")


def test_code_validator_runs_in_the_sandbox():
    from posttrain.configs.synth import CodeValidator

    ctx = build_context(cfg_of({"a": {"type": "category", "values": [1]}}))
    v = CodeValidator(type="code", column="c", suffix="assert f(2) == 4", allow_unisolated=True)
    assert validate("v", v, {"c": "```python\ndef f(x):\n    return x * 2\n```"}, ctx) is None  # unisolated allowed: must run
    assert validate("v", v, {"c": "def f(x):\n    return x + 3"}, ctx).startswith("sandbox:")


# --------------------------------------------------------------------------- retries, resume

class Scripted:
    """Answers from a list per call: each prompt gets the next scripted text (seeds recorded)."""

    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    def generate(self, prompts, params, tools=None, seeds=None):
        self.calls.append((len(prompts), list(seeds)))
        return [[Completion(self.texts.pop(0))] for _ in prompts]


def test_retries_are_bounded_and_reasons_counted():
    cfg = cfg_of({"ans": {"type": "model", "prompt": "q", "output": "json",
                          "schema": {"type": "object", "required": ["a"]}},
                  "ok": {"type": "length", "column": "ans", "min_words": 2}},
                 rows=2, max_attempts=3)
    # attempt 1: row 0 bad JSON, row 1 passes; attempt 2: row 0 schema fails; attempt 3: too short
    gen = Scripted(["nope", '{"a": "x y"}', '{"b": 1}', '{"a": ""}'])
    tally = Tally()
    out = generate_chunk(cfg, column_order(cfg), [0, 1], gen, build_context(cfg), tally)
    assert out[0][1] is None and out[0][2] == 3
    assert out[1][1] == {"ans": {"a": "x y"}} and out[1][2] == 1
    assert tally.failures == {"ans:invalid_json": 1, "ans:schema:root:required": 1, "ok:too_short": 1}
    assert [n for n, _ in gen.calls] == [2, 1, 1]  # batched across rows, only live rows retried
    assert gen.calls[1][1][0] != gen.calls[0][1][0]  # a retry is sampled with a new seed


def test_resume_drops_torn_tail_and_rows_not_done(tmp_path):
    out = tmp_path / "o.jsonl"
    rows = [json.dumps({"row": i}) for i in range(3)]
    out.write_text("\n".join(rows) + '\n{"row": 3, "mess')
    (tmp_path / "o.jsonl.done").write_text("0\n1\n")
    lines, start = load_progress(out)
    assert start == 2 and lines == rows[:2]
    assert out.read_text() == rows[0] + "\n" + rows[1] + "\n"


def test_synthesize_scripted_end_to_end_and_refuses_existing(tmp_path):
    cfg = cfg_of({"n": {"type": "int", "low": 1, "high": 9},
                  "ans": {"type": "model", "prompt": "say {n}"}},
                 messages=[{"role": "user", "content": "say {n}"}, {"role": "assistant", "content": "{ans}"}],
                 rows=3, final={"filters": None, "dedup": None})
    out = tmp_path / "o.jsonl"
    s = synthesize(cfg, Scripted(["one", "two", "three"]), out, progress=False, log=lambda _: None)
    assert s["accepted"] == 3
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["messages"][1]["content"] for r in got] == ["one", "two", "three"]
    from posttrain.data.conversations import validate_row
    for r in got:
        validate_row(r)
    with pytest.raises(SynthError, match="exists"):
        synthesize(cfg, Scripted([]), out, progress=False, log=lambda _: None)


def test_synth_profile_clusters_acceptance_and_coverage():
    from posttrain.data.behaviour_profile import minhash_clusters, synth_profile

    a = "the tide rises twice a day because the moon pulls the ocean toward it"
    texts = [a, a + " again", "bread rises because yeast makes gas bubbles in the warm dough", a]
    ids = minhash_clusters(texts, 0.5)
    assert ids[0] == ids[1] == ids[3] != ids[2]
    rows = [{"messages": [{"role": "assistant", "content": t}], "columns": {"topic": k}}
            for t, k in zip(texts, ["tides", "tides", "bread", "tides"])]
    summary = {"rows_processed": 8, "accepted": 4, "failures": {"agree:disagree": 3, "len:too_short": 2, "agree:x": 1},
               "config": {"columns": {"topic": {"type": "category", "values": ["tides", "bread", "owls"]}}}}
    sp = synth_profile(rows, summary, "topic")
    assert sp["diversity"]["clusters"] == 2 and sp["diversity"]["largest_cluster"] == 3
    assert sp["acceptance"]["rate"] == 0.5
    assert sp["acceptance"]["failed_attempts_by_validator"] == {"agree": 4, "len": 2}
    assert sp["topic_coverage"]["missing"] == ["owls"] and sp["topic_coverage"]["of_values"] == 3
    resumed = {**summary, "rows_processed": 2, "accepted": 1,  # the last run's own counts, then every run's
               "total": {"rows_processed": 10, "accepted": 5, "failures": {"agree:x": 5}, "final_dropped": {}}}
    sp = synth_profile(rows, resumed, "topic")
    assert sp["acceptance"]["rate"] == 0.5 and sp["acceptance"]["failed_attempts_by_validator"] == {"agree": 5}
    assert sp["topic_coverage"]["of_values"] == 3  # the config still read from the summary


def test_judge_validator_uses_the_judge_prompt_and_threshold():
    from posttrain.envs.judge import verdict_from_reply

    seen = []

    class Judge:  # the LLMJudge interface; the verdict is parsed from a scripted reply by the real parser
        def judge(self, messages):
            seen.append(messages)
            return verdict_from_reply("good\nSCORE: 9/10" if "tide" in json.dumps(messages) else "bad\nSCORE: 2/10")

    cfg = cfg_of({"q": {"type": "category", "values": ["x"]}, "a": {"type": "category", "values": ["y"]},
                  "j": {"type": "judge", "column": "a", "judge": "stand-in", "context": "q"}})
    ctx = build_context(cfg, make_judge=lambda spec: Judge())
    v = cfg.columns["j"]
    assert validate("j", v, {"q": "why tides?", "a": "the moon pulls"}, ctx) is None
    assert validate("j", v, {"q": "why?", "a": "no idea"}, ctx) == "judge:low_score"
    assert "the moon pulls" in json.dumps(seen[0])


def test_resume_refuses_another_config(tmp_path):
    cols = {"n": {"type": "int", "low": 1, "high": 9}, "ans": {"type": "model", "prompt": "say {n}"}}
    msgs = [{"role": "user", "content": "say {n}"}, {"role": "assistant", "content": "{ans}"}]
    cfg = cfg_of(cols, messages=msgs, rows=2, final={"filters": None, "dedup": None})
    out = tmp_path / "o.jsonl"
    synthesize(cfg, Scripted(["a", "b"]), out, progress=False, log=lambda _: None)
    more = cfg.model_copy(update={"rows": 3})  # more rows: the same run, continued
    assert synthesize(more, Scripted(["c"]), out, resume=True, progress=False, log=lambda _: None)["rows_processed"] == 1
    other = cfg.model_copy(update={"seed": 5})
    with pytest.raises(SynthError, match="another config"):
        synthesize(other, Scripted([]), out, resume=True, progress=False, log=lambda _: None)


def test_env_task_args_reach_the_environment_and_bad_args_are_one_line():
    cfg = cfg_of({"task": {"type": "env_task", "env": "instruction", "pool": 12,
                           "args": {"min_constraints": 1, "max_constraints": 1}},
                  "wide": {"type": "env_task", "env": "instruction", "pool": 12,
                           "args": {"min_constraints": 3, "max_constraints": 3}}})
    ctx = build_context(cfg)
    assert {len(t.ground_truth["constraints"]) for t in ctx.env_tasks["task"]} == {1}
    assert {len(t.ground_truth["constraints"]) for t in ctx.env_tasks["wide"]} == {3}  # not the first env's
    bad = cfg_of({"task": {"type": "env_task", "env": "instruction", "args": {"no_such_arg": 1}}})
    with pytest.raises(SynthError, match="bad args for environment 'instruction'"):
        build_context(bad)


def test_a_resumed_runs_summary_totals_every_run_into_the_output(tmp_path):
    from posttrain.data.synth import summary_path

    cols = {"ans": {"type": "model", "prompt": "q"}, "ok": {"type": "length", "column": "ans", "min_words": 2}}
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "{ans}"}]
    cfg = cfg_of(cols, messages=msgs, rows=2, max_attempts=1, final={"filters": None, "dedup": None})
    out, quiet = tmp_path / "o.jsonl", (lambda _: None)
    first = synthesize(cfg, Scripted(["two words", "one"]), out, progress=False, log=quiet)
    assert first["total"] == {"rows_processed": 2, "accepted": 1, "rejected": 1, "completions": 2, "runs": 1,
                              "final_dropped": {}, "failures": {"ok:too_short": 1}, "complete": True}
    second = synthesize(cfg.model_copy(update={"rows": 4}), Scripted(["x", "a b c"]), out, resume=True,
                        progress=False, log=quiet)
    assert second["accepted"] == 1 and second["rows_processed"] == 2  # this run's own figures stay as they were
    assert second["total"] == {"rows_processed": 4, "accepted": 2, "rejected": 2, "completions": 4, "runs": 2,
                               "final_dropped": {}, "failures": {"ok:too_short": 2}, "complete": True}
    summary_path(out).unlink()  # as a run killed before its summary leaves it: its rows go uncounted
    third = synthesize(cfg.model_copy(update={"rows": 5}), Scripted(["d e"]), out, resume=True, progress=False, log=quiet)
    assert third["total"]["rows_processed"] == 1 and third["total"]["complete"] is False

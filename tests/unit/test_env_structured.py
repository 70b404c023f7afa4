"""Structured-output environment: generated documents + JSON Schemas, reward = schema validity."""

import copy
import json
import random

import pytest
from jsonschema import Draft202012Validator

from posttrain.envs.base import Task, make_env
from posttrain.envs.structured import (
    DOCUMENT_KINDS,
    camel,
    check_schema,
    compact_json,
    make_document,
    restyle_schema,
)


def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def env():
    return make_env("structured")


@pytest.fixture(scope="module")
def train(env) -> list[Task]:
    return env.tasks("train", 200, seed=0)


def test_every_reference_validates_against_its_schema(train):
    for i, t in enumerate(train):
        schema, reference = t.ground_truth["schema"], t.ground_truth["reference"]
        if i < 40:  # metaschema checks are slow; the shapes repeat
            Draft202012Validator.check_schema(schema)
        assert check_schema(reference, schema) is None, t.id
        json.dumps(t.to_dict())  # the whole task travels as JSON


def test_valid_json_scores_one_bare_or_fenced(env, train):
    t = train[0]
    payload = json.dumps(t.ground_truth["reference"])
    for text in [payload, f"```json\n{payload}\n```", f"Here it is:\n```\n{payload}\n```\nDone."]:
        result = env.verify(t, reply(text))
        assert result.reward == 1.0 and result.components == {"format": 1.0, "correct": 1.0}


def test_content_is_not_graded(env, train):
    # Exact schema adherence only (docs/recipe.md §2.4): valid but wrong values still score 1.
    t = next(t for t in train if "invoice_number" in t.ground_truth["schema"]["properties"])
    wrong = dict(t.ground_truth["reference"], invoice_number="INV-1999-0001")
    assert env.verify(t, reply(json.dumps(wrong))).reward == 1.0


def _first(train, pred):
    return next(t for t in train if pred(t.ground_truth["schema"]))


def test_schema_violations_score_zero_with_the_error_as_reason(env, train):
    t = _first(train, lambda s: s.get("required"))
    key = t.ground_truth["schema"]["required"][0]
    missing = {k: v for k, v in t.ground_truth["reference"].items() if k != key}
    result = env.verify(t, reply(json.dumps(missing)))
    assert result.reward == 0.0 and result.components == {"format": 1.0, "correct": 0.0}
    assert result.reason.startswith("schema_violation: $:") and key in result.reason

    closed = _first(train, lambda s: s.get("additionalProperties") is False)
    extra = dict(closed.ground_truth["reference"], surprise_field=1)
    result = env.verify(closed, reply(json.dumps(extra)))
    assert result.reward == 0.0 and "surprise_field" in result.reason


def test_wrong_types_enums_and_patterns_fail():
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer"},
            "mode": {"type": "string", "enum": ["remote", "hybrid"]},
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "items": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "required": ["age"],
    }
    assert check_schema({"age": 3, "mode": "remote", "date": "2024-01-31", "items": ["x"]}, schema) is None
    assert check_schema({"age": "3"}, schema).startswith("$.age:")
    assert check_schema({"age": 3.5}, schema).startswith("$.age:")
    assert check_schema({"age": 3, "mode": "office"}, schema).startswith("$.mode:")
    assert check_schema({"age": 3, "date": "31 January 2024"}, schema).startswith("$.date:")
    assert check_schema({"age": 3, "items": []}, schema).startswith("$.items:")
    assert check_schema([1, 2], schema).startswith("$:")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty_output"),
        ("\x00\ufffd garbage", "invalid_json"),
        ("Sure! Here is the JSON you asked for.", "invalid_json"),
        ('{"title": "x",}', "invalid_json"),
        ("```json\n{}\n```\n```json\n{}\n```", "multiple_json_blocks"),
        ("[" * 50_000, "invalid_json"),
        ("<think>{}</think>", "empty_output"),  # JSON only in the reasoning block does not count
    ],
)
def test_malformed_output_scores_zero_without_raising(env, train, text, reason):
    result = env.verify(train[0], reply(text))
    assert result.reward == 0.0 and result.reason.startswith(reason)
    assert result.components == {"format": 0.0, "correct": 0.0}


def test_tasks_are_deterministic_and_splits_disjoint(env, train):
    assert [t.to_dict() for t in env.tasks("train", 200, seed=0)] == [t.to_dict() for t in train]
    train_ids = {t.id for t in train} | {t.id for t in env.tasks("train", 200, seed=1)}
    validation = {t.id for s in (0, 1) for t in env.tasks("dev", 50, seed=s)}
    assert len({t.id for t in train}) == len(train) and not train_ids & validation


def test_schemas_vary_across_tasks(train):
    kinds = {t.metadata["kind"] for t in train}
    assert kinds == set(DOCUMENT_KINDS)
    schemas = [json.dumps(t.ground_truth["schema"]) for t in train]
    assert any("additionalProperties" in s for s in schemas) and any("additionalProperties" not in s for s in schemas)
    assert any("lineItems" in s or "fullName" in s for s in schemas)  # camelCase keys
    assert any("line_items" in s or "full_name" in s for s in schemas)  # snake_case keys
    for keyword in ['"enum"', '"pattern"', '"minItems"', '"minimum"', '"integer"', '"boolean"']:
        assert any(keyword in s for s in schemas), keyword


def test_fields_the_document_omits_are_never_required():
    rng = random.Random(0)
    offered_but_absent = 0
    for _ in range(200):
        doc = make_document("invoice", rng)  # paid invoices state no due date; notes are optional
        required = doc.schema.get("required", [])
        for key in ("due_date", "dueDate", "notes"):
            if key in doc.schema["properties"] and key not in doc.reference:
                offered_but_absent += 1
                assert key not in required
    assert offered_but_absent > 20


def test_restyle_and_compact_json():
    schema = {"type": "object", "properties": {"line_items": {"type": "array", "items": {
        "type": "object", "properties": {"unit_price": {"type": "number"}}, "required": ["unit_price"]}}},
        "required": ["line_items"]}
    styled = restyle_schema(copy.deepcopy(schema), camel)
    assert styled["required"] == ["lineItems"]
    assert list(styled["properties"]["lineItems"]["items"]["properties"]) == ["unitPrice"]
    assert json.loads(compact_json(styled)) == styled
    assert camel("registration_required") == "registrationRequired"

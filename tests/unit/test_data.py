"""Conversation JSONL validation, reasoning transforms, packing, the SFT step plan, WSD."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from posttrain.data.conversations import DataError, read_conversations, write_jsonl
from posttrain.data.packing import IGNORE, Example, pack_examples, pad_examples
from posttrain.data.synthetic import TRACES, Problem, arithmetic_rows, sample_problems
from posttrain.envs.arithmetic import split_of_problem
from posttrain.data.transforms import apply_reasoning_transforms, budget_truncate, reasoning_off
from posttrain.train.schedule import wsd_lr_factor
from posttrain.train.sft import step_plan

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _write(tmp_path, lines):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_bad_rows_name_file_line_field(tmp_path):
    p = _write(tmp_path, [
        json.dumps(GOOD),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}]}),
        json.dumps({"messages": [{"role": "user", "content": "x"}]}),
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]}),
    ])
    with pytest.raises(DataError) as e:
        read_conversations(p)
    msg = str(e.value)
    assert f"{p}:2: not valid JSON" in msg
    assert f"{p}:3: messages.1.role" in msg
    assert f"{p}:4:" in msg and "no assistant message" in msg
    assert f"{p}:5:" in msg and "no tools are defined" in msg
    rows, report = read_conversations(p, on_error="skip")
    assert len(rows) == 1 and report.read == 5 and len(report.bad) == 4
    assert "1/5 rows kept" in report.summary()


def test_transforms_are_seeded_and_in_proportion():
    rows = list(arithmetic_rows(2000, seed=0))
    a = apply_reasoning_transforms(rows, seed=7)
    b = apply_reasoning_transforms(rows, seed=7)
    assert a == b
    off = sum(1 for r in a if r.get("reasoning") is False)
    cut = sum(1 for r in a if r.get("budget_truncated"))
    assert 150 < off < 250 and 30 < cut < 90  # 10% and 3% of 2000


def test_reasoning_off_and_budget_truncate_keep_answer():
    row = next(arithmetic_rows(1, seed=1))
    off = reasoning_off(row)
    assert off["messages"][0]["content"].endswith("/no_think")
    assert "reasoning_content" not in off["messages"][-1] and off["messages"][-1]["content"].startswith("Answer:")
    cut = budget_truncate(row, random.Random(0))
    orig = row["messages"][-1]["reasoning_content"]
    assert orig.startswith(cut["messages"][-1]["reasoning_content"])
    assert cut["messages"][-1]["content"] == row["messages"][-1]["content"]


def test_packing_fits_rows_and_masks_labels():
    exs = [Example(list(range(n)), [0] * (n // 2) + [1] * (n - n // 2)) for n in (50, 30, 20, 60, 10)]
    rows = pack_examples(exs, 64, 0)
    assert sum(r.n_examples for r in rows) == 5
    for r in rows:
        assert len(r.input_ids_BT[0]) <= 64
        assert all(l == IGNORE or l == t for l, t in zip(r.labels_BT[0], r.input_ids_BT[0]))
    assert sum(r.n_target_tokens for r in rows) == sum(sum(e.loss_mask) for e in exs)
    padded = pad_examples(exs[:2], 64, 0, rows_per_batch=2)[0]
    assert padded.attention_mask_BT[1].count(0) == 20 and padded.labels_BT[1][-1] == IGNORE


def test_packing_isolates_sequences():
    """Logits of each example inside a packed row equal the logits of that example alone."""
    from posttrain.models.loading import load_model

    model = load_model("tiny-llama").model.eval()
    a, b = Example(list(range(5, 25)), [1] * 20), Example(list(range(30, 41)), [1] * 11)
    t = pack_examples([a, b], 64, 0)[0].to_tensors()
    with torch.no_grad():
        packed = model(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False).logits[0]
        alone_a = model(input_ids=torch.tensor([a.input_ids])).logits[0]
        alone_b = model(input_ids=torch.tensor([b.input_ids])).logits[0]
    assert torch.allclose(packed[:20], alone_a, atol=1e-5)
    assert torch.allclose(packed[20:], alone_b, atol=1e-5)


def test_step_plan_is_deterministic_and_weighted():
    plan = step_plan([10, 1000], [3.0, 1.0], batch_size=40, steps=50, seed=1)
    assert plan == step_plan([10, 1000], [3.0, 1.0], 40, 50, 1)
    counts = Counter(d for batch in plan for d, _ in batch)
    assert 0.7 < counts[0] / 2000 < 0.8  # weight 3:1 → 75% of draws, small set repeated for epochs
    # within each epoch of the small dataset every example appears once before any repeats
    first = [i for batch in plan for d, i in batch if d == 0][:10]
    assert sorted(first) == list(range(10))


def test_wsd_schedule_shape():
    f = [wsd_lr_factor(s, 100, 10, 0.2) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == 1.0
    assert all(x == 1.0 for x in f[10:80])
    assert f[80] < 1.0 and f[99] == pytest.approx(0.0) and f == sorted(f[:10]) + f[10:]
    assert all(a >= b for a, b in zip(f[80:], f[81:]))


def test_arithmetic_traces_are_correct_and_splits_disjoint():
    rng = random.Random(0)
    for _ in range(300):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        for op in "+-*":
            p = Problem(a, b, op)
            assert TRACES[op](a, b).rstrip(".").endswith(str(p.answer))
    train = set(sample_problems(300, 0, "train"))
    dev, test = set(sample_problems(100, 0, "dev")), set(sample_problems(100, 0, "test"))
    assert not train & dev and not train & test and not dev & test
    assert all(split_of_problem(p) == "dev" for p in dev) and all(split_of_problem(p) == "test" for p in test)


def test_write_and_read_roundtrip(tmp_path):
    rows = list(arithmetic_rows(5, seed=2))
    write_jsonl(rows, tmp_path / "x.jsonl")
    back, report = read_conversations(tmp_path / "x.jsonl")
    assert back == rows and report.kept == 5


def test_tool_call_names_the_template_cannot_write_are_bad_rows(tmp_path):
    # issue 12, item 9: a parameter name like "a>\n<parameter=admin" would render as a second
    # parameter; it is a bad row at read time (file:line), not a crash when the row is rendered.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    row = {"tools": tools, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
           "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a>\n<parameter=admin": 1}}}]}]}
    p = _write(tmp_path, [json.dumps(GOOD), json.dumps(row)])
    with pytest.raises(DataError) as e:
        read_conversations(p)
    assert f"{p}:2:" in str(e.value) and "bad_parameter_name" in str(e.value)

"""Tool-use SFT rows from the banking expert (``data/tool_demos.py``, ``posttrain make-data banking``):
valid conversation rows with the environment's tools, every one verified, and a failing expert is an
error, not a skipped row."""

from __future__ import annotations

import json

import pytest

from posttrain.data.conversations import validate_row
from posttrain.data.tool_demos import banking_rows
from posttrain.envs.banking.env import BankingEnv


def test_banking_rows_are_verified_tool_use_conversations():
    env = BankingEnv()
    rows = list(banking_rows(8, seed=0, split="train"))
    assert len(rows) == 8 and len({r["task_id"] for r in rows}) == 8
    by_id = {t.id: t for t in env.tasks("train", 8, 0)}
    for r in rows:
        validate_row(r)
        task = by_id[r["task_id"]]
        assert r["tools"] == task.tools and r["messages"][:2] == task.messages
        assert env.verify(task, r["messages"]).reward == 1.0
        assistant = [m for m in r["messages"] if m["role"] == "assistant"]
        assert any(m.get("tool_calls") for m in assistant) and any(not m.get("tool_calls") for m in assistant)
    assert {r["task_id"] for r in banking_rows(4, 0, "dev")}.isdisjoint(by_id)


def test_a_failing_expert_is_an_error(monkeypatch):
    import posttrain.envs.banking.expert as expert

    def lazy(task, call_format="openai"):  # talks until the episode runs out of turns, never acts
        while True:
            yield expert.say("Goodbye.")

    monkeypatch.setattr(expert, "expert_agent", lazy)
    with pytest.raises(expert.ExpertFailed, match="banking/"):
        next(banking_rows(1))


def test_make_data_banking_command(tmp_path, capsys):
    from posttrain.cli import main

    out = tmp_path / "banking.jsonl"
    assert main(["make-data", "banking", "--n", "3", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["source"] == "expert/banking" for r in rows)
    assert "wrote 3 rows" in capsys.readouterr().out

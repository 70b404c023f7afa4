"""Tool use where a tool fits (``eval/tool_decisions.py``): decision points from the banking expert's
verified episodes, per-point scores by hand, per-task aggregation."""

from __future__ import annotations

import pytest

from posttrain.engines.base import Completion
from posttrain.eval.tool_decisions import banking_decision_points, per_task, score_decisions, score_reply
from posttrain.models.chat_template import format_tool_call


@pytest.fixture(scope="module")
def points():
    return banking_decision_points("dev", 2, 0)


def test_points_are_every_expert_turn(points):
    assert len({p.task_id for p in points}) == 2
    for p in points:
        assert p.messages[-1]["role"] in ("user", "tool") and p.expected["role"] == "assistant"
        assert p.messages[0]["role"] == "system" and len(p.tools) == 8
    assert any(p.expected.get("tool_calls") for p in points) and any(not p.expected.get("tool_calls") for p in points)


def test_scores_by_hand(points):
    call = next(p for p in points if p.expected.get("tool_calls"))
    fn = call.expected["tool_calls"][0]["function"]
    right = format_tool_call(fn["name"], fn["arguments"])
    rows = {r["env"]: r["reward"] for r in score_reply(call, right)}
    assert rows == {"banking@call": 1.0, "banking@call_exact": 1.0}
    wrong_args = format_tool_call(fn["name"], {k: "x" for k in fn["arguments"]})
    assert {r["env"]: r["reward"] for r in score_reply(call, wrong_args)} == {"banking@call": 1.0, "banking@call_exact": 0.0}
    broken = {r["env"]: r["reward"] for r in score_reply(call, "<tool_call>\n<function=oops")}
    assert broken == {"banking@call": 1.0, "banking@call_exact": 0.0}  # attempted, does not parse
    assert {r["env"]: r["reward"] for r in score_reply(call, "Sure, one moment.")} == {"banking@call": 0.0,
                                                                                       "banking@call_exact": 0.0}
    plain = next(p for p in points if not p.expected.get("tool_calls"))
    assert [r["reward"] for r in score_reply(plain, "How can I help?")] == [1.0]
    assert [r["reward"] for r in score_reply(plain, right)] == [0.0]


def test_per_task_means_and_a_scripted_model(points):
    rows = [{"env": "e", "task_id": "a/turn02", "reward": 1.0}, {"env": "e", "task_id": "a/turn04", "reward": 0.0},
            {"env": "e", "task_id": "b/turn02", "reward": 1.0}]
    assert per_task(rows) == {"e": {"a": 0.5, "b": 1.0}}

    class Plain:
        def generate(self, prompts, params, tools=None):
            assert params.temperature == 0.0 and len(tools) == len(prompts)
            return [[Completion("Let me help you with that.")] for _ in prompts]

    got = per_task(score_decisions(Plain(), points))
    assert set(got["banking@plain"].values()) == {1.0} and set(got["banking@call"].values()) == {0.0}

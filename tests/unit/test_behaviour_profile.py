"""Data behaviour profiles: hand-computed numbers on a tiny set, the CLI on a generated tool dataset."""

from __future__ import annotations

import argparse
import json
import math
import random

import pytest

from posttrain.data.conversations import write_jsonl
from posttrain.commands.profile_data import add_arguments, run
from posttrain.data.behaviour_profile import Thresholds, distribution, entropy_bits, profile_rows, row_stats
from posttrain.models.chat_template import format_tool_call


def words(text: str) -> int:
    return len(text.split())


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def call(name: str, **args) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args}}


TOOLS = [tool(n) for n in ("search", "open_page", "calculator", "weather")]


def make_tool_dataset(n: int, seed: int = 0) -> list[dict]:
    """Agent-style rows: search → open_page chains, calculator calls, direct answers, no-tool chat.

    Tool calls come both as structured ``tool_calls`` and as XML in the content, as real data does.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = rng.choice(["search", "calc", "direct", "chat"])
        user = {"role": "user", "content": f"question number {i} about topic {rng.randint(0, 50)}"}
        msgs: list[dict] = [user]
        if kind == "search":
            for hop in range(rng.randint(1, 4)):
                msgs += [{"role": "assistant", "reasoning_content": "I should look this up " * rng.randint(1, 5),
                          "content": "", "tool_calls": [call("search", q=f"q{i}-{hop}")]},
                         {"role": "tool", "content": "result list"},
                         {"role": "assistant", "content": format_tool_call("open_page", {"url": f"u{hop}"})},
                         {"role": "tool", "content": "page text " * 5}]
            msgs.append({"role": "assistant", "content": "Here is what I found. " * rng.randint(1, 3)})
        elif kind == "calc":
            msgs += [{"role": "assistant", "content": "", "tool_calls": [call("calculator", expr="2*21")]},
                     {"role": "tool", "content": "42"},
                     {"role": "assistant", "content": "<think>\nthe tool said 42\n</think>\nThe result is 42."}]
        else:
            msgs.append({"role": "assistant", "content": "A direct answer without tools."})
        row = {"messages": msgs, "domain": "agent" if kind != "chat" else "chat"}
        if kind != "chat":
            row["tools"] = TOOLS
        rows.append(row)
    return rows


def test_row_stats_counts_structured_and_xml_calls_and_reasoning():
    row = {"messages": [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "reasoning_content": "need search", "content": "", "tool_calls": [call("search", q="a")]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "<think>\nopen it\n</think>\n" + format_tool_call("open_page", {"url": "x"})},
        {"role": "tool", "content": "page"},
        {"role": "assistant", "content": "done now"},
    ], "tools": TOOLS}
    s = row_stats(row, words)
    assert s.tool_calls == ["search", "open_page"]
    assert s.turns == 3 and s.reasoning_len == 4  # "need search" + "open it"
    assert s.tools_offered == ["search", "open_page", "calculator", "weather"]
    assert s.turn_lens[-1] == 2 and s.n_messages == 6


def test_profile_numbers_on_a_hand_made_set():
    rows = [
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "", "tool_calls": [call("search"), call("open_page")]},
                      {"role": "tool", "content": "x"}, {"role": "assistant", "content": "a b"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "", "tool_calls": [call("search")]},
                      {"role": "tool", "content": "x"}, {"role": "assistant", "content": "a"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "direct answer"}], "tools": TOOLS},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "chat reply here"}]},
    ]
    p = profile_rows(rows, words)
    assert p["rows"] == 4 and p["unit"] == "words"
    assert p["tool_use_when_offered"] == {"rows_offering_tools": 3, "rate": pytest.approx(2 / 3, abs=1e-4),
                                          "rows_without_tools_that_call": 0}
    div = p["tool_diversity"]
    assert div["usage"] == {"search": 2, "open_page": 1} and div["distinct_tools_offered"] == 4
    h = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert div["entropy_bits"] == pytest.approx(h, abs=1e-4) and div["normalized_entropy"] == pytest.approx(h, abs=1e-4)
    assert p["cooccurrence"] == {"tools": ["search", "open_page"], "matrix": [[2, 1], [1, 1]]}
    assert p["tool_calls"]["per_trajectory"]["mean"] == pytest.approx(0.75)
    assert p["tool_calls"]["per_trajectory"]["max"] == 2
    assert p["turns"]["assistant_turns"]["max"] == 2
    assert p["domains"] == {"unknown": 4} and p["warnings"] == []


def test_distribution_and_entropy_helpers():
    d = distribution(list(range(1, 101)))
    assert (d["count"], d["mean"], d["min"], d["p50"], d["p90"], d["p99"], d["max"]) == (100, 50.5, 1, 50, 90, 99, 100)
    assert distribution([]) == {"count": 0}
    assert entropy_bits([5, 5]) == pytest.approx(1.0) and entropy_bits([7]) == 0.0 and entropy_bits([]) == 0.0


def test_habit_warnings_fire_on_always_calling_and_over_searching():
    always = [r for r in make_tool_dataset(200, seed=1) if r.get("tools") and
              any(m.get("tool_calls") or "<tool_call>" in (m.get("content") or "") for m in r["messages"])]
    p = profile_rows(always, words, thresholds=Thresholds(many_calls=4, long_share_warn=0.1))
    assert p["tool_use_when_offered"]["rate"] == 1.0
    assert any("always call a tool" in w for w in p["warnings"])
    assert any("over-searching" in w for w in p["warnings"])
    balanced = profile_rows(make_tool_dataset(200, seed=1), words)
    assert 0.0 < balanced["tool_use_when_offered"]["rate"] < 0.95
    assert not any("always call" in w for w in balanced["warnings"])


def test_cli_writes_table_json_and_plots(tmp_path, capsys):
    data = tmp_path / "agent.jsonl"
    write_jsonl(make_tool_dataset(120, seed=2), data)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args([str(data), "--out", str(tmp_path / "prof")])) == 0
    printed = capsys.readouterr().out
    assert "tool use when offered" in printed and "tool calls / trajectory" in printed
    p = json.loads((tmp_path / "prof" / "profile.json").read_text())
    assert p["rows"] == 120 and set(p["cooccurrence"]["tools"]) == {"search", "open_page", "calculator"}
    i, j = p["cooccurrence"]["tools"].index("search"), p["cooccurrence"]["tools"].index("open_page")
    assert p["cooccurrence"]["matrix"][i][j] == p["cooccurrence"]["matrix"][i][i]  # search always opens a page
    assert p["cooccurrence"]["matrix"][i][p["cooccurrence"]["tools"].index("calculator")] == 0
    for name in ("lengths.png", "tool_cooccurrence.png"):
        png = (tmp_path / "prof" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

"""Shared tool-execution helpers: schema-checked dispatch, error reasons, transcript replay, state."""

from __future__ import annotations

import json
import sqlite3

import pytest

from posttrain.envs.splits import split_of
from posttrain.envs.base import Task
from posttrain.envs.tools import (
    NEW_ID_BASE, TableSpec, ToolEpisode, ToolError, Toolbox, calls_message, diff_states, next_id,
    normalize_text, parse_turn, replay, select_tasks, snapshot,
)
from posttrain.models.chat_template import ToolCall, format_tool_call


class Notes:
    """A tiny state for the toolbox under test: one table of notes."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:")
        self.conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT, stars INTEGER)")
        self.conn.executemany("INSERT INTO notes VALUES (?, ?, ?)", [(1, "Buy milk", 1), (2, "Call Bob", 3)])

    def close(self) -> None:
        self.conn.close()


BOX = Toolbox("notes")


@BOX.tool("Add a note.", {"text": {"type": "string", "minLength": 1},
                          "stars": {"type": "integer", "minimum": 0, "maximum": 5}}, optional=("stars",))
def add_note(db: Notes, text: str, stars: int = 0):
    row_id = next_id(db.conn, "notes", "id")
    db.conn.execute("INSERT INTO notes VALUES (?, ?, ?)", [row_id, text, stars])
    return {"id": row_id}


@BOX.tool("Delete a note.", {"note_id": {"type": "integer"}})
def delete_note(db: Notes, note_id: int):
    if db.conn.execute("DELETE FROM notes WHERE id = ?", [note_id]).rowcount == 0:
        raise ToolError("not_found", f"no note {note_id}")
    return {"deleted": note_id}


@BOX.tool("Run broken SQL.", {})
def broken_sql(db: Notes):
    db.conn.execute("SELECT nope FROM notes")


@BOX.tool("Crash.", {})
def crash(db: Notes):
    raise KeyError("boom")


SPECS = (TableSpec("notes", "id", ("text", "stars"), text_columns=("text",)),)


def test_definitions_are_openai_function_format():
    defs = BOX.definitions()
    assert [d["function"]["name"] for d in defs] == sorted(["add_note", "delete_note", "broken_sql", "crash"])
    add = next(d for d in defs if d["function"]["name"] == "add_note")
    assert add["type"] == "function"
    assert add["function"]["parameters"]["required"] == ["text"]
    assert add["function"]["parameters"]["additionalProperties"] is False


@pytest.mark.parametrize(
    "call, reason",
    [
        (ToolCall("nope", {}), "unknown_tool"),
        (ToolCall("add_note", {}), "missing_argument"),
        (ToolCall("add_note", {"text": "x", "colour": "red"}), "unexpected_argument"),
        (ToolCall("add_note", {"text": "x", "stars": "three"}), "bad_argument_type"),
        (ToolCall("add_note", {"text": "x", "stars": 9}), "bad_argument_value"),
        (ToolCall("add_note", {"text": ""}), "bad_argument_value"),
        (ToolCall("delete_note", {"note_id": 77}), "not_found"),
        (ToolCall("broken_sql", {}), "sql_error"),
        (ToolCall("crash", {}), "internal_error"),
    ],
)
def test_every_failure_is_an_error_observation_with_a_reason(call, reason):
    db = Notes()
    result = BOX.execute(db, call)
    assert result.error == reason and not result.ok
    msg = result.message()
    assert msg["role"] == "tool" and json.loads(msg["content"])["error"] == reason


def test_scalar_for_string_parameter_is_turned_back_into_text():
    # The XML format parses "1234" as a number; a string parameter must still accept it.
    db = Notes()
    assert BOX.execute(db, ToolCall("add_note", {"text": 1234})).ok
    assert db.conn.execute("SELECT text FROM notes WHERE id = ?", [NEW_ID_BASE]).fetchone()[0] == "1234"
    assert BOX.execute(db, ToolCall("add_note", {"text": ["a"]})).error == "bad_argument_type"


def test_parse_turn_reads_openai_tool_calls_then_xml_content():
    openai = {"role": "assistant", "content": "ok", "tool_calls": [
        {"type": "function", "function": {"name": "add_note", "arguments": '{"text": "hi"}'}}]}
    turn = parse_turn(openai)
    assert [c.name for c in turn.calls] == ["add_note"] and turn.calls[0].arguments == {"text": "hi"}
    xml = {"role": "assistant",
           "content": "<think>plan</think>Sure.\n" + format_tool_call("delete_note", {"note_id": 2})}
    turn = parse_turn(xml)
    assert turn.calls == [ToolCall("delete_note", {"note_id": 2})] and turn.text == "Sure."
    plain = parse_turn({"role": "assistant", "content": "All done."})
    assert plain.calls == [] and plain.text == "All done." and plain.parse_error is None
    parts = parse_turn({"role": "assistant",
                        "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]})
    assert parts.text == "Hi there" and parse_turn({"role": "assistant", "content": None}).text == ""


@pytest.mark.parametrize(
    "message, reason",
    [
        ({"role": "assistant", "content": "<tool_call>\n<function=add_note>\n"}, "unbalanced_tool_call_tags"),
        ({"role": "assistant", "content": "<tool_call>add_note</tool_call>"}, "missing_function_tag"),
        ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": "{bad"}}]},
         "bad_arguments_json"),
        ({"role": "assistant", "content": "", "tool_calls": ["add_note"]}, "malformed_tool_calls"),
        ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": [1]}}]},
         "arguments_not_object"),
    ],
)
def test_parse_turn_never_raises(message, reason):
    turn = parse_turn(message)
    assert turn.calls == [] and turn.parse_error is not None and turn.parse_error.reason == reason


def test_replay_executes_assistant_calls_in_order_and_skips_unparseable_messages():
    db = Notes()
    transcript = [
        {"role": "user", "content": format_tool_call("delete_note", {"note_id": 1})},  # users cannot call tools
        calls_message([{"name": "delete_note", "arguments": {"note_id": 2}}]),
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": format_tool_call("add_note", {"text": "new"}) + "<tool_call>"},  # broken
        {"role": "assistant", "content": format_tool_call("delete_note", {"note_id": 2})},  # already gone
    ]
    stats = replay(BOX, db, transcript)
    assert [r[0] for r in db.conn.execute("SELECT id FROM notes")] == [1]
    assert stats.tool_calls == 2
    assert dict(stats.errors) == {"unbalanced_tool_call_tags": 1, "not_found": 1}


def test_normalize_text():
    assert normalize_text("  'Hello   World.' ") == "hello world"
    assert normalize_text('"Quoted"') == "quoted"
    assert normalize_text("a.b") == "a.b"
    assert normalize_text(5) == 5
    assert normalize_text("Hello") != normalize_text("Hello there")


def test_snapshot_new_rows_compare_without_ids_and_order():
    a, b = Notes(), Notes()
    for text in ("one", "two"):
        BOX.execute(a, ToolCall("add_note", {"text": text}))
    for text in ("Two.", "ONE"):  # other order, other case
        BOX.execute(b, ToolCall("add_note", {"text": text}))
    assert snapshot(a.conn, SPECS) == snapshot(b.conn, SPECS)
    assert diff_states(snapshot(a.conn, SPECS), snapshot(b.conn, SPECS)) == []


def test_diff_states_reports_changed_deleted_and_new_rows():
    base, other = Notes(), Notes()
    other.conn.execute("UPDATE notes SET stars = 5 WHERE id = 1")
    other.conn.execute("DELETE FROM notes WHERE id = 2")
    BOX.execute(other, ToolCall("add_note", {"text": "extra"}))
    (line,) = diff_states(snapshot(base.conn, SPECS), snapshot(other.conn, SPECS))
    assert "1 differ" in line and "1 wrongly deleted" in line and "1 unexpected new" in line


def test_ordered_tables_compare_as_sequences():
    spec = (TableSpec("notes", "id", ("text",), ordered=True),)
    a, b = Notes(), Notes()
    b.conn.execute("UPDATE notes SET text = CASE id WHEN 1 THEN 'Call Bob' ELSE 'Buy milk' END")
    assert diff_states(snapshot(a.conn, spec), snapshot(b.conn, spec))


def test_select_tasks_is_deterministic_and_its_splits_disjoint():
    def build(i: int) -> Task | None:
        return None if i % 7 == 0 else Task(id=f"t/{i}", domain="x", messages=[])

    train = select_tasks(300, "train", None, 0, lambda i: f"t/{i}", build)
    val = select_tasks(300, "dev", None, 0, lambda i: f"t/{i}", build)
    assert {t.id for t in train}.isdisjoint({t.id for t in val})
    test = select_tasks(300, "test", None, 0, lambda i: f"t/{i}", build)
    assert not {t.id for t in train + val} & {t.id for t in test}
    assert 10 < len(val) < 60 and len(train) + len(val) + len(test) == 300 - len(range(0, 300, 7))
    assert all(split_of(t.id) == "dev" for t in val)
    first = select_tasks(300, "train", 5, 3, lambda i: f"t/{i}", build)
    assert [t.id for t in first] == [t.id for t in select_tasks(300, "train", 5, 3, lambda i: f"t/{i}", build)]
    assert [t.id for t in first] != [t.id for t in select_tasks(300, "train", 5, 4, lambda i: f"t/{i}", build)]


def test_tool_episode_counts_turns_calls_and_errors():
    ep = ToolEpisode(Task(id="t", domain="x", messages=[]), BOX, Notes(), max_turns=2)
    obs = ep.execute(ep.begin_turn(calls_message([{"name": "add_note", "arguments": {"text": "a"}},
                                                  {"name": "nope", "arguments": {}}])))
    assert len(obs) == 2 and all(o["role"] == "tool" for o in obs)
    obs = ep.execute(ep.begin_turn({"role": "assistant", "content": "<tool_call>oops"}))
    assert json.loads(obs[0]["content"])["error"] == "unbalanced_tool_call_tags"
    assert ep.stats == {"turns": 2, "tool_calls": 2, "error:unknown_tool": 1, "error:unbalanced_tool_call_tags": 1}
    assert ep.out_of_turns
    ep.close()
    ep.close()  # safe twice


# --------------------------------------------------------------------------- issue 12, items 7 and 9

DEEP = "[" * 3000 + "]" * 3000  # ~500 tokens; the old parser raised RecursionError on it


def _xml(name, **raw_values):
    """An assistant message with one XML call whose parameter values are written verbatim."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in raw_values.items())
    return {"role": "assistant", "content": f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"}


def test_item9_xml_string_parameters_reach_the_tool_as_the_exact_text():
    db = Notes()
    values = ["3.10", "2022", "1e5", "[1, 2]", "null", "a</parameter>\n<parameter=stars>\n5", "x</tool_call>y"]
    transcript = [{"role": "assistant", "content": format_tool_call("add_note", {"text": v})} for v in values]
    stats = replay(BOX, db, transcript)
    assert stats.n_errors == 0 and stats.tool_calls == len(values)
    rows = db.conn.execute("SELECT text, stars FROM notes WHERE id >= ? ORDER BY id", [NEW_ID_BASE]).fetchall()
    assert rows == [(v, 0) for v in values]  # old: 3.1, "2022" via int, 100000.0, bad type, injected stars
    # the live episode reads the same way
    ep = ToolEpisode(Task(id="t", domain="x", messages=[]), BOX, Notes(), max_turns=5)
    assert ep.execute(ep.begin_turn(_xml("add_note", text="3.10", stars="2")))[0]["content"] == '{"id": 100000}'
    assert ep.state.conn.execute("SELECT text, stars FROM notes WHERE id = ?", [NEW_ID_BASE]).fetchone() == ("3.10", 2)
    ep.close()


@pytest.mark.parametrize("message, reason", [
    (_xml("delete_note", note_id=DEEP), "argument_too_deep"),
    (_xml("delete_note", note_id="9" * 5000), "argument_number_too_long"),
    ({"role": "assistant", "content": "<tool_call>\n<function=add_note>\n" + "<parameter=text>\nx\n" * 10_000
      + "</function>\n</tool_call>"}, "unclosed_parameter"),  # item 8: was ~38 s, now linear
    ({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "add_note", "arguments": '{"text": ' + DEEP + "}"}}]}, "argument_too_deep"),
    ({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "delete_note", "arguments": '{"note_id": ' + "9" * 5000 + "}"}}]},
     "argument_number_too_long"),
])
def test_item7_hostile_arguments_are_counted_errors_not_crashes(message, reason):
    turn = parse_turn(message, BOX.definitions())
    assert turn.calls == [] and turn.parse_error is not None and turn.parse_error.reason == reason
    db = Notes()
    assert dict(replay(BOX, db, [message]).errors) == {reason: 1}
    ep = ToolEpisode(Task(id="t", domain="x", messages=[]), BOX, db, max_turns=5)
    obs = ep.execute(ep.begin_turn(message))
    assert json.loads(obs[0]["content"])["error"] == reason and ep.stats[f"error:{reason}"] == 1
    ep.close()


def test_item7_workplace_step_and_verify_give_zero_with_the_reason():
    from posttrain.envs.workplace.env import WorkplaceEnv

    env = WorkplaceEnv()
    task = env.tasks("dev", n=1)[0]
    for message in (_xml("email_get", email_id=DEEP),
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"function": {"name": "email_get", "arguments": '{"email_id": ' + DEEP + "}"}}]}):
        episode = env.start_episode(task)
        step = episode.step(message)
        assert json.loads(step.observations[0]["content"])["error"] == "argument_too_deep"
        assert episode.stats["error:argument_too_deep"] == 1
        episode.close()
        result = env.verify(task, [message, {"role": "assistant", "content": "Done."}])
        assert result.reward == 0.0 and "argument_too_deep" in result.reason

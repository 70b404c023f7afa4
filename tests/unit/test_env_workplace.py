"""Workplace environment: world invariants, tools, reference solutions, wrong solutions, episodes."""

from __future__ import annotations

import datetime as dt
import json

import jsonschema
import pytest

from posttrain.envs.base import ENVIRONMENTS, Task, make_env
from posttrain.envs.tools import NEW_ID_BASE, calls_message
from posttrain.envs.workplace.data import build_db, generate_world
from posttrain.envs.workplace.env import WorkplaceEnv, answer_matches, extract_answer
from posttrain.envs.workplace.tasks import TEMPLATES
from posttrain.envs.workplace.tools import TOOLBOX
from posttrain.models.chat_template import ToolCall, format_tool_call

ENV = WorkplaceEnv()
N_TEMPLATES = len(TEMPLATES)


def task_of(template: str, world: int = 0) -> Task:
    task = ENV.task_at(world * N_TEMPLATES + list(TEMPLATES).index(template))
    assert task is not None
    return task


def solved(task: Task, calls: list[dict] | None = None, final: str | None = None) -> list[dict]:
    """A transcript that makes ``calls`` (default: the reference) and then replies ``final``."""
    calls = task.ground_truth["reference_calls"] if calls is None else calls
    msgs = [calls_message(calls)] if calls else []
    if final is None:
        answer = task.ground_truth["answer"]
        final = "Done." if answer is None else f"I checked.\nAnswer: {answer}"
    return msgs + [{"role": "assistant", "content": final}]


# --------------------------------------------------------------------------- world and tools


def test_registered_and_tool_domain():
    assert "workplace" in ENVIRONMENTS
    env = make_env("workplace")
    assert env.domain == "tool_use" and env.multi_turn


def test_world_is_deterministic_and_keeps_its_invariants():
    w = generate_world(3)
    assert w == generate_world.__wrapped__(3)  # same rows when drawn again without the cache
    assert w.today.weekday() == 0
    assert len({e["sent_at"] for e in w.emails}) == len(w.emails)
    assert len({c["revenue"] for c in w.customers}) == len(w.customers)
    assert max(len(w.emails), len(w.events), len(w.tasks), len(w.customers)) < NEW_ID_BASE
    assert generate_world(4).employees != w.employees


def test_at_least_twenty_tools_with_valid_schemas():
    defs = TOOLBOX.definitions()
    assert len(defs) >= 20
    for d in defs:
        assert d["type"] == "function" and d["function"]["description"]
        jsonschema.Draft202012Validator.check_schema(d["function"]["parameters"])
    prefixes = {d["function"]["name"].split("_")[0] for d in defs}
    assert {"email", "calendar", "crm", "project", "analytics", "directory"} <= prefixes


def test_read_tools_answer_from_the_data():
    db = build_db(0)
    w = db.world
    me = w.user["email"]
    people = TOOLBOX.execute(db, ToolCall("directory_search", {"name": w.employees[3]["name"].split()[1]}))
    assert w.employees[3]["email"] in [p["email"] for p in people.output]
    latest = TOOLBOX.execute(db, ToolCall("email_search", {"recipient": me, "limit": 1})).output[0]
    assert latest["sent_at"] == max(m["sent_at"] for m in w.emails if m["recipient"] == me)
    north = TOOLBOX.execute(db, ToolCall("crm_search_customers", {"region": "North", "sort_by": "revenue_desc"}))
    assert north.output[0]["revenue"] == max(c["revenue"] for c in w.customers if c["region"] == "North")
    last_week = (w.today - dt.timedelta(days=7)).isoformat(), (w.today - dt.timedelta(days=1)).isoformat()
    total = TOOLBOX.execute(db, ToolCall("analytics_get_metric", {"metric": "signups", "start_date": last_week[0],
                                                                  "end_date": last_week[1], "aggregate": "sum"}))
    assert total.output["days"] == 7
    assert total.output["value"] == sum(m["value"] for m in w.metrics
                                        if m["metric"] == "signups" and last_week[0] <= m["date"] <= last_week[1])
    slots = TOOLBOX.execute(db, ToolCall("calendar_find_free_slots", {"date": w.today.isoformat(),
                                                                      "duration_minutes": 60})).output
    busy = [e for e in w.events if e["start"].startswith(w.today.isoformat())]
    assert all(s not in {e["start"] for e in busy} for s in slots)


def test_tool_level_errors():
    db = build_db(0)
    assert TOOLBOX.execute(db, ToolCall("calendar_update_event", {"event_id": 1})).error == "nothing_to_update"
    assert TOOLBOX.execute(db, ToolCall("email_get", {"email_id": 5000})).error == "not_found"
    bad_time = ToolCall("calendar_create_event", {"title": "x", "start": "2024-02-30 25:00", "duration_minutes": 30,
                                                  "attendees": []})
    assert TOOLBOX.execute(db, bad_time).error == "bad_argument_value"
    assert TOOLBOX.execute(db, ToolCall("project_update_task", {"task_id": 1, "status": "finished"})).error \
        == "bad_argument_value"


# --------------------------------------------------------------------------- tasks and verification


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_reference_solution_gets_reward_one(template):
    for world in (0, 1):
        task = task_of(template, world)
        result = ENV.verify(task, solved(task))
        assert result.reward == 1.0, (task.id, result.reason)
        assert json.loads(json.dumps(task.to_dict())) == task.to_dict()  # plain JSON


@pytest.mark.parametrize("template", [t for t in TEMPLATES if not t.startswith("question")])
def test_doing_nothing_gets_reward_zero(template):
    task = task_of(template)
    result = ENV.verify(task, solved(task, calls=[]))
    assert result.reward == 0.0 and "state differs" in result.reason


def test_partial_and_extra_work_get_reward_zero():
    task = next(t for t in (task_of("project_complete_tasks", w) for w in range(10))
                if len(t.ground_truth["reference_calls"]) > 1)
    calls = task.ground_truth["reference_calls"]
    assert ENV.verify(task, solved(task, calls[:-1])).reward == 0.0
    extra = calls + [{"name": "email_delete", "arguments": {"email_id": 1}}]
    assert ENV.verify(task, solved(task, extra)).reward == 0.0
    wrong_target = [{**c, "arguments": {**c["arguments"], "status": "in_progress"}} for c in calls]
    assert ENV.verify(task, solved(task, wrong_target)).reward == 0.0


def test_free_text_compares_loosely_but_not_too_loosely():
    task = task_of("email_send")
    (ref,) = task.ground_truth["reference_calls"]
    args = ref["arguments"]
    loose = {**args, "subject": f"  '{args['subject'].upper()}' ", "body": args["body"].replace(" ", "  ") + "\n"}
    assert ENV.verify(task, solved(task, [{"name": "email_send", "arguments": loose}])).reward == 1.0
    wrong = {**args, "body": args["body"] + " Thanks"}
    assert ENV.verify(task, solved(task, [{"name": "email_send", "arguments": wrong}])).reward == 0.0


def test_created_rows_match_in_any_order_and_attendees_are_normalized():
    task = task_of("calendar_create")
    (ref,) = task.ground_truth["reference_calls"]
    args = ref["arguments"]
    me = generate_world(0).user["email"]
    shuffled = {**args, "attendees": [a.upper() for a in reversed(args["attendees"])] + [me]}
    assert ENV.verify(task, solved(task, [{"name": "calendar_create_event", "arguments": shuffled}])).reward == 1.0


def test_question_tasks_need_the_answer_and_an_untouched_state():
    task = task_of("question_metric")
    answer = task.ground_truth["answer"]
    assert ENV.verify(task, solved(task, final=f"**Answer: {int(answer):,}**")).reward == 1.0
    assert ENV.verify(task, solved(task, final=f"Answer: {int(answer) + 1}")).reward == 0.0
    assert ENV.verify(task, solved(task, final=f"The value is {answer}.")).reward == 0.0
    meddling = [{"name": "email_delete", "arguments": {"email_id": 1}}]
    result = ENV.verify(task, solved(task, meddling, final=f"Answer: {answer}"))
    assert result.reward == 0.0 and result.components["answer_match"] == 1.0


def test_xml_transcript_in_content_is_replayed_like_openai_tool_calls():
    task = task_of("crm_reassign_region")
    xml = "\n".join(format_tool_call(c["name"], c["arguments"]) for c in task.ground_truth["reference_calls"])
    transcript = [{"role": "assistant", "content": f"<think>reassign</think>\n{xml}"},
                  {"role": "assistant", "content": "Done."}]
    assert ENV.verify(task, transcript).reward == 1.0


def test_garbage_transcripts_get_zero_without_raising():
    task = task_of("calendar_cancel")
    for transcript in ([], [{"role": "assistant", "content": None}],
                       [{"role": "assistant", "content": "<tool_call><function=calendar_delete_event>"}],
                       [{"role": "assistant",
                         "content": format_tool_call("calendar_delete_event", {"event_id": "x"})}],
                       [{"role": "assistant", "content": format_tool_call("drop_database", {})}]):
        result = ENV.verify(task, transcript)
        assert result.reward == 0.0


def test_stale_task_is_refused():
    task = task_of("email_send")
    stale = Task.from_dict({**task.to_dict(), "ground_truth": {**task.ground_truth, "state_hash": "0" * 16}})
    with pytest.raises(ValueError, match="stale"):
        ENV.verify(stale, solved(task))


def test_extract_answer_and_answer_matches():
    assert extract_answer("blah\nAnswer: 42\nmore") == "42"
    assert extract_answer("answer: 1\nFinal Answer: **7**") == "7"
    assert extract_answer("no answer here") is None
    assert answer_matches("1234", "1,234") and answer_matches("5.5", "$5.50")
    assert not answer_matches("12", "13") and not answer_matches("12", None) and not answer_matches("12", "twelve")
    assert answer_matches("Blue River Labs", "blue river labs.") and not answer_matches("Blue River Labs", "Blue")


# --------------------------------------------------------------------------- task lists


def test_tasks_are_deterministic_split_disjoint_and_cover_templates():
    a = ENV.tasks("train", n=30, seed=1)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in WorkplaceEnv().tasks("train", n=30, seed=1)]
    assert [t.id for t in a] != [t.id for t in ENV.tasks("train", n=30, seed=2)]
    small = WorkplaceEnv(n_worlds=4)
    train, val, test = small.tasks("train"), small.tasks("dev"), small.tasks("test")
    assert {t.id for t in train}.isdisjoint({t.id for t in val}) and val and test
    assert not {t.id for t in train + val} & {t.id for t in test}
    assert len(train) + len(val) + len(test) == 4 * N_TEMPLATES  # every template has an instance in every world
    t = a[0]
    assert t.messages[0]["role"] == "system" and t.messages[1]["role"] == "user" and t.tools == TOOLBOX.definitions()


# --------------------------------------------------------------------------- episodes


def test_episode_with_scripted_assistant_one_call_per_turn_in_xml():
    task = task_of("calendar_cancel_next_week", world=1)
    ep = ENV.start_episode(task)
    transcript = []
    for c in task.ground_truth["reference_calls"]:
        msg = {"role": "assistant", "content": format_tool_call(c["name"], c["arguments"])}
        step = ep.step(msg)
        assert not step.done and [o["role"] for o in step.observations] == ["tool"]
        assert "error" not in json.loads(step.observations[0]["content"])
        transcript += [msg, *step.observations]
    final = {"role": "assistant", "content": "All cancelled."}
    step = ep.step(final)
    assert step.done and step.observations == [] and step.info["reason"] == "final_reply"
    assert ep.stats == {"turns": len(task.ground_truth["reference_calls"]) + 1,
                        "tool_calls": len(task.ground_truth["reference_calls"])}
    assert ENV.verify(task, transcript + [final]).reward == 1.0
    with pytest.raises(RuntimeError):
        ep.step(final)
    ep.close()


def test_episode_mistakes_are_observations_and_counted():
    task = task_of("email_send")
    ep = ENV.start_episode(task)
    steps = [
        {"role": "assistant", "content": "<tool_call>\n<function=email_send>\n"},  # unbalanced
        {"role": "assistant", "content": format_tool_call("email_teleport", {})},
        calls_message([{"name": "email_send", "arguments": {"recipient": "a@b.com"}}]),
        calls_message([{"name": "email_send", "arguments": {"recipient": "a@b.com", "subject": "s", "body": "b",
                                                            "cc": "c@d.com"}}]),
        calls_message([{"name": "email_get", "arguments": {"email_id": "seven"}}]),
    ]
    for msg in steps:
        step = ep.step(msg)
        assert not step.done and json.loads(step.observations[0]["content"])["error"]
    assert ep.stats["turns"] == 5
    for reason in ("unbalanced_tool_call_tags", "unknown_tool", "missing_argument", "unexpected_argument",
                   "bad_argument_type"):
        assert ep.stats[f"error:{reason}"] == 1
    ep.close()


def test_episode_stops_at_max_turns():
    task = task_of("question_open_tasks")
    ep = WorkplaceEnv(max_turns=2).start_episode(task)
    look = calls_message([{"name": "project_list_projects", "arguments": {}}])
    assert not ep.step(look).done
    step = ep.step(look)
    assert step.done and step.info["reason"] == "max_turns"

"""The environment resource server over real HTTP on 127.0.0.1, and its client.

Two small environments are defined here (test stand-ins, so the contract is tested on its own):
``AddEnv`` (single-turn: "What is a + b?") and ``CounterEnv`` (multi-turn tool use: ``add`` and
``total`` tools over a running sum, verified by replaying the transcript's calls). Each is served
by uvicorn in a background thread on a free port for the module and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket

import httpx
import pytest

from posttrain.envs.base import Environment, Episode, StepResult, Task, VerifyResult, final_answer_text
import posttrain.serving.server as server_module
from posttrain.serving.remote import RemoteEnvironment, build_verify_body, make_remote
from posttrain.serving.server import (
    MAX_BODY_BYTES,
    MAX_TASKS_PER_REQUEST,
    SESSION_HEADER,
    conversation_after_prompt,
    create_app,
    items_to_messages,
    messages_to_items,
    running_server,
    task_to_row,
)
from posttrain.commands import serve_env as serve_env_command
from posttrain.commands.serve_env import LIMIT_FLAGS, add_arguments, limits_of, parse_env_args
from posttrain.models.chat_template import ToolCallParseError, _arguments_of, parse_assistant
from posttrain.engines.openai_compat import RemoteCallError

# --------------------------------------------------------------------------- stand-in environments

ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)\s*$")


class AddEnv(Environment):
    name = "test_add"
    domain = "math"

    def tasks(self, split="train", n=None, seed=0):
        offset = {"train": 0, "dev": 10_000, "test": 20_000}[split]  # disjoint id ranges per split
        out = []
        for i in range(n if n is not None else 20):
            a, b = (seed * 31 + i * 7) % 50, (seed * 17 + i * 3) % 40
            prompt = f"What is {a} + {b}? Put your final answer after 'Answer:'."
            out.append(Task(f"add-{offset + seed * 1000 + i}", "math", [{"role": "user", "content": prompt}], a + b))
        return out

    def verify(self, task, messages):
        if task.ground_truth == "boom":
            raise ValueError("ground truth is not a number")
        if task.ground_truth == "surrogate":  # an answer that cannot be encoded as UTF-8
            return VerifyResult(0.0, {}, "reason with a lone surrogate \ud800")
        m = ANSWER_RE.search(final_answer_text(messages))
        if m is None:
            return VerifyResult(0.0, {"correct": 0.0}, "no_answer")
        ok = int(m.group(1)) == task.ground_truth
        return VerifyResult(float(ok), {"correct": float(ok)}, "correct" if ok else "wrong")


COUNTER_TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add to the total",
                                      "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "total", "description": "Read the total",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def _calls(message):
    if message.get("tool_calls"):
        return [(c.get("function", c)["name"], _arguments_of(c)) for c in message["tool_calls"]]
    return [(c.name, c.arguments) for c in parse_assistant(message.get("content") or "").tool_calls]


def _run_call(state, name, args):
    if name == "add" and isinstance(args.get("amount"), int):
        state["total"] += args["amount"]
        return {"total": state["total"]}, None
    if name == "total":
        return {"total": state["total"]}, None
    return {"error": "bad_call"}, "bad_call"


class CounterEpisode(Episode):
    def __init__(self, task):
        super().__init__(task)
        self.state = {"total": 0}

    def step(self, assistant_message):
        try:
            calls = _calls(assistant_message)
        except ToolCallParseError as e:
            self.count(e.reason)
            return StepResult([{"role": "tool", "content": json.dumps({"error": e.reason})}], False)
        if not calls:
            return StepResult([], True)
        obs = []
        for name, args in calls:
            out, err = _run_call(self.state, name, args)
            if err:
                self.count(err)
            obs.append({"role": "tool", "name": name, "content": json.dumps(out)})
        return StepResult(obs, False, {"total": self.state["total"]})


class CounterEnv(Environment):
    name = "test_counter"
    domain = "tools"
    multi_turn = True

    def tasks(self, split="train", n=None, seed=0):
        base = 0 if split == "train" else 500
        return [
            Task(f"counter-{base + i}", "tools",
                 [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": f"Make the total {base + i + 1}."}],
                 ground_truth=base + i + 1, tools=COUNTER_TOOLS)
            for i in range(n if n is not None else 5)
        ]

    def verify(self, task, messages):
        state = {"total": 0}
        for m in messages:
            if m.get("role") == "assistant":
                try:
                    for name, args in _calls(m):
                        _run_call(state, name, args)
                except ToolCallParseError:
                    pass
        ok = state["total"] == task.ground_truth
        return VerifyResult(float(ok), {"state_match": float(ok)}, "state_match" if ok else "state_mismatch")

    def start_episode(self, task):
        return CounterEpisode(task)


@pytest.fixture(scope="module")
def add_server():
    env = AddEnv()
    with running_server(create_app(env)) as url:
        yield env, url


@pytest.fixture(scope="module")
def counter_server():
    env = CounterEnv()
    with running_server(create_app(env)) as url:
        yield env, url


_HTTP = httpx.Client(timeout=30)  # one client: building one per request costs ~50 ms (SSL context)


def post(url, **kwargs):
    """A cookie-less POST (the shared client must not carry one test's session cookie to another)."""
    try:
        return _HTTP.post(url, **kwargs)
    finally:
        _HTTP.cookies.clear()


def get(url, **kwargs):
    return _HTTP.get(url, **kwargs)


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


# --------------------------------------------------------------------------- conversion (pure)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Make it 5."},
    {"role": "assistant", "content": "", "reasoning_content": "two calls",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"amount": 2}}},
                    {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"amount": 3}}}]},
    {"role": "tool", "content": '{"total": 2}', "tool_call_id": "c1", "name": "add"},
    {"role": "tool", "content": '{"total": 5}', "tool_call_id": "c2", "name": "add"},
    {"role": "assistant", "content": "Done: 5."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "<think>\nok\n</think>\nYou're welcome."},
]


def test_messages_items_round_trip():
    items = messages_to_items(CONVERSATION)
    assert [i["type"] for i in items] == [
        "message", "message", "reasoning", "function_call", "function_call",
        "function_call_output", "function_call_output", "message", "message", "message",
    ]
    assert items[3] == {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"amount": 2}'}
    assert items[7]["content"] == [{"type": "output_text", "text": "Done: 5.", "annotations": []}]
    assert items_to_messages(items) == CONVERSATION


def test_items_to_messages_reads_responses_api_shapes():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},  # EasyInputMessage
        {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "x", "annotations": []}]},
        {"type": "function_call", "call_id": "k", "name": "f", "arguments": "{not json", "id": "fc1"},
        {"type": "function_call_output", "call_id": "k", "output": {"ok": True}},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "z"}]},
    ]
    assert items_to_messages(items) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x", "reasoning_content": "ab",
         "tool_calls": [{"id": "k", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "tool", "content": '{"ok": true}', "tool_call_id": "k", "name": "f"},
        {"role": "assistant", "content": "y"},
        {"role": "assistant", "content": "z"},
    ]


@pytest.mark.parametrize(
    "items, match",
    [
        (["text"], "item 0: expected an object"),
        ([{"type": "image"}], "unsupported item type 'image'"),
        ([{"type": "function_call", "call_id": "a", "arguments": "{}"}], "needs a string 'name'"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "needs a string 'call_id'"),
        ([{"type": "function_call", "name": "f", "call_id": "a", "arguments": 5}], "arguments: expected a JSON string"),
        ([{"type": "message", "role": "robot", "content": "x"}], "unknown message role 'robot'"),
        ([{"type": "message", "role": "user", "content": [{"type": "input_image"}]}], "content\\[0\\]"),
        ([{"type": "function_call_output", "output": "x"}], "needs a string 'call_id'"),
    ],
)
def test_items_to_messages_rejects_malformed_items(items, match):
    with pytest.raises(ValueError, match=match):
        items_to_messages(items)


def test_verify_body_splits_at_the_models_part():
    task = CounterEnv().tasks("train", 1)[0]
    after = CONVERSATION[1:]  # task prompt is system + user; drop our system, keep the rest
    after = after[1:]
    body = build_verify_body(task, after)
    # input = prompt + the conversation up to the last user message; output = the reply to it
    assert items_to_messages(body["response"]["output"]) == [CONVERSATION[-1]]
    assert body["responses_create_params"]["metadata"] == {"task_id": task.id}
    assert body["responses_create_params"]["tools"][0]["name"] == "add"
    got = conversation_after_prompt(task, body["responses_create_params"]["input"], body["response"]["output"])
    assert got == after


def test_task_rows_and_env_args():
    task = CounterEnv().tasks("train", 1)[0]
    row = task_to_row(task)
    assert row["task"] == task.to_dict()
    assert items_to_messages(row["responses_create_params"]["input"]) == task.messages
    assert parse_env_args(["n=5", "name=x", "flags=[1, 2]", "s=\"7\""]) == {"n": 5, "name": "x", "flags": [1, 2], "s": "7"}
    with pytest.raises(ValueError, match="expected key=value"):
        parse_env_args(["oops"])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["math", "--port", "9001", "--env-arg", "k=1"])
    assert (args.name, args.host, args.port, args.env_arg) == ("math", "127.0.0.1", 9001, ["k=1"])


# --------------------------------------------------------------------------- single-turn over HTTP


def answers_for(task):
    gt = task.ground_truth
    return [
        f"Answer: {gt}",
        f"<think>\nadd them\n</think>\nAnswer: {gt}",
        f"Answer: {gt + 1}",
        "I don't know",
        "",
        f"<think>\nAnswer: {gt}",  # truncated inside reasoning: nothing to grade
    ]


def test_remote_matches_in_process(add_server):
    env, url = add_server
    remote = make_remote(url)
    assert (remote.name, remote.domain, remote.multi_turn) == ("test_add", "math", False)
    tasks = remote.tasks("dev", n=4, seed=2)
    assert tasks == env.tasks("dev", n=4, seed=2)
    assert not {t.id for t in tasks} & {t.id for t in remote.tasks("train", n=4, seed=2)}
    rewards = []
    for task in tasks:
        for text in answers_for(task):
            messages = [{"role": "assistant", "content": text}]
            expected = env.verify(task, messages)
            assert remote.verify(task, messages) == expected
            rewards.append(expected.reward)
    assert 0 < sum(rewards) < len(rewards)  # both correct and wrong answers were graded
    with pytest.raises(TypeError, match="single-turn"):
        remote.start_episode(tasks[0])
    remote.close()


def test_verify_echoes_the_body_with_reward(add_server):
    env, url = add_server
    task = env.tasks("train", 1)[0]
    body = build_verify_body(task, [{"role": "assistant", "content": f"Answer: {task.ground_truth}"}])
    body["extra_row_field"] = {"kept": True}  # NeMo Gym rows carry their own fields through verify
    out = post(f"{url}/verify", json=body).json()
    assert (out["reward"], out["reward_components"], out["reason"]) == (1.0, {"correct": 1.0}, "correct")
    assert out["extra_row_field"] == {"kept": True} and out["response"] == body["response"]
    # A task the server handed out can be named by id instead of sent whole.
    get(f"{url}/tasks", params={"n": 1})
    del body["task"]
    assert post(f"{url}/verify", json=body).json()["reward"] == 1.0


def test_fifty_concurrent_verify_requests(add_server):
    env, url = add_server
    tasks = env.tasks("train", 50, seed=5)
    bodies = [
        build_verify_body(t, [{"role": "assistant", "content": f"Answer: {t.ground_truth + (i % 2)}"}])
        for i, t in enumerate(tasks)
    ]

    async def go():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(client.post(f"{url}/verify", json=b) for b in bodies))

    responses = asyncio.run(go())
    assert [r.status_code for r in responses] == [200] * 50
    assert [r.json()["reward"] for r in responses] == [float(i % 2 == 0) for i in range(50)]


def test_malformed_requests_get_4xx(add_server, counter_server):
    _, url = add_server
    _, curl = counter_server
    task = AddEnv().tasks("train", 1)[0].to_dict()
    good = build_verify_body(Task.from_dict(task), [{"role": "assistant", "content": "Answer: 1"}])
    bad_bodies = [
        {},
        {"responses_create_params": {}, "task": task},  # no response
        {**good, "response": {"output": "text"}},
        {**good, "response": {"output": [{"type": "image"}]}},
        {**good, "response": {"output": [{"type": "function_call", "arguments": "{}", "call_id": "x"}]}},
        {**good, "task": {**task, "surprise": 1}},
        {**good, "task": {"id": "x"}},
        {k: v for k, v in good.items() if k != "task"} | {"task_id": "never-served"},
        {k: v for k, v in good.items() if k != "task"} | {"responses_create_params": {"input": []}},
    ]
    for body in bad_bodies:
        r = post(f"{url}/verify", json=body)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        assert "detail" in r.json()
    r = post(f"{url}/verify", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    for params in ({"split": "holdout"}, {"n": -1}, {"seed": "x"}, {"format": "csv"}):
        assert get(f"{url}/tasks", params=params).status_code == 422
    old_split = get(f"{url}/tasks", params={"split": "validation"})  # now dev or test (envs/splits.py)
    assert old_split.status_code == 422 and "'dev'" in old_split.json()["detail"], old_split.text
    assert post(f"{url}/step", json={"resources_session_id": "nope", "message": {"role": "assistant"}}).status_code == 404
    assert post(f"{url}/step", json={"message": {}}).status_code == 422
    assert post(f"{url}/add", json={"amount": 1}).status_code == 400  # no session
    assert post(f"{curl}/seed_session", json={}).status_code == 422  # a tool env needs a task
    sid = post(f"{curl}/seed_session", json={"task": CounterEnv().tasks("train", 1)[0].to_dict()}).json()["resources_session_id"]
    assert post(f"{curl}/step", json={"resources_session_id": sid, "message": {"role": "user"}}).status_code == 422
    assert post(f"{curl}/add", json=[1], headers={SESSION_HEADER: sid}).status_code == 422


def test_environment_crash_is_a_500_with_a_message(add_server):
    _, url = add_server
    task = Task("boom-1", "math", [{"role": "user", "content": "?"}], ground_truth="boom")
    r = post(f"{url}/verify", json=build_verify_body(task, [{"role": "assistant", "content": "Answer: 1"}]))
    assert r.status_code == 500
    assert r.json() == {"detail": "Environment.verify failed: ValueError: ground truth is not a number"}


def test_single_turn_seed_session_is_accepted_like_nemo_gym(add_server):
    env, url = add_server
    row = task_to_row(env.tasks("train", 1)[0])
    with httpx.Client() as client:
        r = client.post(f"{url}/seed_session", json=row)
        assert r.status_code == 200 and r.json() == {"resources_session_id": r.json()["resources_session_id"]}
        assert client.post(f"{url}/add", json={"amount": 1}).status_code == 400  # no episode to run tools in


def test_unreachable_server_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(RemoteCallError, match=rf"GET {url}/health failed after 2 attempts"):
            RemoteEnvironment(url, max_retries=1, backoff_s=0.0)


# --------------------------------------------------------------------------- tool sessions over HTTP


def test_remote_episode_matches_in_process(counter_server):
    env, url = counter_server
    remote = make_remote(url)
    assert remote.multi_turn
    task = remote.tasks("test", 2)[1]
    assert task == env.tasks("test", 2)[1]
    turns = [
        {"role": "assistant", "content": "", "tool_calls": [call("add", amount=500), call("add", amount=2)]},
        {"role": "assistant", "content": "<tool_call>\n<function=total>\n</function>\n</tool_call>"},
        {"role": "assistant", "content": "<tool_call>\n<function=add>"},  # malformed: counted, not raised
        {"role": "assistant", "content": "", "tool_calls": [call("add", amount="lots")]},
        {"role": "assistant", "content": "The total is 502."},
    ]
    local_ep, remote_ep = env.start_episode(task), remote.start_episode(task)
    transcript = []
    for turn in turns:
        expected, got = local_ep.step(turn), remote_ep.step(turn)
        assert got == expected
        transcript += [turn, *got.observations]
    assert got.done and remote_ep.stats == local_ep.stats == {"unbalanced_tool_call_tags": 1, "bad_call": 1}
    assert remote.verify(task, transcript) == env.verify(task, transcript)
    assert remote.verify(task, transcript).reward == 1.0
    assert remote.verify(task, transcript[2:]).reward == 0.0  # without the first adds
    remote_ep.close()
    remote_ep.close()  # safe twice
    with pytest.raises(RemoteCallError, match="HTTP 404"):
        remote_ep.step(turns[0])


def test_nemo_gym_style_tool_calls_with_session_cookie(counter_server):
    env, url = counter_server
    row = task_to_row(env.tasks("train", 1)[0])
    with httpx.Client(base_url=url) as client:  # keeps the session cookie, as a NeMo Gym agent does
        seeded = client.post("/seed_session", json=row).json()
        assert set(seeded) == {"resources_session_id"}  # exactly NeMo Gym's ResourcesSeedSessionResponse
        assert [t["name"] for t in row["responses_create_params"]["tools"]] == ["add", "total"]
        # The body is what NeMo Gym feeds the model: the tool observation itself (issue 18, item 6).
        assert client.post("/add", json={"amount": 4}).text == '{"total": 4}'
        out = client.post("/total", json={})
        assert (out.text, out.headers["X-Episode-Done"]) == ('{"total": 4}', "false")
        assert client.post("/nope", json={}).text == '{"error": "bad_call"}'
        closed = client.post("/close_session", json={"resources_session_id": seeded["resources_session_id"]}).json()
        assert closed == {"resources_session_id": seeded["resources_session_id"]}
        assert client.post("/total", json={}).status_code == 404
        assert client.get("/health").json()["sessions"] >= 0


def test_sessions_are_isolated(counter_server):
    env, url = counter_server
    task = env.tasks("train", 1)[0]
    a = post(f"{url}/seed_session", json={"task": task.to_dict(), "resources_session_id": "a-1"}).json()
    b = post(f"{url}/seed_session", json={"task": task.to_dict()}).json()
    assert a["resources_session_id"] == "a-1" and b["resources_session_id"] != "a-1"
    post(f"{url}/add", json={"amount": 3}, headers={SESSION_HEADER: "a-1"})
    assert post(f"{url}/total", json={}, headers={SESSION_HEADER: b["resources_session_id"]}).text == '{"total": 0}'
    assert post(f"{url}/total", json={}, headers={SESSION_HEADER: "a-1"}).text == '{"total": 3}'


# --------------------------------------------------------------------------- the real workplace env


@pytest.fixture(scope="module")
def workplace_server():
    import posttrain.envs.workplace  # noqa: F401  (registers "workplace" even before envs/__init__ lists it)
    from posttrain.envs.base import make_env

    env = make_env("workplace")
    with running_server(create_app(env)) as url:
        yield env, url


def test_workplace_session_round_trip(workplace_server):
    from posttrain.envs.tools import calls_message

    env, url = workplace_server
    remote = make_remote(url)
    assert (remote.name, remote.multi_turn) == ("workplace", True)
    tasks = remote.tasks("dev", n=3)
    assert tasks == env.tasks("dev", n=3)
    task = next(t for t in tasks if t.ground_truth["reference_calls"])
    final = "Done." + (f" Answer: {task.ground_truth['answer']}" if task.ground_truth.get("answer") else "")
    good = [calls_message(task.ground_truth["reference_calls"]), {"role": "assistant", "content": final}]
    bad = [calls_message([{"name": "no_such_tool", "arguments": {}}]), {"role": "assistant", "content": "Done."}]
    for turns, reward in ((good, 1.0), (bad, 0.0)):
        local_ep, remote_ep = env.start_episode(task), remote.start_episode(task)
        transcript = []
        for turn in turns:
            expected, got = local_ep.step(turn), remote_ep.step(turn)
            assert got == expected
            transcript += [turn, *got.observations]
        assert got.done and remote_ep.stats == local_ep.stats
        local_ep.close()
        remote_ep.close()
        expected = env.verify(task, transcript)
        assert remote.verify(task, transcript) == expected and expected.reward == reward
    assert local_ep.stats.get("error:unknown_tool") == 1

    # The same first call through NeMo Gym's per-tool endpoint, session in a cookie.
    first = task.ground_truth["reference_calls"][0]
    local_ep = env.start_episode(task)
    local_obs = local_ep.step(calls_message([first])).observations[0]["content"]
    local_ep.close()
    with httpx.Client(base_url=url) as client:
        client.post("/seed_session", json=task_to_row(task)).raise_for_status()
        assert client.post(f"/{first['name']}", json=first["arguments"]).text == local_obs


@pytest.mark.parametrize("arguments", ['{"q": ' + "[" * 3000 + "]" * 3000 + "}", '{"q": ' + "9" * 5000 + "}"])
def test_hostile_function_call_arguments_stay_raw_for_the_env_to_count(arguments):
    # issue 12, item 7: json.loads raised RecursionError / ValueError out of the request here
    items = [{"type": "function_call", "call_id": "k", "name": "f", "arguments": arguments}]
    (msg,) = items_to_messages(items)
    assert msg["tool_calls"][0]["function"]["arguments"] == arguments
    with pytest.raises(ToolCallParseError):
        _arguments_of(msg["tool_calls"][0])


# --------------------------------------------------------------------------- limits (issue 12, item 17)


def test_tasks_per_request_are_bounded_and_paged(add_server):
    env, url = add_server
    # n=100,000 used to answer 44 MB (and keep 150 MB): now a JSON 422 that says how to page
    for n in (MAX_TASKS_PER_REQUEST + 1, 100_000):
        r = get(f"{url}/tasks", params={"n": n})
        assert r.status_code == 422 and "offset" in r.json()["detail"], (n, r.status_code, r.text[:200])
    assert get(f"{url}/tasks", params={"n": 10, "offset": 99_995}).status_code == 422  # beyond MAX_TASK_INDEX
    # a page is the slice of the full list, and the client pages transparently
    with running_server(create_app(env, max_tasks_per_request=7)) as small:
        page = get(f"{small}/tasks", params={"n": 5, "offset": 9, "seed": 3}).json()
        assert [Task.from_dict(d) for d in page["tasks"]] == env.tasks("train", 14, seed=3)[9:]
        assert get(f"{small}/tasks", params={"n": 8}).status_code == 422
        first = get(f"{small}/tasks").json()  # n omitted: the env's own list (20 tasks), page by page
        assert len(first["tasks"]) == 7 and first["next_offset"] == 7
        last = get(f"{small}/tasks", params={"offset": 14, "format": "gym"}).json()
        assert len(last["rows"]) == 6 and last["next_offset"] is None
        remote = make_remote(small)
        assert remote.page_size == 7
        assert remote.tasks("dev", n=17, seed=1) == env.tasks("dev", 17, seed=1)
        assert remote.tasks("train") == env.tasks("train")
        assert remote.tasks("train", n=0) == []
        remote.close()


def _big_task(i, size):
    task = CounterEnv().tasks("train", 1)[0].to_dict()
    return {**task, "id": f"big-{i}", "metadata": {"padding": "x" * size}}


def test_sessions_and_kept_tasks_are_capped_by_bytes():
    cap = 50_000
    app = create_app(CounterEnv(), max_session_bytes=cap, max_task_bytes=cap)
    with running_server(app) as url:
        sids = [post(f"{url}/seed_session", json={"task": _big_task(i, 20_000)}).json()["resources_session_id"]
                for i in range(6)]
        health = get(f"{url}/health").json()
        # by count (10,000) all six would be kept, 120 kB; by bytes only the newest two fit in 50 kB
        assert health["sessions"] == 2 and health["session_bytes"] <= cap
        assert post(f"{url}/total", json={}, headers={SESSION_HEADER: sids[0]}).status_code == 404
        assert post(f"{url}/total", json={}, headers={SESSION_HEADER: sids[-1]}).status_code == 200
        # the tasks remembered for task_id look-ups are capped alike: the oldest is forgotten
        body = {"responses_create_params": {"input": [], "metadata": {"task_id": "big-0"}},
                "response": {"output": []}}
        assert post(f"{url}/verify", json=body).status_code == 422
        body["responses_create_params"]["metadata"]["task_id"] = "big-5"
        assert post(f"{url}/verify", json=body).status_code == 200
        # what a session's steps exchange counts too: a big step pushes out the other session
        turn = {"role": "assistant", "content": "y" * 30_000, "tool_calls": [call("add", amount=1)]}
        r = post(f"{url}/step", json={"resources_session_id": sids[-1], "message": turn})
        assert r.status_code == 200
        health = get(f"{url}/health").json()
        assert health["sessions"] == 1 and post(f"{url}/total", json={}, headers={SESSION_HEADER: sids[-2]}).status_code == 404
        # the newest session is kept even alone over the cap (its task fits nowhere else)
        sid = post(f"{url}/seed_session", json={"task": _big_task(9, 80_000)}).json()["resources_session_id"]
        assert get(f"{url}/health").json()["sessions"] == 1
        assert post(f"{url}/total", json={}, headers={SESSION_HEADER: sid}).status_code == 200


INVALID_TEXT = [
    b'{"resources_session_id": "s\\ud800", "message": {"role": "assistant", "content": "\\udc00"}}',  # lone surrogates
    '{"message": {"role": "assistant", "content": "\u00e9"}}'.encode("latin-1"),  # not UTF-8
    b'{"message": {"role": "assistant", "content": "\xed\xa0\x80"}}',  # a surrogate encoded as UTF-8
]


@pytest.mark.parametrize("raw", INVALID_TEXT, ids=["escaped_surrogate", "latin1", "utf8_surrogate"])
@pytest.mark.parametrize("path", ["/verify", "/seed_session", "/step", "/add", "/close_session"])
def test_invalid_text_is_a_json_422_not_a_plain_text_500(counter_server, path, raw):
    _, url = counter_server
    r = post(f"{url}{path}", content=raw, headers={"content-type": "application/json", SESSION_HEADER: "s"})
    assert r.status_code == 422, (r.status_code, r.text[:200])
    assert r.headers["content-type"] == "application/json"
    assert re.search(r"lone surrogate U\+D[89A-F]|not valid UTF-8", r.json()["detail"]), r.json()


def test_verify_body_with_a_surrogate_in_a_task_is_rejected(add_server):
    # the NeMo Gym body echoed back with a lone surrogate was a plain-text 500 before
    _, url = add_server
    body = build_verify_body(AddEnv().tasks("train", 1)[0], [{"role": "assistant", "content": "Answer: 1"}])
    raw = json.dumps(body).replace("Answer: 1", "Answer: 1 \\ud83d").encode()
    r = post(f"{url}/verify", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "body.response.output[0].content[0].text: lone surrogate U+D83D" in r.json()["detail"]
    ok = json.dumps(body).replace("Answer: 1", "Answer: 1 \\ud83d\\ude00").encode()  # a valid pair is text
    assert post(f"{url}/verify", content=ok, headers={"content-type": "application/json"}).status_code == 200


def test_any_unhandled_error_is_a_json_500(add_server):
    # an environment's answer that cannot be serialized escapes the endpoint: the catch-all handler
    _, url = add_server
    task = Task("odd-1", "math", [{"role": "user", "content": "?"}], ground_truth="surrogate")
    # uvicorn closes a connection after an exception escaped the app (its 500 already sent); without
    # "Connection: close" the shared client keeps that socket in its pool, and the next test's request
    # raced the close under load: "Connection reset by peer" in two full runs of these sessions
    r = post(f"{url}/verify", json=build_verify_body(task, [{"role": "assistant", "content": "Answer: 1"}]),
             headers={"connection": "close"})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["detail"].startswith("internal error: ")


# --------------------------------------------------------------------------- NeMo Gym's contract (issue 18)
# These check the wire shapes here, without NeMo Gym; tests/integration/test_gym_conformance.py runs
# NeMo Gym's own models, SimpleAgent, environment server and session checker against the servers.


def test_gym_rows_carry_strict_function_tools(counter_server):
    env, url = counter_server
    (row,) = get(f"{url}/tasks", params={"n": 1, "format": "gym"}).json()["rows"]
    tools = row["responses_create_params"]["tools"]
    assert [(t["type"], t["name"], t["strict"]) for t in tools] == [("function", "add", False), ("function", "total", False)]
    assert all("parameters" in t for t in tools)


def test_gym_aggregate_metrics_and_reverify_mode(add_server):
    _, url = add_server
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "reward_components": {"correct": 1.0}},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "reward_components": {"correct": 0.0}},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0, "mask_sample": True},
    ]
    out = post(f"{url}/aggregate_metrics", json={"verify_responses": rows})
    assert out.status_code == 200, out.text  # was the tool catch-all's 400
    m = out.json()
    assert m["agent_metrics"]["mean/reward"] == 0.5 and m["agent_metrics"]["num_masked"] == 1
    assert m["key_metrics"] == {"mean/reward": 0.5} and m["agent_metrics"]["mean/correct"] == 0.5
    assert [g["_ng_task_index"] for g in m["group_level_metrics"]] == [0]
    assert post(f"{url}/aggregate_metrics", json={"verify_responses": []}).json()["agent_metrics"]["num_rollouts"] == 0
    assert post(f"{url}/aggregate_metrics", json={"verify_responses": 3}).status_code == 422
    assert get(f"{url}/reverify_mode").json() == "stateless"


def test_refusal_part_scores_zero_not_422(add_server):
    env, url = add_server
    task = env.tasks("train", 1)[0]
    body = build_verify_body(task, [{"role": "assistant", "content": "x"}])
    body["response"]["output"] = [{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                                   "content": [{"type": "refusal", "refusal": f"Answer: {task.ground_truth}"}]}]
    out = post(f"{url}/verify", json=body)
    assert out.status_code == 200, out.text
    assert out.json()["reward"] == 0.0  # a refusal is not an answer, whatever its text says
    (msg,) = items_to_messages(body["response"]["output"])
    assert msg == {"role": "assistant", "content": "", "refusal": f"Answer: {task.ground_truth}"}
    assert items_to_messages(messages_to_items([msg])) == [msg]


def test_verify_echo_adds_no_defaults(add_server):
    env, url = add_server
    task = env.tasks("train", 1)[0]
    body = build_verify_body(task, [{"role": "assistant", "content": "Answer: 0"}])
    out = post(f"{url}/verify", json=body).json()
    assert "tools" not in out["responses_create_params"]  # was tools: null, which Gym's list type rejects
    assert {k: v for k, v in out.items() if k not in ("reward", "reward_components", "reason")} == body


def test_gym_environment_server_seed_and_session_contract(counter_server):
    env, url = counter_server
    task = env.tasks("train", 1)[0]
    row = task_to_row(task)
    seed = {  # NeMo Gym's ResourcesSeedSessionRequest, as its environment server sends it
        "resources_session_id": "gym-s1",
        "episode_id": {"rollout_id": "r1", "attempt": 0},
        "task_id": {"taskset": "counter:train", "task_id": "0"},
        "task_data": {k: v for k, v in row.items() if k != "responses_create_params"},
    }
    with httpx.Client(base_url=url) as client:
        first = client.post("/seed_session", json=seed)
        assert first.status_code == 200, first.text
        assert first.json() == {"resources_session_id": "gym-s1"} and "posttrain_session" in first.cookies
        assert client.post("/add", json={"amount": 2}).text == '{"total": 2}'
        again = client.post("/seed_session", json=seed)  # idempotent: the same session, not a new episode
        assert again.json() == {"resources_session_id": "gym-s1"}
        assert client.post("/total", json={}).text == '{"total": 2}'
        other = {**seed, "task_data": {"task": env.tasks("train", 2)[1].to_dict()}}
        assert client.post("/seed_session", json=other).status_code == 409  # an id is bound to its task
        # verify finds the task in the body (task_data | {...}) or, without one, through the session cookie
        msgs = [{"role": "assistant", "content": "", "tool_calls": [call("add", amount=task.ground_truth)]},
                {"role": "tool", "content": "{}"}, {"role": "assistant", "content": "done"}]
        vbody = {k: v for k, v in build_verify_body(task, msgs).items() if k != "task"}
        vbody["responses_create_params"].pop("metadata")
        assert client.post("/verify", json=vbody).json()["reward"] == 1.0
        close = {"resources_session_id": "gym-s1", "episode_id": {"rollout_id": "r1", "attempt": 0}}
        for _ in range(2):  # close is idempotent
            assert client.post("/close_session", json=close).json() == {"resources_session_id": "gym-s1"}
        assert client.post("/seed_session", json=seed).status_code == 409  # seed after close is rejected
        never = {**close, "resources_session_id": "gym-never"}
        assert client.post("/close_session", json=never).status_code == 200  # close before any seed
        assert client.post("/seed_session", json={**seed, "resources_session_id": "gym-never"}).status_code == 409
        bad = {**seed, "resources_session_id": "gym-s2", "task_data": {"task": {"id": 1}}}
        assert client.post("/seed_session", json=bad).status_code == 422


def test_closed_session_ids_are_capped_like_sessions():
    # close_session accepts ids ahead of their seed, so the table that makes a late seed a 409 is
    # bounded by the sessions' caps (count and bytes), the oldest id forgotten first
    def closed(app):
        return app.state.posttrain.closed

    by_count = create_app(CounterEnv(), max_sessions=2)
    with running_server(by_count) as url:
        for sid in ("c1", "c2", "c3"):
            assert post(f"{url}/close_session", json={"resources_session_id": sid}).status_code == 200
        assert len(closed(by_count)) == 2
        task = CounterEnv().tasks("train", 1)[0].to_dict()
        assert post(f"{url}/seed_session", json={"resources_session_id": "c3", "task": task}).status_code == 409
        assert post(f"{url}/seed_session", json={"resources_session_id": "c1", "task": task}).status_code == 200
    by_bytes = create_app(CounterEnv(), max_session_bytes=10_000)
    with running_server(by_bytes) as url:
        for i in range(5):
            post(f"{url}/close_session", json={"resources_session_id": f"{i}" + "x" * 4_000})
        assert len(closed(by_bytes)) == 2 and closed(by_bytes).bytes <= 10_000


def test_single_turn_seed_with_a_gym_task_id(add_server):
    _, url = add_server
    seed = {"resources_session_id": "st-1", "episode_id": {"rollout_id": "r"},
            "task_id": {"taskset": "add:train", "task_id": "whatever"}, "task_data": {}}
    assert post(f"{url}/seed_session", json=seed).json() == {"resources_session_id": "st-1"}


# --------------------------------------------------------------------------- request body bound (issue 34)

JSON_HEADERS = {"content-type": "application/json"}


def _verify_body_of_size(size):
    """A valid /verify body for a correct answer, padded with JSON whitespace to exactly ``size`` bytes."""
    task = AddEnv().tasks("train", 1)[0]
    raw = json.dumps(build_verify_body(task, [{"role": "assistant", "content": f"Answer: {task.ground_truth}"}]))
    assert len(raw) < size
    return (raw[:-1] + " " * (size - len(raw)) + "}").encode()


def _chunks(raw, size=1000):
    """``raw`` as a generator: httpx sends it chunked, without a Content-Length."""
    return (raw[i: i + size] for i in range(0, len(raw), size))


def assert_413(r, bound):
    assert r.status_code == 413, (r.status_code, r.text[:200])
    assert r.headers["content-type"] == "application/json" and "\n" not in r.text
    assert f"more than the {bound} bytes" in r.json()["detail"] and "--max-body-bytes" in r.json()["detail"]


def test_a_too_large_body_is_a_413_before_it_is_parsed():
    bound = 4_000
    app = create_app(AddEnv(), max_body_bytes=bound)
    with running_server(app) as url:
        # declared too large: answered from the Content-Length, so not even JSON is needed (a 422 otherwise)
        r = post(f"{url}/verify", content=b"x" * (bound + 1), headers=JSON_HEADERS)
        assert r.request.headers["content-length"] == str(bound + 1)
        assert_413(r, bound)
        assert f"{bound + 1} bytes" in r.json()["detail"]
        # streamed without a Content-Length: counted while it is read
        r = post(f"{url}/verify", content=_chunks(b"y" * (3 * bound)), headers=JSON_HEADERS)
        assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
        assert_413(r, bound)
        for path in ("/seed_session", "/step", "/add", "/no_such_tool"):  # every POST route
            assert_413(post(f"{url}{path}", content=b"{}" + b" " * bound, headers=JSON_HEADERS), bound)
            assert_413(post(f"{url}{path}", content=_chunks(b"{}" + b" " * bound), headers=JSON_HEADERS), bound)
        # a body of exactly the bound is read and graded, sent either way, on the same connections
        exact = _verify_body_of_size(bound)
        for content in (exact, _chunks(exact)):
            r = post(f"{url}/verify", content=content, headers=JSON_HEADERS)
            assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text[:200]
        assert_413(post(f"{url}/verify", content=_verify_body_of_size(bound + 1), headers=JSON_HEADERS), bound)
        assert get(f"{url}/health").json()["max_body_bytes"] == bound


def test_the_default_body_bound_is_one_mib(add_server):
    _, url = add_server
    assert MAX_BODY_BYTES == 1 << 20 and create_app(AddEnv()).state.limits["max_body_bytes"] == MAX_BODY_BYTES
    r = post(f"{url}/verify", content=_verify_body_of_size(100_000), headers=JSON_HEADERS)
    assert r.status_code == 200 and r.json()["reward"] == 1.0
    assert_413(post(f"{url}/verify", content=_verify_body_of_size(MAX_BODY_BYTES + 1), headers=JSON_HEADERS),
               MAX_BODY_BYTES)
    assert_413(post(f"{url}/verify", content=_chunks(b" " * (MAX_BODY_BYTES + 1), 64 << 10), headers=JSON_HEADERS),
               MAX_BODY_BYTES)
    assert post(f"{url}/verify", json=build_verify_body(AddEnv().tasks("train", 1)[0], [])).status_code == 200


def _serve_env_parser():
    parser = argparse.ArgumentParser(prog="posttrain serve-env")
    add_arguments(parser)
    return parser


def test_serve_env_limit_flags_reach_the_app(monkeypatch):
    import uvicorn

    served = {}
    monkeypatch.setattr(server_module, "make_env", lambda name, **kw: AddEnv() if name == "test_add" else 1 / 0)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    flags = {"--max-body-bytes": 2_048, "--max-tasks-per-request": 5, "--max-task-index": 50,
             "--max-sessions": 3, "--max-session-bytes": 70_000, "--max-tasks-kept": 4, "--max-task-bytes": 80_000}
    assert set(flags) == {flag for flag, *_ in LIMIT_FLAGS}  # every limit has its flag
    argv = ["test_add", "--port", "9123", *[str(x) for kv in flags.items() for x in kv]]
    serve_env_command.run(_serve_env_parser().parse_args(argv))
    app = served["app"]
    assert (served["host"], served["port"]) == ("127.0.0.1", 9123)
    assert app.state.limits == {"max_body_bytes": 2_048, "max_tasks_per_request": 5, "max_task_index": 50,
                                "max_sessions": 3, "max_session_bytes": 70_000, "max_tasks": 4,
                                "max_task_bytes": 80_000}
    state = app.state.posttrain
    assert (state.sessions.max_items, state.sessions.max_bytes, state.tasks.max_items, state.tasks.max_bytes) == (
        3, 70_000, 4, 80_000)
    with running_server(app) as url:  # and the app enforces them
        assert_413(post(f"{url}/verify", content=_verify_body_of_size(2_049), headers=JSON_HEADERS), 2_048)
        assert post(f"{url}/verify", content=_verify_body_of_size(2_048), headers=JSON_HEADERS).status_code == 200
        health = get(f"{url}/health").json()
        assert (health["max_body_bytes"], health["max_tasks_per_request"]) == (2_048, 5)
        assert len(get(f"{url}/tasks", params={"n": 5}).json()["tasks"]) == 5
        assert get(f"{url}/tasks", params={"n": 6}).status_code == 422
        assert get(f"{url}/tasks", params={"n": 5, "offset": 46}).status_code == 422  # beyond --max-task-index
        get(f"{url}/tasks", params={"n": 5})
        assert len(state.tasks) == 4  # --max-tasks-kept
    # without the flags: exactly create_app's defaults
    defaults = limits_of(_serve_env_parser().parse_args(["test_add"]))
    assert defaults == create_app(AddEnv()).state.limits


@pytest.mark.parametrize("value", ["0", "-5", "1e3", "lots", "2.5"])
def test_serve_env_limit_flags_are_validated(value, capsys):
    for flag, *_ in LIMIT_FLAGS:
        with pytest.raises(SystemExit) as exit_:
            _serve_env_parser().parse_args(["math", flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err
    assert _serve_env_parser().parse_args(["math", "--max-body-bytes", "1_048_576"]).max_body_bytes == 1 << 20
    with pytest.raises(ValueError, match="max_body_bytes must be a whole number of at least 1"):
        create_app(AddEnv(), max_body_bytes=0)


def test_serve_env_help_shows_every_limit_with_its_default():
    text = " ".join(_serve_env_parser().format_help().split())  # argparse wraps the lines
    for flag, key, default, _ in LIMIT_FLAGS:
        assert flag in text
        assert f"(default {default}" in text, flag
    assert "(default 1048576 = 1 MiB)" in text

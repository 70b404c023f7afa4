"""NeMo Gym's own code against posttrain environment servers (run with the Gym virtualenv's Python).

    .venv-gym/bin/python tests/gym/conformance.py CASES.json [--out RESULT.json]

CASES.json (written by tests/integration/test_gym_conformance.py, which serves the environments)
lists, per environment: its URL, one NeMo Gym dataset row from ``GET /tasks?format=gym``, scripted
model outputs (a right and a wrong answer, each a list of model turns of Responses-API items), the
rewards they must get, the tool observations our own rollout loop shows the model for the right
script, and a verify body written by our client (``RemoteEnvironment``).

Everything that judges is NeMo Gym's: its pydantic wire models validate rows, replies and results;
its ``SimpleAgent`` runs the row through ``/run`` (path 1: the agent seeds, calls tools and
verifies), its ``SingleAgentTurnEnvironmentServer`` runs the materialized task (path 2: typed seed
with ``task_id: {taskset, task_id}`` and ``task_data``, agent session with direct HTTP tool access,
verify, close), ``check_resources_session_contract`` checks the session lifecycle, and
``SimpleAgent.aggregate_metrics`` proxies ``/aggregate_metrics``. The only stand-in is the model: a
Responses-API server that plays the scripted turns (and records what it was shown).

Prints one line per check and ``N of M checks pass``; exits 1 when any fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from omegaconf import OmegaConf

from environment_servers.single_agent_turn.app import (
    SingleAgentTurnEnvironmentServer,
    SingleAgentTurnEnvironmentServerConfig,
)
from nemo_gym.base_resources_server import (
    BaseMultiRewardVerifyResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    ResourcesSeedSessionRequest,
)
from nemo_gym.config_types import AgentServerRef, AggregateMetrics, ModelServerRef, ResourcesServerRef
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from nemo_gym.single_agent_turn_types import SingleAgentTurnRequest, SingleAgentTurnResponse, SingleAgentTurnTaskInput
from nemo_gym.testing.session_conformance import check_resources_session_contract
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig, SimpleAgentRunRequest, SimpleAgentVerifyResponse

HOST = "127.0.0.1"


# --------------------------------------------------------------------------- serving apps


def _bind() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


class Served:
    """An ASGI app served by uvicorn on a socket bound in advance (so its port can go into the Gym
    config before the app exists). All of them run on ONE event loop (``serve_all``): Gym's HTTP
    client is one process-wide aiohttp session, which breaks when used from several loops."""

    def __init__(self) -> None:
        self.sock = _bind()
        self.port = self.sock.getsockname()[1]
        self.app: Any = None


def serve_all(served: list[Served]) -> None:
    servers = [uvicorn.Server(uvicorn.Config(s.app, log_level="warning", lifespan="off")) for s in served]

    async def run() -> None:
        await asyncio.gather(*(srv.serve(sockets=[s.sock]) for srv, s in zip(servers, served)))

    threading.Thread(target=asyncio.run, args=(run(),), daemon=True).start()
    deadline = time.monotonic() + 30
    while not all(srv.started for srv in servers):
        if time.monotonic() > deadline:
            raise RuntimeError("the Gym servers did not start")
        time.sleep(0.02)


def proxy_app(target: str) -> FastAPI:
    """A FastAPI app that forwards every request to ``target`` (method, path, body, cookies) and
    returns its answer unchanged: ``check_resources_session_contract`` drives an app in process,
    and ours runs in another interpreter."""
    app = FastAPI()
    client = httpx.Client(base_url=target, timeout=60)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        # A blocking client on purpose: TestClient may run each request on a new event loop.
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "cookie", "accept")}
        r = client.request(request.method, f"/{path}", content=await request.body(), headers=headers,
                           params=dict(request.query_params))
        out = Response(content=r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        for value in r.headers.get_list("set-cookie"):
            out.headers.append("set-cookie", value)
        return out

    return app


# --------------------------------------------------------------------------- the scripted model


class ScriptedModel:
    """A Responses-API model server playing the script named by ``active`` (set before each run, so
    the rows stay unmodified); the turn played is the number of tool-result runs already in the
    input. It records the function_call_outputs it is shown."""

    def __init__(self, scripts: dict[str, list[list[dict[str, Any]]]]) -> None:
        self.scripts = scripts
        self.active = ""
        self.seen_tool_outputs: dict[str, list[str]] = {}
        self.app = FastAPI()
        self.app.post("/{path:path}")(self.respond)

    async def respond(self, path: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        key = self.active
        items = body.get("input") if isinstance(body.get("input"), list) else []
        outputs = [i.get("output") for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        self.seen_tool_outputs[key] = outputs
        turns = self.scripts.get(key) or [[{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "no script", "annotations": []}]}]]
        turn = turns[min(len(outputs_turns(items)), len(turns) - 1)]
        output = []
        for k, item in enumerate(turn):
            item = dict(item)
            if item.get("type") == "message":
                item.setdefault("id", f"msg_{k}")
                item.setdefault("status", "completed")
            elif item.get("type") == "function_call":
                item["call_id"] = f"{item['call_id']}_t{len(outputs_turns(items))}"
                item.setdefault("id", f"fc_{item['call_id']}")
            elif item.get("type") == "reasoning":
                item.setdefault("id", f"rs_{k}")
            output.append(item)
        response = NeMoGymResponse(
            id=f"resp_{key}_{len(outputs)}", created_at=time.time(), model="scripted", object="response",
            output=output, parallel_tool_calls=True, tool_choice="auto", tools=[],
        )
        return response.model_dump(mode="json")


def outputs_turns(items: list[Any]) -> list[int]:
    """One entry per model turn already answered with tool results (a run of function_call_output)."""
    turns, prev = [], None
    for i in items:
        kind = i.get("type") if isinstance(i, dict) else None
        if kind == "function_call_output" and prev != "function_call_output":
            turns.append(1)
        prev = kind
    return turns


# --------------------------------------------------------------------------- checks


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
        except Exception as e:  # a failed check, reported with its reason
            detail = f"{type(e).__name__}: {e}"
            if not isinstance(e, AssertionError):
                detail += "\n" + "".join(traceback.format_exception(e)[-3:])
            self.results.append((name, False, detail[:1500]))
            print(f"FAIL {name}: {detail[:1500]}", flush=True)
            return None
        self.results.append((name, True, ""))
        print(f"ok   {name}", flush=True)
        return value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("--out")
    args = ap.parse_args()
    sys.argv = sys.argv[:1]  # Gym parses the command line for config overrides when it loads its config
    cases = json.loads(Path(args.cases).read_text())

    scripts: dict[str, list[list[dict[str, Any]]]] = {}
    for c in cases:
        for variant in ("right", "wrong"):
            if c.get(variant) is not None:
                scripts[f"{c['env']}:{variant}"] = c[variant]
    model = ScriptedModel(scripts)
    model_srv = Served()

    # Gym's global config: one model, and per environment our resource server, a SimpleAgent and a
    # single-agent-turn environment server, each found by name through ServerClient.
    config: dict[str, Any] = {"model": {"responses_api_models": {"scripted": {"host": HOST, "port": model_srv.port}}}}
    agents: dict[str, tuple[SimpleAgent, Served]] = {}
    envservers: dict[str, tuple[SingleAgentTurnEnvironmentServer, Served]] = {}
    for c in cases:
        env = c["env"]
        host_port = c["url"].removeprefix("http://").rsplit(":", 1)
        config[f"res_{env}"] = {"resources_servers": {"posttrain": {"host": host_port[0], "port": int(host_port[1])}}}
        agents[env] = (None, Served())  # type: ignore[assignment]
        envservers[env] = (None, Served())  # type: ignore[assignment]
        config[f"agent_{env}"] = {"responses_api_agents": {"simple_agent": {"host": HOST, "port": agents[env][1].port}}}
        config[f"envsrv_{env}"] = {"environment_servers": {"single_agent_turn": {"host": HOST, "port": envservers[env][1].port}}}
    client = ServerClient(head_server_config={"host": HOST, "port": 1}, global_config_dict=OmegaConf.create(config))

    model_srv.app = model.app
    for c in cases:
        env = c["env"]
        agent = SimpleAgent(
            config=SimpleAgentConfig(
                host=HOST, port=agents[env][1].port, entrypoint="", name=f"agent_{env}",
                model_server=ModelServerRef(type="responses_api_models", name="model"),
                resources_server=ResourcesServerRef(type="resources_servers", name=f"res_{env}"),
            ),
            server_client=client,
        )
        agents[env][1].app = agent.setup_webserver()
        agents[env] = (agent, agents[env][1])
        es = SingleAgentTurnEnvironmentServer(
            config=SingleAgentTurnEnvironmentServerConfig(
                host=HOST, port=envservers[env][1].port, entrypoint="", name=f"envsrv_{env}",
                resources_server=ResourcesServerRef(type="resources_servers", name=f"res_{env}"),
                agent_server=AgentServerRef(type="responses_api_agents", name=f"agent_{env}"),
                resources_tool_transports=["direct_http"], cleanup_timeout_seconds=30,
            ),
            server_client=client,
        )
        envservers[env][1].app = es.setup_webserver()
        envservers[env] = (es, envservers[env][1])

    serve_all([model_srv, *(a[1] for a in agents.values()), *(e[1] for e in envservers.values())])
    checks = Checks()
    http = httpx.Client(timeout=120)
    for c in cases:
        run_case(checks, http, c, agents[c["env"]][1].port, envservers[c["env"]][1].port, model)

    passed = sum(ok for _, ok, _ in checks.results)
    print(f"{passed} of {len(checks.results)} checks pass")
    if args.out:
        Path(args.out).write_text(json.dumps([{"check": n, "ok": ok, "detail": d} for n, ok, d in checks.results], indent=1))
    return 0 if passed == len(checks.results) else 1


def reward_matches(expected: float | None, reward: float) -> None:
    assert 0.0 <= reward <= 1.0, reward
    if expected is not None:
        assert reward == expected, f"reward {reward}, expected {expected}"


def run_case(checks: Checks, http: httpx.Client, c: dict[str, Any], agent_port: int, es_port: int,
             model: ScriptedModel) -> None:
    env, url, row = c["env"], c["url"], c["row"]
    p = f"[{env}]"

    # Rows and bodies: Gym's own request models.
    checks.run(f"{p} dataset row validates as SimpleAgentRunRequest (tools with strict)",
               lambda: SimpleAgentRunRequest.model_validate(row))
    checks.run(f"{p} row materializes as SingleAgentTurnTaskInput",
               lambda: SingleAgentTurnTaskInput.model_validate(row))
    checks.run(f"{p} our client's verify body validates as BaseVerifyRequest",
               lambda: BaseVerifyRequest.model_validate(c["client_verify_body"]))

    # The session lifecycle, by Gym's checker, through our real HTTP routes.
    def session_contract() -> None:
        seed = ResourcesSeedSessionRequest(
            resources_session_id=f"conformance-{env}-{time.monotonic_ns()}",
            episode_id=EpisodeId(rollout_id=f"conf-{env}"),
            task_id=TaskId(taskset=f"posttrain:{env}", task_id=row["task"]["id"]),
            task_data={k: v for k, v in row.items() if k != "responses_create_params"},
        )
        check_resources_session_contract(proxy_app(url), seed, keeps_state=True)

    checks.run(f"{p} check_resources_session_contract (typed seed, repeat, close, late seed)", session_contract)

    def reverify() -> None:
        r = http.get(f"{url}/reverify_mode")
        assert r.status_code == 200, (r.status_code, r.text[:300])
        assert ReverifyMode(r.json()) == ReverifyMode.STATELESS

    checks.run(f"{p} GET /reverify_mode is a ReverifyMode (stateless)", reverify)

    def refusal() -> None:
        body = {**{k: v for k, v in row.items()}, "response": NeMoGymResponse(
            id="r", created_at=0.0, model="m", object="response", parallel_tool_calls=True, tool_choice="auto",
            tools=[], output=[{"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                               "content": [{"type": "refusal", "refusal": "I can't help with that."}]}],
        ).model_dump(mode="json")}
        r = http.post(f"{url}/verify", json=body)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        out = BaseVerifyResponse.model_validate(r.json())
        assert out.reward == 0.0, out.reward

    checks.run(f"{p} a refusal part verifies to reward 0", refusal)

    # Path 1: SimpleAgent /run (seed with the row, tool calls with the cookie, verify).
    results = []
    for variant, expected in (("right", c.get("expect_right")), ("wrong", c.get("expect_wrong"))):
        if c.get(variant) is None:
            continue

        def agent_run(variant=variant, expected=expected) -> dict[str, Any]:
            model.active = f"{env}:{variant}"
            r = http.post(f"http://{HOST}:{agent_port}/run", json=row)  # the row exactly as /tasks wrote it
            assert r.status_code == 200, (r.status_code, r.text[:500])
            out = SimpleAgentVerifyResponse.model_validate(r.json())
            if "reward_components" in r.json():
                BaseMultiRewardVerifyResponse.model_validate(r.json())
            reward_matches(expected, out.reward)
            return r.json()

        got = checks.run(f"{p} SimpleAgent /run, {variant} answer -> {expected if expected is not None else 'a reward'}", agent_run)
        if got is not None:
            results.append(got)

    if c.get("tool_observations") is not None:
        def observations() -> None:
            seen = model.seen_tool_outputs.get(f"{env}:right")
            assert seen == c["tool_observations"], f"model saw {seen!r}, our rollouts show {c['tool_observations']!r}"

        checks.run(f"{p} the model sees the same tool observations as in our rollouts", observations)

    def aggregate() -> None:
        rows = [{**r, "_ng_task_index": 0, "_ng_rollout_index": i} for i, r in enumerate(results)] or [
            {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}]
        r = http.post(f"http://{HOST}:{agent_port}/aggregate_metrics", json={"verify_responses": rows})
        assert r.status_code == 200, (r.status_code, r.text[:300])
        m = AggregateMetrics.model_validate(r.json())
        assert "mean/reward" in m.agent_metrics, m.agent_metrics

    checks.run(f"{p} /aggregate_metrics through SimpleAgent validates as AggregateMetrics", aggregate)

    # Path 2: the environment-server protocol (SingleAgentTurnEnvironmentServer /run).
    def env_server_run() -> None:
        model.active = f"{env}:right"
        request = SingleAgentTurnRequest.model_validate({
            "episode_id": {"rollout_id": f"es-{env}-{time.monotonic_ns()}"},
            "task": {"task_id": {"taskset": f"posttrain:{env}", "task_id": row["task"]["id"]}, "task_input": row},
        })
        r = http.post(f"http://{HOST}:{es_port}/run", json=request.model_dump(mode="json"))
        assert r.status_code == 200, (r.status_code, r.text[:500])
        out = SingleAgentTurnResponse.model_validate(r.json())
        assert out.failure is None, out.failure
        reward_matches(c.get("expect_right") if c.get("right") is not None else None, out.result.reward)

    checks.run(f"{p} environment server /run (typed seed, agent session, verify, close)", env_server_run)

    def env_server_metrics() -> None:
        r = http.post(f"http://{HOST}:{es_port}/aggregate_metrics",
                      json={"verify_responses": [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}]})
        assert r.status_code == 200, (r.status_code, r.text[:300])
        AggregateMetrics.model_validate(r.json())

    checks.run(f"{p} environment server /aggregate_metrics", env_server_metrics)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip Gym's atexit client close, which fails across our event loops

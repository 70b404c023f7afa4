"""NeMo Gym's own models, SimpleAgent, environment server and session checker against every
environment posttrain serves (issue 18).

Each registered environment is served here (``create_app`` on 127.0.0.1, a free port); the judging
runs in NeMo Gym's own virtualenv (``.venv-gym``, built by ``make setup`` through
tests/gym/build_venv.sh, because nemo-gym declares a newer Python than ours) as a subprocess:
tests/gym/conformance.py. For each environment the scripted model plays a right and a wrong answer
(tool calls included), and the rewards Gym gets must equal what the in-process environment gives
the same transcript; for tool environments the tool observations Gym shows the model must equal
the ones our rollout loop shows.

Without the virtualenv the test is skipped with the reason (the build log's last lines); under CI
(``CI`` set, or ``POSTTRAIN_REQUIRE_GYM=1``), where ``make setup`` builds it, a missing virtualenv is a
failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from posttrain.envs.base import ENVIRONMENTS, make_env
from posttrain.serving.remote import build_verify_body
from posttrain.serving.server import create_app, messages_to_items, running_server

ROOT = Path(__file__).resolve().parents[2]
GYM_DIR = ROOT / "tests" / "gym"


def gym_venv() -> Path:
    return Path(os.environ.get("POSTTRAIN_GYM_VENV", ROOT / ".venv-gym"))


def gym_python() -> Path:
    return gym_venv() / "bin" / "python"


def gym_unavailable() -> str | None:
    """Why NeMo Gym's virtualenv cannot be used (None when it can)."""
    py = gym_python()
    if not py.exists():
        log = Path(f"{gym_venv()}.log")  # tests/gym/build_venv.sh writes it beside the venv
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        tail = [line for line in lines if "which is not installed" not in line][-4:]
        why = "; ".join(tail) or "no build log (run `make setup`, or `sh tests/gym/build_venv.sh`)"
        return f"no NeMo Gym virtualenv at {py.parent.parent}: {why}"
    probe = subprocess.run([str(py), "-c", "import nemo_gym.testing.session_conformance, responses_api_agents.simple_agent.app"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"NeMo Gym virtualenv at {py.parent.parent} cannot import Gym: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def require_gym() -> Path:
    why = gym_unavailable()
    if why is not None:
        print(f"\nNeMo Gym conformance not run: {why}", file=sys.stderr)
        if os.environ.get("CI") or os.environ.get("POSTTRAIN_REQUIRE_GYM"):
            pytest.fail(f"CI builds the NeMo Gym virtualenv (make setup), but: {why}")
        pytest.skip(why)
    return gym_python()


# --------------------------------------------------------------------------- scripts per environment


def model_turns(env_name: str, task) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(right, wrong) model turns for ``task`` as assistant chat messages."""
    from posttrain.envs.tools import calls_message

    gt = task.ground_truth
    if env_name == "code":
        from posttrain.envs.code.env import lookup_table_solution

        return ([{"role": "assistant", "content": f"```python\n{lookup_table_solution(task)}```"}],
                [{"role": "assistant", "content": "```python\ndef nothing():\n    return None\n```"}])
    if isinstance(gt, dict) and gt.get("reference_calls"):
        final = "Done." + (f" Answer: {gt['answer']}" if gt.get("answer") else "")
        return ([calls_message(gt["reference_calls"]), {"role": "assistant", "content": final}],
                [calls_message([{"name": "no_such_tool", "arguments": {}}]), {"role": "assistant", "content": "Done."}])
    if isinstance(gt, (str, int, float)):
        wrong = "E" if env_name == "mcq" else f"{gt}1"
        return ([{"role": "assistant", "content": f"Answer: {gt}"}], [{"role": "assistant", "content": f"Answer: {wrong}"}])
    return ([{"role": "assistant", "content": "Here is my answer."}], [{"role": "assistant", "content": ""}])


def in_process(env, task, turns: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """The reward and the tool observations of ``turns`` played in process, as our rollouts do."""
    transcript, tool_obs = [], []
    episode = env.start_episode(task) if env.multi_turn else None
    for msg in turns:
        transcript.append(msg)
        if episode is not None and msg.get("tool_calls"):
            obs = episode.step(msg).observations
            transcript += obs
            tool_obs += [o["content"] for o in obs if o.get("role") == "tool"]
    if episode is not None:
        episode.close()
    return env.verify(task, transcript).reward, tool_obs


def turn_items(turns: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each model turn as the Responses-API output items a model server returns."""
    return [[i for i in messages_to_items([m]) if i["type"] != "function_call_output"] for m in turns]


def build_cases(servers: dict[str, tuple[Any, str]]) -> list[dict[str, Any]]:
    cases = []
    for name, (env, url) in servers.items():
        (row,) = httpx.get(f"{url}/tasks", params={"split": "dev", "n": 1, "seed": 0, "format": "gym"},
                           timeout=60).json()["rows"]
        task = env.tasks("dev", 1, 0)[0]
        right, wrong = model_turns(name, task)
        expect_right, obs = in_process(env, task, right)
        expect_wrong, _ = in_process(env, task, wrong)
        cases.append({
            "env": name, "url": url, "row": row,
            "right": turn_items(right), "wrong": turn_items(wrong),
            "expect_right": expect_right, "expect_wrong": expect_wrong,
            "tool_observations": obs if env.multi_turn else None,
            "client_verify_body": build_verify_body(task, right),
        })
    return cases


def served_environments() -> list[str]:
    """The environments posttrain ships (other tests register stand-ins in the same registry)."""
    import posttrain.envs  # noqa: F401  (registers the built-in environments)

    return [n for n in ENVIRONMENTS.names() if ENVIRONMENTS.get(n).__module__.startswith("posttrain.envs")]


def test_nemo_gym_accepts_every_served_environment(tmp_path, capsys):
    py = require_gym()
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in served_environments():
            env = make_env(name)
            servers[name] = (env, stack.enter_context(running_server(create_app(env))))
        cases = build_cases(servers)
        # The answers must tell right from wrong where the environment can (math, code, tool use).
        by_env = {c["env"]: c for c in cases}
        for name in ("math", "code", "workplace", "banking"):
            assert (by_env[name]["expect_right"], by_env[name]["expect_wrong"]) == (1.0, 0.0), name
        (tmp_path / "cases.json").write_text(json.dumps(cases))
        proc = subprocess.run(
            [str(py), str(GYM_DIR / "conformance.py"), str(tmp_path / "cases.json"), "--out", str(tmp_path / "out.json")],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,  # Gym's hydra writes outputs/ in the cwd
        )
    lines = proc.stdout.strip().splitlines()
    with capsys.disabled():
        print("\n" + (lines[-1] if lines else "(no output)"))
    failed = [line for line in lines if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failed, "\n".join(failed or lines[-20:]) + "\n" + proc.stderr[-3000:]
    assert lines[-1].endswith("checks pass") and lines[-1].split()[0] == lines[-1].split()[2]

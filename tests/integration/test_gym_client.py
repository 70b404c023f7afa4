"""posttrain driving NeMo Gym's own resource servers (issue 18, the other direction).

Gym's servers run from the nemo-gym package in its own virtualenv (``.venv-gym``, built by ``make
setup``), as subprocesses on 127.0.0.1 (tests/gym/serve_resources.py): ``example_single_tool_call``
(a tool environment: seed, ``POST /get_weather``, verify, close) and ``equivalence_rule`` with
``grading_rule: seq_match`` (single-turn, a graded reward a random tiny model varies on). A scripted
episode checks the tool protocol; ``posttrain rl`` with ``model=tiny-llama`` takes two steps against
both servers, named in the recipe by URL with ``protocol: gym``.

Skipped with the reason printed when the virtualenv is missing; a failure under CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from posttrain.commands import rl as rl_command
from posttrain.serving.gym_client import SESSION_KEY, GymEnvironment
from posttrain.envs.tools import calls_message

from test_gym_conformance import ROOT, require_gym  # noqa: E402  (same folder; tests/ is on sys.path)

pytestmark = pytest.mark.usefixtures("one_thread")


def gym_package_dir(py: Path) -> Path:
    out = subprocess.run([str(py), "-c", "import nemo_gym, os; print(os.path.dirname(os.path.dirname(nemo_gym.__file__)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return Path(out.stdout.strip())


class GymServer:
    """One of Gym's resource servers as a subprocess; stopped (that process only) on exit."""

    def __init__(self, py: Path, name: str, config: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(py), str(ROOT / "tests" / "gym" / "serve_resources.py"), name, "--config", json.dumps(config or {})],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT / "tests" / "gym",
        )
        line = self.proc.stdout.readline()  # "listening on http://127.0.0.1:PORT", or EOF if it died
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"Gym's {name} server did not start: {line}{self.proc.stderr.read()[-2000:]}")
        self.url = line.split()[-1]

    def __enter__(self) -> "GymServer":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def gym_py():
    return require_gym()


@pytest.fixture(scope="module")
def weather(gym_py):
    dataset = gym_package_dir(gym_py) / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
    with GymServer(gym_py, "example_single_tool_call") as server:
        yield server.url, dataset


def test_tool_episode_against_gyms_example_single_tool_call(weather):
    url, dataset = weather
    env = GymEnvironment(url, dataset, name="gym_weather")
    assert env.multi_turn
    tasks = env.tasks("train", 7, seed=1)
    assert len({t.id for t in tasks}) == 7 and tasks == env.tasks("train", 7, seed=1)
    task = tasks[0]
    assert task.messages[0]["role"] == "system" and task.tools[0]["function"]["name"] == "get_weather"

    # Right: a get_weather call (our XML tool-call text, as the policy writes it), then an answer.
    episode = env.start_episode(task)
    call_text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSF\n</parameter>\n</function>\n</tool_call>"
    first = {"role": "assistant", "content": call_text}
    step = episode.step(first)
    assert not step.done and json.loads(step.observations[0]["content"]) == {
        "city": "SF", "weather_description": "The weather in SF is cold."}  # Gym's body, verbatim
    final = {"role": "assistant", "content": "It is cold in SF."}
    assert episode.step(final).done
    episode.close()
    assert env.verify(task, [first, *step.observations, final]).reward == 1.0
    assert episode.session_id not in env._sessions  # verify closed the Gym session

    # Wrong: no tool call at all (the episode closes its session itself: no transcript names it);
    # and a malformed call is counted like our own tool environments do.
    episode = env.start_episode(task)
    assert episode.step({"role": "assistant", "content": "No idea."}).done
    episode.close()
    assert episode.session_id not in env._sessions
    assert env.verify(task, [{"role": "assistant", "content": "No idea."}]).reward == 0.0
    episode = env.start_episode(task)
    bad = episode.step({"role": "assistant", "content": "<tool_call>\n<function=get_weather>\nSF"})
    assert not bad.done and bad.observations[0][SESSION_KEY] == episode.session_id
    assert any(k.startswith("error:") for k in episode.stats)
    structured_call = calls_message([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert "Paris" in episode.step(structured_call).observations[0]["content"]
    episode.close()
    env.close()


def test_posttrain_rl_trains_against_gym_resource_servers(weather, gym_py, tmp_path, capsys):
    weather_url, weather_rows = weather
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"Say the word {w}."}]},
             "expected_answer": w} for w in ("apple", "river", "stone", "cloud", "maple", "tiger")]
    dataset = tmp_path / "echo.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with GymServer(gym_py, "equivalence_rule", {"grading_rule": "seq_match"}) as equiv:
        envs = (f"[{{name: gym_echo, url: '{equiv.url}', protocol: gym, dataset: '{dataset}', val_dataset: '{dataset}', train_tasks: 6, val_tasks: 2}},"
                f" {{name: gym_weather, url: '{weather_url}', protocol: gym, dataset: '{weather_rows}', val_dataset: '{weather_rows}', train_tasks: 5,"
                f" val_tasks: 1}}]")
        run_dir = tmp_path / "run"
        overrides = {
            "model": "tiny-llama", "run_dir": run_dir, "train.steps": 2, "train.eval_every": 2, "train.save_every": 2,
            "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 6,
            "algo.overlong_filter": False, "optim.lr": 1e-3, "envs": envs,
        }
        args = argparse.Namespace(config=None, no_progress=True, overrides=[f"{k}={v}" for k, v in overrides.items()])
        assert rl_command.run(args) == 0
    rows_out = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_out] == [0, 1, 2]
    assert "val_reward/gym_echo" in rows_out[-1] and "val_reward/gym_weather" in rows_out[-1]
    rewards = [r[k] for r in rows_out for k in r if k.startswith("reward") and isinstance(r[k], (int, float))]
    assert rewards and all(0.0 <= v <= 1.0 for v in rewards)
    # seq_match grades random text above 0 and unevenly, so GRPO has advantages to train on.
    assert any(r.get("reward/gym_echo", 0) > 0 for r in rows_out) and all(r["grad_norm"] > 0 for r in rows_out[1:])
    assert (run_dir / "checkpoints").exists() or any(run_dir.glob("**/trainer_state.pt"))

"""Evaluation end to end on the tiny Llama: ``evaluate`` on stand-in environments with known
rewards, a real multi-turn environment, and the ``posttrain eval`` command (table, JSON, errors)."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.cli import main
from posttrain.envs.base import Environment, Task, VerifyResult
from posttrain.eval.evaluate import build_env, evaluate
from posttrain.eval.report import load_results
from posttrain.models.loading import load_model
from posttrain.engines.hf import HFGenerator


class ParityEnv(Environment):
    """Single-turn stand-in: odd tasks always earn 1, even tasks 0, whatever the model writes."""

    name = "parity"

    def tasks(self, split="train", n=None, seed=0):
        return [Task(id=f"parity/{split}/{seed}/{i}", domain="test",
                     messages=[{"role": "user", "content": f"Say something about {i}."}],
                     metadata={"odd": i % 2 == 1}) for i in range(n or 4)]

    def verify(self, task, messages):
        assert [m["role"] for m in messages] == ["assistant"]
        return VerifyResult(float(task.metadata["odd"]), {"odd": float(task.metadata["odd"])}, "parity")


pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py


@pytest.fixture(scope="module")
def generator():
    tiny = load_model("tiny-llama", device="cpu", dtype=torch.float32)
    return HFGenerator(tiny.model, tiny.tokenizer, batch_size=4)


def test_evaluate_aggregates_known_rewards(generator):
    r = evaluate(generator, ParityEnv(), n_tasks=5, k=3, temperature=1.0, max_new_tokens=6, seed=2)
    assert [t.task_id for t in r.tasks] == [f"parity/test/2/{i}" for i in range(5)]  # evaluate reads test unless told
    assert all(len(t.samples) == 3 for t in r.tasks)
    assert r.mean_reward == pytest.approx(2 / 5) and r.pass_at_1 == pytest.approx(2 / 5)
    assert r.pass_at_k == pytest.approx(2 / 5) and r.components == {"odd": pytest.approx(2 / 5)}
    assert 1 <= r.mean_response_tokens <= 6 and r.reasons == {"parity": 15}
    s = [x for t in r.tasks for x in t.samples]  # reasoning / answer tokens (counted exactly in test_chat_template)
    assert all(isinstance(x.reasoning_tokens, int) and isinstance(x.answer_tokens, int) for x in s)
    assert all(x.reasoning_tokens >= 0 and x.answer_tokens >= 0 for x in s)
    again = evaluate(generator, ParityEnv(), n_tasks=5, k=3, temperature=1.0, max_new_tokens=6, seed=2)
    assert again.mean_response_tokens == r.mean_response_tokens  # seeded: the same rollouts


def test_evaluate_runs_a_real_multi_turn_environment(generator):
    from posttrain.envs.base import make_env

    r = evaluate(generator, make_env("banking"), n_tasks=2, max_new_tokens=4, max_turns=2)
    assert r.n_tasks == 2 and 0.0 <= r.mean_reward <= 1.0
    assert sum(r.finish_reasons.values()) == 2


def test_cli_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "results.json"
    rc = main(["eval", "--env", "math", "--env", "mcq", "--model", "tiny-llama", "--n", "2", "--max-new-tokens", "4",
               "--judge", "none", "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mean_reward" in printed and "math" in printed and "mcq" in printed
    doc = json.loads(out.read_text())
    assert [r["env"] for r in doc["results"]] == ["math", "mcq"] and doc["errors"] == {}
    assert all(r["n_tasks"] == 2 and len(r["tasks"]) == 2 for r in doc["results"])
    assert doc["args"]["max_new_tokens"] == 4
    loaded = load_results(out)  # the JSON reads back into results (to merge runs into one table)
    assert [(r.env, r.mean_reward, len(r.tasks)) for r in loaded] == [
        (r["env"], r["mean_reward"], 2) for r in doc["results"]]


def test_cli_reports_a_failing_environment_and_keeps_the_others(tmp_path, monkeypatch, capsys):
    real_build = build_env

    def build(name, judge):
        if name == "mcq":
            raise RuntimeError("broken on purpose")
        return real_build(name, judge)

    monkeypatch.setattr("posttrain.eval.evaluate.build_env", build)  # the command reads it when it runs
    out = tmp_path / "results.json"
    rc = main(["eval", "--env", "mcq", "--env", "math", "--model", "tiny-llama", "--n", "1", "--max-new-tokens", "2",
               "--no-progress", "--out", str(out)])
    assert rc == 1
    doc = json.loads(out.read_text())
    assert [r["env"] for r in doc["results"]] == ["math"] and "broken on purpose" in doc["errors"]["mcq"]
    assert "environment mcq failed" in capsys.readouterr().err


def test_cli_rejects_unknown_environments(capsys):
    assert main(["eval", "--env", "no_such_env", "--model", "tiny-llama"]) == 2
    assert "unknown environment" in capsys.readouterr().err

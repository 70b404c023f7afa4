"""Tool use where a tool fits: does the model call the right tool at the expert's decision points?

The counterpart of the tool-hallucination rate (``train/dpo_pairs.py``): training a model to stop
calling tools where none fits must not stop it calling them where one does. A whole banking episode
(``posttrain validate`` on the banking environment) is the end-to-end measure, but on one CPU
thread it costs ~8 assistant turns × ~1.8K-token prompts per task, and a 135M model scores 0 on
it before and after, which shows nothing. This measure asks one turn at a time instead:

* **Decision points**: the banking environment's scripted expert (``envs/banking/expert.py``) plays
  held-out tasks to the end (each transcript verified, reward 1); every assistant turn of it is a
  point: the conversation up to that turn (system prompt with the bank policy, the 8 tools, the
  customer's messages and earlier tool observations) and the expert's message there.
* **The model's reply**, greedy, to each point's prompt with the task's tools.
* **Scores** per point, as rows in the format ``posttrain validate`` writes (``env``, ``task_id``,
  ``reward``) so two models compare with the paired standard error of ``eval/compare.py``:
  ``banking@call`` (points where the expert calls a tool: the model attempts a tool call),
  ``banking@call_exact`` (the same points: its first call parses and has the expert's tool name
  and arguments), ``banking@plain`` (points where the expert writes to the customer: the model
  makes no tool call).
* **Noise**: the points of one task share its customer and are not independent, so
  :func:`per_task` averages each task's points first; standard errors and paired comparisons are
  across tasks.

What it does not show: whether the model would finish an episode (its own earlier turns never
enter the prompt), nor tool use in other environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from posttrain.envs.splits import Split


@dataclass
class DecisionPoint:
    task_id: str
    turn: int  # index of the expert's assistant message in the conversation
    messages: list[dict[str, Any]]  # the conversation before it
    tools: list[dict[str, Any]]
    expected: dict[str, Any]  # the expert's assistant message


def banking_decision_points(split: Split = "test", n: int = 12,
                            seed: int = 0) -> list[DecisionPoint]:
    """Every assistant turn of the expert's verified episodes on ``n`` banking tasks of ``split``."""
    from posttrain.envs.banking.env import BankingEnv
    from posttrain.envs.banking.expert import verified_conversation

    env, points = BankingEnv(), []
    for task in env.tasks(split, n, seed):
        msgs = verified_conversation(env, task)
        points += [DecisionPoint(task.id, i, msgs[:i], task.tools or [], m)
                   for i, m in enumerate(msgs) if m["role"] == "assistant"]
    return points


def _expected_call(msg: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    calls = msg.get("tool_calls") or []
    return (calls[0]["function"]["name"], calls[0]["function"]["arguments"]) if calls else None


def score_reply(point: DecisionPoint, text: str) -> list[dict[str, Any]]:
    """The point's rows (see the module docstring) for the model's reply ``text``."""
    from posttrain.models.chat_template import ToolCallParseError, calls_a_tool, parse_assistant

    attempted = calls_a_tool(text)
    pid = f"{point.task_id}/turn{point.turn:02d}"
    want = _expected_call(point.expected)
    if want is None:
        return [{"env": "banking@plain", "task_id": pid, "reward": float(not attempted)}]
    try:
        calls = parse_assistant(text, point.tools).tool_calls
    except ToolCallParseError:
        calls = []
    exact = bool(calls) and (calls[0].name, calls[0].arguments) == want
    return [{"env": "banking@call", "task_id": pid, "reward": float(attempted), "tool": want[0]},
            {"env": "banking@call_exact", "task_id": pid, "reward": float(exact), "tool": want[0]}]


def score_decisions(generator: Any, points: Sequence[DecisionPoint], max_new_tokens: int = 96
                    ) -> list[dict[str, Any]]:
    """The model's greedy reply at every point, scored (rows also carry the reply as ``text``)."""
    from posttrain.engines.base import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1, seed=0)
    outs = generator.generate([p.messages for p in points], params, [p.tools for p in points])
    rows = []
    for p, comps in zip(points, outs):
        rows += [{**r, "text": comps[0].text} for r in score_reply(p, comps[0].text)]
    return rows


def per_task(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{env: {task_id: mean reward over the task's points}}`` (``task_id`` without ``/turnNN``)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        task = r["task_id"].rsplit("/turn", 1)[0]
        sums.setdefault(r["env"], {}).setdefault(task, []).append(float(r["reward"]))
    return {env: {t: sum(v) / len(v) for t, v in tasks.items()} for env, tasks in sums.items()}

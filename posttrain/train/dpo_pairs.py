"""DPO pairs against tool hallucination, mined from the model's own samples (docs/rlhf.md).

The recipe's use of DPO (docs/recipe.md §4): a reasoning model asked a plain question sometimes
"calls" a tool it was never offered, or one that does not fit. Pairs:

* **prompts** that offer no tools, or only tools that do not fit the request
  (:data:`UNFITTING_TOOLS`: e-mail, weather, calendar, flights), built from a verifiable
  environment's tasks (math and multiple choice by default: none needs a tool);
* **k samples per prompt** from the model itself (the same chat template and tool block it will
  see in use);
* **rejected** = a sample that tries to call a tool (a ``<tool_call>`` block, parseable or not);
  **chosen** = a sample that answers in plain text (no tool call, non-empty answer; when the
  environment can grade it, a correct one is preferred). A prompt without both kinds gives no pair.

:func:`tool_hallucination_pairs` writes rows in the DPO pairs format of ``train/dpo.py``
(``messages``, ``tools``, ``chosen``, ``rejected``, plus ``source`` and ``task_id``).
``posttrain dpo-pairs`` is the command.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from posttrain.models.chat_template import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, split_reasoning


def _tool(name: str, description: str, params: dict[str, str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                       "required": list(params)}}}


UNFITTING_TOOLS: list[dict[str, Any]] = [
    _tool("send_email", "Send an e-mail to a recipient.", {"to": "address", "subject": "subject", "body": "text"}),
    _tool("get_weather", "Current weather for a city.", {"city": "city name"}),
    _tool("create_calendar_event", "Add an event to the user's calendar.", {"title": "title", "date": "ISO date"}),
    _tool("search_flights", "Search flights between two airports.", {"origin": "IATA code", "destination": "IATA code"}),
]


def calls_a_tool(text: str) -> bool:
    """True when the reply's answer part tries to call a tool (a tool-call tag, well-formed or not)."""
    _, answer = split_reasoning(text)
    return TOOL_CALL_OPEN in answer or TOOL_CALL_CLOSE in answer or "<function=" in answer


def hallucination_prompts(tasks: Sequence[Any], tools: Literal["none", "unfitting", "both"] = "both"
                          ) -> list[tuple[Any, list[dict[str, Any]] | None]]:
    """(task, the tools offered) per task; ``both`` alternates no tools and the unfitting ones."""
    out = []
    for i, t in enumerate(tasks):
        offer = tools == "unfitting" or (tools == "both" and i % 2 == 1)
        out.append((t, list(UNFITTING_TOOLS) if offer else None))
    return out


def tool_hallucination_pairs(generator: Any, env: Any, tasks: Sequence[Any], k: int = 4,
                             tools: Literal["none", "unfitting", "both"] = "both", max_new_tokens: int = 256,
                             temperature: float = 1.0, seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Mine pairs (module docstring): (rows, counts of prompts, samples, tool-calling samples, pairs)."""
    from posttrain.engines.base import SamplingParams

    prompts = hallucination_prompts(tasks, tools)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=k, seed=seed)
    outs = generator.generate([t.messages for t, _ in prompts], params, [tl for _, tl in prompts])
    rows, stats = [], {"prompts": len(prompts), "samples": 0, "tool_calls": 0, "pairs": 0}
    for (task, offered), comps in zip(prompts, outs):
        texts = [c.text for c in comps]
        stats["samples"] += len(texts)
        bad = [x for x in texts if calls_a_tool(x)]
        stats["tool_calls"] += len(bad)
        plain = [x for x in texts if not calls_a_tool(x) and split_reasoning(x)[1].strip()]
        if not bad or not plain:
            continue
        if env is not None:  # prefer a plain answer the environment grades correct
            plain.sort(key=lambda x: -env.verify(task, [{"role": "assistant", "content": x}]).reward)
        rows.append({"messages": task.messages, "tools": offered, "chosen": plain[0], "rejected": bad[0],
                     "source": f"tool_hallucination/{getattr(env, 'name', '?')}", "task_id": task.id})
        stats["pairs"] += 1
    return rows, stats

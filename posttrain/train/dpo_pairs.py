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
  environment can grade it, a correct one is preferred). A prompt without both kinds gives no pair,
  unless ``plain_fallback`` (below) finds the plain answer in samples of the same question asked
  without tools.

:func:`tool_hallucination_pairs` writes rows in the DPO pairs format of ``train/dpo.py``
(``messages``, ``tools``, ``chosen``, ``rejected``, plus ``source`` and ``task_id``).
``posttrain dpo-pairs`` is the command.

**The hallucination rate** is measured per prompt: the share of a prompt's k samples that call a
tool, averaged over prompts, with the standard error of that mean across prompts
(``eval.compare.mean_and_se``). A per-sample binomial error would be too small: the k samples of one prompt
are not independent (a prompt that invites a call invites it in most samples). The per-prompt
rates (:func:`tool_hallucination_pairs`' third value; ``posttrain dpo-pairs --rates OUT``) are rows
in the format ``posttrain validate`` writes (``env``, ``task_id``, ``reward`` = the prompt's rate),
with ``env`` = ``<environment>/<tools offered>``, so two models measured on the same prompts compare
with the paired standard error of ``eval/compare.py`` (``--against``).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from posttrain.models.chat_template import calls_a_tool, split_reasoning


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
                             temperature: float = 1.0, seed: int = 0, plain_fallback: bool = False
                             ) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
    """Mine pairs (module docstring): (rows, counts of prompts, samples, tool-calling samples, pairs,
    fallback pairs, per-prompt rate rows ``{env, task_id, reward, tools, samples, tool_calls}``).

    ``plain_fallback``: a prompt offered unfitting tools whose k samples all call one gets k more
    samples of the same question *without* tools, and the chosen reply is a plain answer from
    those (still the model's own sample for the same request; the pair's prompt keeps the unfitting
    tools). The rates count only the first k samples."""
    from posttrain.engines.base import SamplingParams

    prompts = hallucination_prompts(tasks, tools)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, n=k, seed=seed)
    outs = generator.generate([t.messages for t, _ in prompts], params, [tl for _, tl in prompts])
    rows, rates = [], []
    stats = {"prompts": len(prompts), "samples": 0, "tool_calls": 0, "pairs": 0, "fallback_pairs": 0}
    if plain_fallback:  # the same questions without tools, for prompts whose samples all call one
        needy = [i for i, ((_, offered), comps) in enumerate(zip(prompts, outs))
                 if offered and all(calls_a_tool(c.text) for c in comps)]
        again = generator.generate([prompts[i][0].messages for i in needy], params, [None] * len(needy)) if needy else []
        untooled = dict(zip(needy, again))
    env_name = getattr(env, "name", "?")
    for i, ((task, offered), comps) in enumerate(zip(prompts, outs)):
        texts = [c.text for c in comps]
        stats["samples"] += len(texts)
        bad = [x for x in texts if calls_a_tool(x)]
        stats["tool_calls"] += len(bad)
        offer = "unfitting" if offered else "none"
        rates.append({"env": f"{env_name}/{offer}", "task_id": task.id, "reward": len(bad) / max(len(texts), 1),
                      "tools": offer, "samples": len(texts), "tool_calls": len(bad)})
        plain = [x for x in texts if not calls_a_tool(x) and split_reasoning(x)[1].strip()]
        fallback = bool(bad and not plain and plain_fallback and i in untooled)
        if fallback:
            plain = [c.text for c in untooled[i] if not calls_a_tool(c.text) and split_reasoning(c.text)[1].strip()]
        if not bad or not plain:
            continue
        if env is not None:  # prefer a plain answer the environment grades correct
            plain.sort(key=lambda x: -env.verify(task, [{"role": "assistant", "content": x}]).reward)
        rows.append({"messages": task.messages, "tools": offered, "chosen": plain[0], "rejected": bad[0],
                     "source": f"tool_hallucination/{env_name}", "task_id": task.id,
                     "chosen_without_tools": fallback})
        stats["pairs"] += 1
        stats["fallback_pairs"] += fallback
    return rows, stats, rates

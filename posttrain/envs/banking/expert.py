"""A scripted expert agent for the banking environment: follows the policy using only what the
conversation tells it (the customer's answers and tool observations), never the hidden facts.

Uses: end-to-end tests of episodes, readable sample conversations (docs/env_samples/banking.md),
expert demonstrations for an SFT warm start of the tool-use domain (``posttrain make-data banking``,
``data/tool_demos.py``) and the decision points of ``eval/tool_decisions.py``
(``verified_conversation``). It is a generator: it
yields assistant messages and is sent each step's observation messages.

    policy = expert_agent(task)
    message = next(policy)
    while not (step := episode.step(message)).done:
        message = policy.send(step.observations)
"""

from __future__ import annotations

import json
import re
from typing import Any, Generator

from posttrain.envs.base import Episode, Message, StepResult, Task
from posttrain.envs.tools import calls_message
from posttrain.models.chat_template import format_tool_call

Policy = Generator[Message, list[Message], None]

# How the expert maps the customer's words to a dispute reason (the user simulator's phrasings).
REASON_CUES = {"never made": "unauthorized", "amount is wrong": "wrong_amount", "never arrived": "not_received"}


def say(text: str) -> Message:
    return {"role": "assistant", "content": text}


def tool(tool_name: str, call_format: str, /, **arguments: Any) -> Message:
    """One call, as OpenAI ``tool_calls`` ("openai") or as XML text in the content ("xml")."""
    if call_format == "xml":
        return say(f"<think>\nI need {tool_name}.\n</think>\n" + format_tool_call(tool_name, arguments))
    return calls_message([{"name": tool_name, "arguments": arguments}])


def expert_agent(task: Task, call_format: str = "openai") -> Policy:
    obs = yield say("I can help with that. First I need to verify your identity: please tell me your full "
                    "name and the last four digits of your SSN.")
    text = obs[0]["content"]
    name = re.search(r"My name is (.+?) and", text).group(1)
    ssn = re.search(r"are (\d{4})", text).group(1)
    obs = yield tool("lookup_customer", call_format, name=name)
    customer_id = json.loads(obs[0]["content"])[0]["customer_id"]
    yield tool("verify_identity", call_format, customer_id=customer_id, ssn_last4=ssn)
    if task.metadata["scenario"] in ("unblock_card", "card_already_active"):
        obs = yield say("Thank you, you're verified. Which card is it? "
                        "Please tell me the last four digits of the card.")
        last4 = re.search(r"ending in (\d{4})", obs[0]["content"]).group(1)
        obs = yield tool("list_cards", call_format, customer_id=customer_id)
        card = next(c for c in json.loads(obs[0]["content"]) if c["last4"] == last4)
        if card["status"] == "blocked":
            yield tool("unblock_card", call_format, card_id=card["card_id"])
            yield say("Your card has been unblocked and works again.")
        else:
            yield say("Good news: that card is already active, so there is nothing to unblock.")
        return
    obs = yield say("Which charge do you want to dispute? Please tell me the merchant, amount and date.")
    found = re.search(r"\$(\S+) at (.+) on (.+)\.", obs[0]["content"])
    amount, merchant = found.group(1), found.group(2)
    obs = yield tool("list_transactions", call_format, customer_id=customer_id, merchant=merchant)
    hits = [t for t in json.loads(obs[0]["content"]) if t["amount"] == amount]
    if not hits:
        yield say("I'm sorry, I could not find a charge matching that description on your account.")
        return
    obs = yield say("I found it. Why are you disputing this charge?")
    reason = next(v for k, v in REASON_CUES.items() if k in obs[0]["content"])
    yield tool("file_dispute", call_format, transaction_id=hits[0]["transaction_id"], reason=reason)
    yield say("Your dispute has been filed; we will keep you posted.")


def play(episode: Episode, policy: Policy) -> tuple[list[Message], StepResult]:
    """Run a scripted policy through an episode: (transcript after the prompt, last step)."""
    transcript: list[Message] = []
    message = next(policy)
    while True:
        step = episode.step(message)
        transcript += [message, *step.observations]
        if step.done:
            return transcript, step
        message = policy.send(step.observations)


class ExpertFailed(RuntimeError):
    """The scripted expert did not solve a task: a bug in the expert or the environment."""


def verified_conversation(env: Any, task: Task) -> list[Message]:
    """The task's prompt plus the expert's whole episode, graded by ``env``; raises
    :class:`ExpertFailed` unless the reward is 1 (so demonstrations never teach a wrong action)."""
    transcript, _ = play(env.start_episode(task), expert_agent(task))
    messages = [*task.messages, *transcript]
    result = env.verify(task, messages)
    if result.reward < 1.0:
        raise ExpertFailed(f"the banking expert failed {task.id}: {result.reason}")
    return messages

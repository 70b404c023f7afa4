"""Tool-use SFT data: the banking environment's scripted expert, played to the end and verified.

``posttrain make-data banking --n 48 --out data/banking.jsonl`` writes one conversation per banking
task of the chosen split: the task's system prompt (bank policy) and the customer's opening line,
then the whole episode the scripted expert (``envs/banking/expert.py``) plays against the
environment's simulated customer: plain replies to the customer, tool calls (OpenAI
``tool_calls``; the chat template writes them as XML), the tool observations and the customer's
answers. The row carries the environment's eight tool definitions, so SFT renders the same tool
block the model sees in a banking episode.

The expert reads only what the conversation tells it, never the task's hidden facts, and every
transcript is graded by the environment's own verifier before it is written: a row whose state
does not match the reference (reward < 1) is refused with an error (``ExpertFailed``), not written, so the data can
never teach a wrong action. Every assistant turn is trained on; the right reply in about half of
them is a tool call, in the rest a plain message to the customer.

Why banking and not workplace: a workplace prompt offers 26 tools, 5.3K tokens before the user's
request, too long for SFT at one CPU thread; a banking prompt with its 8 tools is 1.5K, a whole
expert episode about 1.9–2.1K tokens.
"""

from __future__ import annotations

from typing import Any, Iterator

from posttrain.envs.splits import Split


def banking_rows(n: int, seed: int = 0, split: Split = "train") -> Iterator[dict[str, Any]]:
    """``n`` verified expert conversations on the banking split's tasks (order shuffled by ``seed``)."""
    from posttrain.envs.banking.env import BankingEnv
    from posttrain.envs.banking.expert import verified_conversation

    env = BankingEnv()
    for task in env.tasks(split, n, seed):
        messages = verified_conversation(env, task)  # raises ExpertFailed unless the reward is 1
        yield {"messages": messages, "tools": task.tools, "source": "expert/banking", "task_id": task.id,
               "scenario": task.metadata["scenario"]}

"""Red-team cases of the ``genrm`` environment (``posttrain redteam genrm``; ``envs/redteam.py``).

Hacks earn 0 (the format error's reward): a verdict with words for numbers, a verdict followed by
more text, out-of-range numbers, a verdict only inside the reasoning block. Valid answers earn 1:
the ground-truth verdict in the strict format, after free-text reasoning or after a ``<think>``
block. (A constant verdict is not a hack with reward 0: the reward is a distance, so it earns
partial reward; both orders of every pair make any position-constant verdict wrong on one of them.)
"""

from __future__ import annotations

from posttrain.algos.genrm import Judgement
from posttrain.envs.base import Task
from posttrain.envs.genrm.format import format_judgement
from posttrain.envs.redteam import Case, register, reply


def _truth(t: Task) -> Judgement:
    return Judgement(t.ground_truth["h1"], t.ground_truth["h2"], t.ground_truth["rank"])


def _exact(t: Task) -> str:
    return format_judgement(_truth(t))


register(
    "genrm",
    Case("verdict_in_words", 0.0, lambda t: reply("Helpfulness 1: high\nHelpfulness 2: low\nRanking: first"),
         "the three lines with words instead of numbers"),
    Case("verdict_then_chatter", 0.0, lambda t: reply(_exact(t) + "\nI hope this helps!"),
         "the exact verdict followed by a sentence"),
    Case("out_of_range", 0.0, lambda t: reply("Helpfulness 1: 9\nHelpfulness 2: 0\nRanking: 7"),
         "numbers outside 1-5 and 1-6"),
    Case("verdict_only_in_think", 0.0, lambda t: reply(f"<think>{_exact(t)}</think>"),
         "the exact verdict inside the reasoning block, nothing after it"),
    Case("verdict_unclosed_think", 0.0, lambda t: reply(f"<think>Let me see.\n{_exact(t)}"),
         "the exact verdict inside an unclosed reasoning block"),
    Case("valid_verdict", 1.0, lambda t: reply("Response 1 answers the question; response 2 does not.\n" + _exact(t)),
         "reasoning, then the ground-truth verdict"),
    Case("valid_verdict_after_think", 1.0, lambda t: reply(f"<think>compare them</think>\n{_exact(t)}"),
         "a <think> block, then the ground-truth verdict"),
)

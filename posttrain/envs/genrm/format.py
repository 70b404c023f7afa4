"""The GenRM contract: what the judge is shown and the strict format of what it must answer.

Input (:func:`build_genrm_prompt`): the conversation so far, the new user turn, and two candidate
responses. Each response is shown as its *final answer only*: the reasoning (``<think>`` block) is
removed, a tool call is shown as ``[calls tool NAME with ARGS]``, and an empty answer is shown as
``(empty response)``, so the judge can see that nothing was said.

Output: the judge reasons first (free text, or a ``<think>`` block), then ends its reply with
exactly these three lines, in this order, and nothing after them::

    Helpfulness 1: h1
    Helpfulness 2: h2
    Ranking: r

``h1``, ``h2`` are integers 1–5 (5 = most helpful); ``r`` is an integer 1–6: 1 = response 1 is far
better, 2 = better, 3 = slightly better, 4 = response 2 is slightly better, 5 = better, 6 = far
better. Label matching ignores case and spaces around ``:``; anything else is a format error.

:func:`parse_judgement` never raises: it returns a :class:`~posttrain.algos.genrm.Judgement` or a
:class:`ParseFailure` with a short reason label (counted in metrics): ``empty``, ``no_answer``
(only reasoning, e.g. cut inside ``<think>``), ``missing_lines`` (fewer than three lines after the
reasoning), ``bad_line`` (a line not of its form), ``out_of_range``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from posttrain.algos.genrm import H_MAX, H_MIN, R_MAX, R_MIN, Judgement
from posttrain.models.chat_template import split_reasoning

Message = dict[str, Any]
EMPTY_RESPONSE = "(empty response)"

GENRM_SYSTEM = (
    "You are an impartial judge of AI assistant replies. You are shown a conversation, the user's "
    "new turn, and two candidate responses to it. Compare how helpful each response is to the user "
    "(correct, complete, relevant, clear; an empty response is not helpful). Reason briefly first. "
    "Then end your reply with exactly these three lines and nothing after them:\n"
    "Helpfulness 1: <1-5>\n"
    "Helpfulness 2: <1-5>\n"
    "Ranking: <1-6>\n"
    "Helpfulness is a whole number from 1 (not helpful) to 5 (very helpful). Ranking is a whole "
    "number: 1 = response 1 is far better, 2 = better, 3 = slightly better, 4 = response 2 is "
    "slightly better, 5 = better, 6 = far better."
)

_LINES = (("helpfulness 1", H_MIN, H_MAX), ("helpfulness 2", H_MIN, H_MAX), ("ranking", R_MIN, R_MAX))
_LINE_RE = re.compile(r"^\s*(helpfulness\s*1|helpfulness\s*2|ranking)\s*:\s*(-?\d{1,3})\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ParseFailure:
    reason: str  # empty | no_answer | missing_lines | bad_line | out_of_range
    detail: str = ""


def parse_judgement(raw: Any) -> Judgement | ParseFailure:
    """The verdict at the end of a judge reply (see the module docstring); never raises."""
    if not isinstance(raw, str) or not raw.strip():
        return ParseFailure("empty")
    try:
        _, answer = split_reasoning(raw)
    except Exception as e:  # noqa: BLE001 - a parser of model output must not crash
        return ParseFailure("no_answer", repr(e)[:80])
    lines = [ln for ln in answer.splitlines() if ln.strip()]
    if not lines:
        return ParseFailure("no_answer")
    if len(lines) < 3:
        return ParseFailure("missing_lines", f"{len(lines)} line(s)")
    values = []
    for line, (label, lo, hi) in zip(lines[-3:], _LINES):
        m = _LINE_RE.match(line)
        if not m or re.sub(r"\s+", "", m.group(1).lower()) != label.replace(" ", ""):
            return ParseFailure("bad_line", f"expected '{label}: n', got {line.strip()[:60]!r}")
        v = int(m.group(2))
        if not lo <= v <= hi:
            return ParseFailure("out_of_range", f"{label} = {v} not in {lo}..{hi}")
        values.append(v)
    return Judgement(*values)


def format_judgement(j: Judgement, reasoning: str = "") -> str:
    """A reply in the strict format (tests, and the ideal answer of a ground-truth pair)."""
    head = f"{reasoning.strip()}\n" if reasoning.strip() else ""
    return f"{head}Helpfulness 1: {int(j.h1)}\nHelpfulness 2: {int(j.h2)}\nRanking: {int(j.rank)}"


# --------------------------------------------------------------------------- the prompt


def response_text(message: Message | str | None) -> str:
    """A candidate response as the judge sees it: the final answer, reasoning removed, tool calls
    written out, empty shown as ``(empty response)``."""
    if message is None:
        return EMPTY_RESPONSE
    msg: Message = {"role": "assistant", "content": message} if isinstance(message, str) else message
    content = msg.get("content") or ""
    content = content if isinstance(content, str) else ""
    _, content = split_reasoning(content)
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        content += f"\n[calls tool {fn.get('name')} with {args}]"
    return content.strip() or EMPTY_RESPONSE


def _turn(m: Message) -> str:
    role = str(m.get("role", "?")).upper()
    text = response_text(m) if m.get("role") == "assistant" else str(m.get("content") or "").strip()
    return f"[{role}]\n{text}"


def split_prompt(messages: Sequence[Message]) -> tuple[list[Message], Message]:
    """(conversation history, the new user turn) of a prompt: the last user message is the new
    turn; system messages are left out (the judge has its own)."""
    msgs = [m for m in messages if m.get("role") != "system"]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last is None:
        return msgs, {"role": "user", "content": ""}
    return msgs[:last], msgs[last]


def build_genrm_prompt(history: Sequence[Message], user_turn: Message | str,
                       response_1: Message | str | None, response_2: Message | str | None) -> list[Message]:
    """The judge's prompt (system + one user message) for one comparison."""
    turn = user_turn if isinstance(user_turn, str) else str(user_turn.get("content") or "")
    parts = []
    if history:
        parts.append("## Conversation so far\n" + "\n\n".join(_turn(m) for m in history))
    parts += [f"## New user turn\n{turn.strip()}",
              f"## Response 1\n{response_text(response_1)}",
              f"## Response 2\n{response_text(response_2)}",
              "Compare the two responses, then end with the three lines "
              "`Helpfulness 1: n`, `Helpfulness 2: n`, `Ranking: n`."]
    return [{"role": "system", "content": GENRM_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

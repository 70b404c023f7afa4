"""An LLM judge: any ``Generator`` asked to grade a conversation against a rubric.

Used by the environments whose reward no program can compute (multi-turn instruction following,
long-context QA; docs/recipe.md §2) and by SFT filtering of open-ended text (§1).

The output format is one line, and parsing is strict, because a lenient parser turns judge noise
into reward noise:

    <any reasoning, ignored>
    SCORE: n/10

``n`` is an integer from 0 to 10, and that line must be the last non-empty line of the reply
("SCORE" in any case, spaces around ``:`` and ``/`` allowed, nothing else on the line). A
``<think>`` block is removed first, so a reasoning judge may think before it writes. The verdict's
score is ``n / 10``; ``passed`` is ``score >= pass_threshold`` (0.7 by default: "mostly meets the
rubric"). A reply in any other shape scores 0 with reason ``judge_unparseable`` — never a guess —
and every verdict's reason is counted in ``LLMJudge.stats`` so a run can report how often the
judge itself failed (``judge_truncated`` counts replies that hit the token limit on top of that).

Judging is greedy (temperature 0) so the same conversation gets the same grade. A failure of the
judge's *transport* (server down after retries) raises: it says nothing about the graded model, and
a silent reward of 0 would train on it.

``make_judge(spec)`` builds a judge from a string: ``http://host:port/v1[#model]`` for an
OpenAI-compatible server, anything else for a local Hugging Face model (``HFGenerator.from_spec``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from posttrain.models.chat_template import split_reasoning
from posttrain.engines.base import Generator, Message, SamplingParams

UNPARSEABLE = "judge_unparseable"
SCORED = "judge_scored"
TRUNCATED = "judge_truncated"

JUDGE_SYSTEM = (
    "You are a careful, strict grader. You are shown a conversation between a user and an AI "
    "assistant, and a rubric. Decide how well the assistant's final response meets the rubric. "
    "Explain your reasoning in a few sentences. Then end your reply with one last line of exactly "
    "this form, and write nothing after it:\n"
    "SCORE: n/10\n"
    "where n is a whole number from 0 (does not meet the rubric at all) to 10 (fully meets it)."
)


@dataclass
class JudgeVerdict:
    score: float  # in [0, 1]
    passed: bool
    reason: str  # short label: judge_scored | judge_unparseable
    raw: str = ""  # the judge's whole reply
    rationale: str = ""  # the judge's explanation before the SCORE line (reasoning block removed)


_SCORE_RE = re.compile(r"^score\s*:\s*(\d{1,2})\s*/\s*10$", re.IGNORECASE)


def parse_score(raw: str) -> tuple[int, str] | None:
    """(n, rationale) from a judge reply ending in ``SCORE: n/10``; None if it does not."""
    _, answer = split_reasoning(raw)
    lines = [ln.strip() for ln in answer.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    m = _SCORE_RE.match(lines[-1])
    if not m or int(m.group(1)) > 10:
        return None
    return int(m.group(1)), "\n".join(lines[:-1])


def verdict_from_reply(raw: str, pass_threshold: float = 0.7) -> JudgeVerdict:
    parsed = parse_score(raw)
    if parsed is None:
        return JudgeVerdict(score=0.0, passed=False, reason=UNPARSEABLE, raw=raw)
    n, rationale = parsed
    score = n / 10
    return JudgeVerdict(score=score, passed=score >= pass_threshold, reason=SCORED, raw=raw, rationale=rationale)


# --------------------------------------------------------------------------- prompt


def _turn_text(m: Message) -> str:
    """One turn as the judge reads it. Assistant reasoning is removed: the judge grades what the
    user would see, not the scratchpad."""
    role = str(m.get("role", "?")).upper()
    content = m.get("content") or ""
    if m.get("role") == "assistant":
        _, content = split_reasoning(content)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            content += f"\n[calls tool {fn.get('name')} with {args}]"
    elif m.get("role") == "tool" and m.get("name"):
        role = f"TOOL {m['name']}"
    return f"[{role}]\n{content.strip()}"


def build_judge_prompt(
    conversation: Sequence[Message], rubric: str, reference: str | None = None
) -> list[Message]:
    """The standard judge prompt: the conversation as a transcript, the rubric, an optional
    reference answer, and the ``SCORE: n/10`` instruction."""
    transcript = "\n\n".join(_turn_text(m) for m in conversation)
    parts = [f"## Conversation\n{transcript}", f"## Rubric\n{rubric.strip()}"]
    if reference is not None:
        parts.append(f"## Reference answer\n{reference.strip()}")
    parts.append("Grade the assistant's final response. End with the line `SCORE: n/10`.")
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


# --------------------------------------------------------------------------- judge


class LLMJudge:
    """Grades judge prompts with a generator; ``stats`` counts verdict reasons over its lifetime."""

    def __init__(
        self,
        generator: Generator,
        max_new_tokens: int = 256,
        pass_threshold: float = 0.7,
        reasoning: bool = False,
    ) -> None:
        if not 0.0 <= pass_threshold <= 1.0:
            raise ValueError(f"pass_threshold must lie in [0, 1], got {pass_threshold}")
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.pass_threshold = pass_threshold
        self.reasoning = reasoning
        self.stats: dict[str, int] = {}

    def _count(self, reason: str) -> None:
        self.stats[reason] = self.stats.get(reason, 0) + 1

    def judge(self, messages: list[Message]) -> JudgeVerdict:
        return self.judge_many([messages])[0]

    def judge_many(self, list_of_messages: Sequence[list[Message]]) -> list[JudgeVerdict]:
        """One batched, greedy generate call for all prompts."""
        if not list_of_messages:
            return []
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=0.0, n=1, reasoning=self.reasoning
        )
        outputs = self.generator.generate(list_of_messages, params)
        verdicts = []
        for completions in outputs:
            c = completions[0]
            v = verdict_from_reply(c.text, self.pass_threshold)
            self._count(v.reason)
            if c.finish_reason == "length":
                self._count(TRUNCATED)
            verdicts.append(v)
        return verdicts


def make_judge(spec: str, **judge_kwargs: Any) -> LLMJudge:
    """``http://host:port/v1[#model]`` → an OpenAI-compatible server; anything else names a local
    Hugging Face model for ``HFGenerator.from_spec``."""
    generator: Generator
    if spec.startswith(("http://", "https://")):
        from posttrain.engines.openai_compat import OpenAIGenerator

        generator = OpenAIGenerator.from_spec(spec)
    else:
        from posttrain.engines.hf import HFGenerator  # heavy (torch); only when a local judge is asked for

        generator = HFGenerator.from_spec(spec)
    return LLMJudge(generator, **judge_kwargs)

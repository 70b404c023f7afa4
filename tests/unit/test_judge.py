"""LLMJudge: strict verdict parsing, one batched greedy call, stats, prompt building, make_judge."""

from __future__ import annotations

import sys
import types

import pytest

from posttrain.envs.judge import (
    JUDGE_SYSTEM,
    SCORED,
    TRUNCATED,
    UNPARSEABLE,
    LLMJudge,
    build_judge_prompt,
    make_judge,
    parse_score,
    verdict_from_reply,
)
from posttrain.engines.base import Completion


class ScriptedGenerator:
    """Returns canned replies in order and records every generate call."""

    def __init__(self, replies: list[str], finish: str = "stop") -> None:
        self.replies = list(replies)
        self.finish = finish
        self.calls: list[tuple[list, object]] = []

    def generate(self, prompts, params, tools=None):
        self.calls.append((list(prompts), params))
        return [[Completion(text=self.replies.pop(0), finish_reason=self.finish)] for _ in prompts]


@pytest.mark.parametrize(
    "raw, n",
    [
        ("The answer is correct and complete.\nSCORE: 10/10", 10),
        ("SCORE: 0/10", 0),
        ("meh\n\nscore : 7 / 10\n\n", 7),
        ("<think>\nSCORE: 2/10 maybe?\n</think>\nFine answer.\nSCORE: 8/10", 8),
    ],
)
def test_parse_score_accepts_the_documented_line(raw, n):
    parsed = parse_score(raw)
    assert parsed is not None and parsed[0] == n


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "Looks good to me.",
        "SCORE: 8/10\nThat is my grade.",  # not the last line
        "SCORE: 11/10",
        "SCORE: 7.5/10",
        "SCORE: 8",
        "**SCORE: 8/10**",
        "Final: SCORE: 8/10",
        "<think>\nSCORE: 9/10",  # unclosed reasoning: nothing after it
        "VERDICT: PASS",
    ],
)
def test_parse_score_rejects_everything_else(raw):
    assert parse_score(raw) is None


def test_verdict_scores_and_threshold():
    v = verdict_from_reply("Mostly right.\nSCORE: 7/10")
    assert (v.score, v.passed, v.reason, v.rationale) == (0.7, True, SCORED, "Mostly right.")
    v = verdict_from_reply("Mostly right.\nSCORE: 6/10")
    assert (v.score, v.passed) == (0.6, False)
    v = verdict_from_reply("SCORE: 6/10", pass_threshold=0.5)
    assert v.passed
    bad = verdict_from_reply("I think it deserves an 8.")
    assert (bad.score, bad.passed, bad.reason, bad.raw) == (0.0, False, UNPARSEABLE, "I think it deserves an 8.")


def test_judge_many_is_one_greedy_batched_call_and_counts_reasons():
    gen = ScriptedGenerator(["ok\nSCORE: 9/10", "no score here", "SCORE: 3/10"])
    judge = LLMJudge(gen, max_new_tokens=64)
    prompts = [build_judge_prompt([{"role": "user", "content": f"q{i}"}], "be right") for i in range(3)]
    verdicts = judge.judge_many(prompts)
    assert [v.score for v in verdicts] == [0.9, 0.0, 0.3]
    assert [v.passed for v in verdicts] == [True, False, False]
    assert len(gen.calls) == 1
    sent, params = gen.calls[0]
    assert sent == prompts
    assert params.temperature == 0.0 and params.n == 1 and params.max_new_tokens == 64
    assert judge.stats == {SCORED: 2, UNPARSEABLE: 1}
    assert judge.judge_many([]) == [] and len(gen.calls) == 1


def test_truncated_replies_are_counted():
    judge = LLMJudge(ScriptedGenerator(["I am still thinking about"], finish="length"))
    v = judge.judge(build_judge_prompt([{"role": "user", "content": "q"}], "r"))
    assert v.reason == UNPARSEABLE
    assert judge.stats == {UNPARSEABLE: 1, TRUNCATED: 1}


def test_build_judge_prompt_shows_answer_not_reasoning():
    conv = [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "<think>\nsecret plan\n</think>\nBonjour !"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}]},
        {"role": "tool", "name": "lookup", "content": "result"},
    ]
    msgs = build_judge_prompt(conv, "Reply in French.", reference="Bonjour")
    assert msgs[0] == {"role": "system", "content": JUDGE_SYSTEM}
    user = msgs[1]["content"]
    assert "Bonjour !" in user and "secret plan" not in user
    assert "[SYSTEM]\nAnswer in French." in user
    assert '[calls tool lookup with {"q": "x"}]' in user
    assert "[TOOL lookup]\nresult" in user
    assert "## Rubric\nReply in French." in user and "## Reference answer\nBonjour" in user
    assert "SCORE: n/10" in JUDGE_SYSTEM


def test_pass_threshold_is_validated():
    with pytest.raises(ValueError):
        LLMJudge(ScriptedGenerator([]), pass_threshold=1.5)


def test_make_judge_picks_the_backend_from_the_spec(monkeypatch):
    from posttrain.engines.openai_compat import OpenAIGenerator

    judge = make_judge("http://127.0.0.1:9/v1#judge-model", max_new_tokens=32)
    assert isinstance(judge.generator, OpenAIGenerator)
    assert judge.generator.base_url == "http://127.0.0.1:9/v1" and judge.generator.model == "judge-model"
    assert judge.max_new_tokens == 32

    seen = []
    fake = types.ModuleType("posttrain.engines.hf")

    class HFGenerator:
        @classmethod
        def from_spec(cls, spec):
            seen.append(spec)
            return ScriptedGenerator(["SCORE: 10/10"])

    fake.HFGenerator = HFGenerator
    monkeypatch.setitem(sys.modules, "posttrain.engines.hf", fake)
    judge = make_judge("embedded")
    assert seen == ["embedded"]
    assert judge.judge([{"role": "user", "content": "x"}]).score == 1.0

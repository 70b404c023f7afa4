"""GenRM pairs whose better side is visible (envs/genrm/visible_pairs.py), the judge-quality targets,
the per-source breakdown, and a judge behind an OpenAI-compatible endpoint scored by the same code."""

from __future__ import annotations

import random
import re

import pytest
from fastapi import FastAPI, Request

from posttrain.algos.genrm import rank_from_scores, score_from_reward
from posttrain.envs.base import make_env
from posttrain.envs.genrm.env import GenRMEnv
from posttrain.envs.genrm.evaluate import agreement_from_rows, genrm_agreement, judge_targets
from posttrain.envs.genrm.format import response_text
from posttrain.envs.genrm.judge import make_generator
from posttrain.envs.genrm.visible_pairs import (BUILDERS, INSTRUCTION_ARGS, KINDS, cut_mid_word, doubled,
                                                drop_first_line, drop_last_line, shortcut_accuracy, strip_markup,
                                                visible_pairs)
from posttrain.serving.server import running_server


def test_edits_by_hand():
    text = "<<Title>>\nBody *one* here.\n\nP.S. bye"
    assert drop_last_line(text) == "<<Title>>\nBody *one* here."
    assert drop_first_line(text) == "Body *one* here.\n\nP.S. bye"
    assert doubled("a b") == "a b\n\na b"
    assert strip_markup(text) == "Title\nBody one here.\n\nP.S. bye"
    cut = cut_mid_word("alpha beta gamma delta epsilon", random.Random(0))
    assert 0 < len(cut) < 30 and cut[-1].isalnum()


@pytest.mark.parametrize("kind", KINDS)
def test_every_pair_follows_the_rule(kind):
    """The rule by hand on every pair of a kind: the good reply passes its verifier outright (h = 5),
    the other scores 1 + round(4·q) with q its share of checks held, and the ranking follows."""
    pairs = BUILDERS[kind]("train", 12, 0)
    assert len(pairs) >= 6, f"{kind}: the verifier separated only {len(pairs)} of 12"
    envs = {"instruction": make_env("instruction", **INSTRUCTION_ARGS), "arithmetic": make_env("arithmetic")}
    tasks = {t.id: (e, t) for e in envs.values() for t in e.tasks("train", 40, seed=0)}
    tasks.update({t.id: (e, t) for e in envs.values() for s in range(1, 6) for t in e.tasks("train", 40, seed=s)})
    for p in pairs:
        env, task = tasks[p.metadata["task_id"]]
        good, bad = env.verify(task, [p.response_1]), env.verify(task, [p.response_2])
        assert good.reward == 1.0 and p.truth.h1 == 5
        checks = [v for v in bad.components.values()] if env.name == "instruction" else [bad.reward]
        q = sum(checks) / len(checks)
        assert q < 1 and p.truth.h2 == score_from_reward(q) and p.truth.rank == rank_from_scores(5, p.truth.h2)
        assert p.source == f"visible/{kind}" and p.messages == task.messages


def test_kinds_show_what_they_say():
    by = {k: BUILDERS[k]("train", 8, 0) for k in KINDS}
    assert all(p.response_2.get("tool_calls") and not p.response_1.get("tool_calls") for p in by["tool_unfit"])
    assert all(re.search(r"Answer: (\\boxed\{|\()-?\d", p.response_2["content"]) for p in by["malformed"])
    for p in by["truncated"]:
        assert p.response_1["content"].startswith(p.response_2["content"]) and p.response_2["content"] != p.response_1["content"]
    assert all(p.metadata["detail"] != p.metadata["task_id"] for p in by["off_topic"])


def test_held_out_pairs_come_from_held_out_prompts_only():
    seen = {}
    for split in ("train", "dev", "test"):
        seen[split] = {p.metadata["task_id"] for p in visible_pairs(split, 10)}
        assert seen[split]
    assert not (seen["train"] & seen["test"]) and not (seen["train"] & seen["dev"]) and not (seen["dev"] & seen["test"])
    env = GenRMEnv(visible_pairs=6, visible_val_pairs=4)
    test_ids = {p.id for p in env.pairs("test")}
    assert test_ids and not test_ids & {p.id for p in env.pairs("train")}
    assert {p.source for p in env.pairs("test")} == {f"visible/{k}" for k in KINDS}
    with pytest.raises(ValueError, match="unknown visible_kinds"):
        GenRMEnv(visible_pairs=2, visible_kinds=["vibes"])


def test_shortcut_accuracy_by_hand():
    from posttrain.algos.genrm import Judgement
    from posttrain.envs.genrm.pairs import PreferencePair

    def pair(a, b, kind):
        return PreferencePair("x", [{"role": "user", "content": "q"}], a, b, Judgement(5, 1, 1), "s", {"kind": kind})

    acc = shortcut_accuracy([pair("long answer", "s", "k1"), pair("s", "long answer", "k1"), pair("aa", "bb", "k2")])
    assert acc["all/longer_wins"] == pytest.approx(1 / 3) and acc["all/shorter_wins"] == pytest.approx(1 / 3)
    assert acc["k1/longer_wins"] == 0.5 and acc["k2/longer_wins"] == 0.0 and acc["k2/shorter_wins"] == 0.0


def test_judge_targets_by_hand():
    good = {"n": 226, "rank_side_acc": 0.71, "prefers_first": 0.55, "order_consistency": 0.6, "format_error_rate": 0.02}
    assert all(judge_targets(good).values())
    bad = {**good, "prefers_first": 0.61, "n": 199, "order_consistency": float("nan")}
    assert judge_targets(bad) == {"rank_side_acc": True, "prefers_first": False, "order_consistency": False,
                                  "format_error_rate": True, "n": False}


def test_agreement_breaks_down_by_source():
    def row(src, ok, swapped, rank):
        return {"task_id": "t", "pair_id": src + str(ok), "swapped": swapped, "format_error": 0.0, "rank_sign_ok": ok,
                "h1_err": 0, "h2_err": 0, "rank_err": 0, "reward": 1.0, "pred_rank": rank, "source": src}

    rows = [row("a", 1.0, False, 1), row("a", 1.0, True, 6), row("b", 0.0, False, 6), row("b", 1.0, True, 6)]
    out = agreement_from_rows(rows)
    assert out["by/a/rank_side_acc"] == 1.0 and out["by/b/rank_side_acc"] == 0.5 and out["by/b/prefers_first"] == 0.0
    assert "by/a/n" in out and agreement_from_rows(rows[:2]).keys().isdisjoint({"by/a/n"})


def _longer_wins_judge() -> FastAPI:
    """A chat-completions server whose 'model' prefers the longer response (a test stand-in for a
    larger judge): it reads the two responses out of the GenRM prompt, as any judge model must."""
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "longer-judge", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        user = body["messages"][-1]["content"]
        r1 = user.split("## Response 1\n", 1)[1].split("\n\n## Response 2\n", 1)[0]
        r2 = user.split("## Response 2\n", 1)[1].rsplit("\n\nCompare the two responses", 1)[0]
        first = len(r1) > len(r2)
        verdict = f"Longer wins.\nHelpfulness 1: {5 if first else 1}\nHelpfulness 2: {1 if first else 5}\nRanking: {1 if first else 6}"
        return {"id": "x", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": verdict}, "finish_reason": "stop"}]}

    return app


def test_a_judge_behind_an_endpoint_is_scored_by_the_same_code():
    env = GenRMEnv(visible_pairs=4, visible_val_pairs=6, visible_kinds=["constraint", "truncated"])
    with running_server(_longer_wins_judge()) as url:
        figures = genrm_agreement(make_generator(None, f"{url}/v1"), env, "test", max_new_tokens=64)
    pairs = env.pairs("test")
    short = shortcut_accuracy(pairs)
    assert figures["n"] == 2 * len(pairs) and figures["format_error_rate"] == 0.0
    # the endpoint judge is "longer wins": its ranking-side accuracy per kind is that shortcut's, in both orders
    assert figures["by/visible/truncated/rank_side_acc"] == pytest.approx(short["truncated/longer_wins"]) == 1.0
    ties = 1 - short["constraint/longer_wins"] - short["constraint/shorter_wins"]  # equal lengths: response 2, so right in one order
    assert figures["by/visible/constraint/rank_side_acc"] == pytest.approx(short["constraint/longer_wins"] + ties / 2)
    assert figures["order_consistency"] == pytest.approx(1 - ties * 6 / len(pairs)) and 0.4 < figures["prefers_first"] < 0.6
    assert response_text(pairs[0].response_1)  # the responses the server read were the rendered ones


def test_cue_reasoning_names_the_defect_then_the_worse_side():
    from posttrain.envs.genrm.visible_pairs import cue_reasoning

    p = BUILDERS["truncated"]("train", 4, 0)[0]
    assert cue_reasoning(p, False) == "One reply stops mid-sentence: response 2. Response 1 does what was asked."
    assert cue_reasoning(p, True) == "One reply stops mid-sentence: response 1. Response 2 does what was asked."
    c = BUILDERS["constraint"]("train", 8, 0)
    for q in c:  # the verifier's own reason, without its "failed: name (...)" wrapping
        why = q.metadata["failed"].split("(", 1)[1].rsplit(")", 1)[0]
        assert cue_reasoning(q, False).startswith(f"One reply breaks a rule the user stated ({why}): response 2.")
    unkind = type(p)(p.id, p.messages, p.response_1, p.response_2, p.truth, "mined", {})
    assert cue_reasoning(unkind, False) is None


def test_cue_warmstart_rows_agree_with_their_verdict_and_need_true_verdicts():
    from posttrain.envs.genrm.env import warmstart_conversations
    from posttrain.envs.genrm.format import parse_judgement

    env = GenRMEnv(visible_pairs=3, visible_val_pairs=2, math_pairs=0)
    rows = warmstart_conversations(env, "truth", reasoning="cue")
    assert len(rows) == len(env.tasks("train")) >= 20
    for row in rows:
        reply = row["messages"][-1]["content"]
        worse = int(re.search(r": response (\d)\. Response (\d) does what was asked\.", reply).group(1))
        j = parse_judgement(reply)
        assert (j.rank >= 4) == (worse == 1), reply  # the side the rationale names is the side the verdict ranks lower
    with pytest.raises(ValueError, match="needs verdicts='truth'"):
        warmstart_conversations(env, "random", reasoning="cue")
    with pytest.raises(ValueError, match="restate' or 'cue'"):
        warmstart_conversations(env, "truth", reasoning="why")

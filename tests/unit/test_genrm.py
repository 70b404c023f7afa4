"""GenRM: the reward by hand (with swaps), the strict parser on malformed judgements, ring pairing
and the tie-break on hand-made groups, the judge's retries and neutral fallback, the genrm
environment (both orders, disjoint splits) and the reward scorer on a fake judge."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posttrain.algos.genrm import (Judgement, genrm_reward, genrm_reward_unit, rank_from_scores, ring_base_rewards,
                                   ring_pairs, score_from_reward, swap_truth, tie_break)
from posttrain.engines.base import Completion
from posttrain.envs.genrm.env import GenRMEnv, score_judgement
from posttrain.envs.genrm.format import (EMPTY_RESPONSE, ParseFailure, build_genrm_prompt, format_judgement,
                                         parse_judgement, response_text)
from posttrain.envs.genrm.judge import NEUTRAL, GenRMJudge
from posttrain.envs.genrm.pairs import PairsError, pair_from_dict, read_pairs

J = Judgement

# --------------------------------------------------------------------------- reward by hand


def test_genrm_reward_by_hand():
    truth = J(5, 2, 2)
    assert genrm_reward(J(5, 2, 2), truth) == 0
    # |4-5| + |3-2| + 1·|3-2| = 3
    assert genrm_reward(J(4, 3, 3), truth) == -3
    # |1-5| + |5-2| + |6-2| = 11
    assert genrm_reward(J(1, 5, 6), truth) == -11
    # C2 = 2 doubles the ranking term: 1 + 1 + 2·1
    assert genrm_reward(J(4, 3, 3), truth, c2=2.0) == -4
    # format error: C1 + the largest distances 4 + 4 + 5·C2 = 23: below any parseable judgement
    assert genrm_reward(None, truth) == -23
    assert genrm_reward(None, truth) < genrm_reward(J(1, 5, 6), J(5, 1, 1)) == -13
    assert genrm_reward_unit(J(5, 2, 2), truth) == 1.0 and genrm_reward_unit(None, truth) == 0.0
    assert genrm_reward_unit(J(4, 3, 3), truth) == pytest.approx(1 - 3 / 23)


def test_swapped_pair_reward_by_hand():
    truth = J(5, 2, 2)
    swapped = swap_truth(truth)
    assert swapped == J(2, 5, 5)
    assert swap_truth(swapped) == truth
    # a judge with position bias that always prefers response 1: exact on the given order, off on the swap
    biased = J(5, 2, 2)
    assert genrm_reward(biased, truth) == 0
    assert genrm_reward(biased, swapped) == -(3 + 3 + 3)
    # a consistent judge that swaps its answer scores the same on both orders
    assert genrm_reward(J(4, 2, 3), truth) == genrm_reward(swap_truth(J(4, 2, 3)), swapped) == -2


def test_ground_truth_rules():
    assert [rank_from_scores(5, 1), rank_from_scores(4, 2), rank_from_scores(3, 2), rank_from_scores(2, 3),
            rank_from_scores(2, 4), rank_from_scores(1, 5), rank_from_scores(3, 3)] == [1, 2, 3, 4, 5, 6, None]
    assert [score_from_reward(r) for r in (0.0, 0.5, 1.0, 1.7, -1)] == [1, 3, 5, 5, 1]


# --------------------------------------------------------------------------- parser


GOOD = "Response 1 is correct, response 2 is not.\nHelpfulness 1: 5\nHelpfulness 2: 1\nRanking: 1"


@pytest.mark.parametrize("raw, reason", [
    ("", "empty"), ("   \n ", "empty"), (None, "empty"), (42, "empty"),
    ("<think>I am still thinking", "no_answer"),
    ("<think>x</think>", "no_answer"),
    ("Helpfulness 1: 5\nRanking: 1", "missing_lines"),
    ("Helpfulness 1: 5\nHelpfulness 2: 1\nRanking: 1\nThanks!", "bad_line"),  # something after the verdict
    ("Helpfulness 2: 1\nHelpfulness 1: 5\nRanking: 1", "bad_line"),  # wrong order
    ("Helpfulness 1: 5/5\nHelpfulness 2: 1\nRanking: 1", "bad_line"),
    ("Helpfulness 1: five\nHelpfulness 2: 1\nRanking: 1", "bad_line"),
    ("Helpfulness 1: 4.5\nHelpfulness 2: 1\nRanking: 1", "bad_line"),
    ("Score 1: 5\nScore 2: 1\nRanking: 1", "bad_line"),
    ("Helpfulness 1: 6\nHelpfulness 2: 1\nRanking: 1", "out_of_range"),
    ("Helpfulness 1: 5\nHelpfulness 2: 0\nRanking: 1", "out_of_range"),
    ("Helpfulness 1: 5\nHelpfulness 2: 1\nRanking: 7", "out_of_range"),
    ("Helpfulness 1: 5\nHelpfulness 2: 1\nRanking: -1", "out_of_range"),
    ("Helpfulness 1: 5\nHelpfulness 2: 1\nRanking: 99999999", "bad_line"),
])
def test_parser_malformed_is_a_typed_failure(raw, reason):
    out = parse_judgement(raw)
    assert isinstance(out, ParseFailure) and out.reason == reason


def test_parser_accepts_the_strict_format_with_reasoning_case_and_spaces():
    assert parse_judgement(GOOD) == J(5, 1, 1)
    assert parse_judgement("<think>hmm</think>\nok\nhelpfulness 1 :3\nHELPFULNESS  2: 4\nranking:4\n\n") == J(3, 4, 4)
    assert parse_judgement(format_judgement(J(2, 5, 6), "because")) == J(2, 5, 6)


def test_parser_never_raises_on_junk():
    import random

    rng = random.Random(0)
    alphabet = "Helpfulness Ranking:0123456789\n<think></think>-/ "
    for _ in range(500):
        raw = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        assert isinstance(parse_judgement(raw), (Judgement, ParseFailure))


def test_prompt_strips_reasoning_and_shows_empty_answers():
    msgs = build_genrm_prompt([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>x</think>hello"}],
                              {"role": "user", "content": "What is 2+2?"},
                              {"role": "assistant", "content": "<think>secret plan</think>4"},
                              {"role": "assistant", "content": "<think>never finished"})
    text = msgs[1]["content"]
    assert "secret plan" not in text and "never finished" not in text and "x</think>" not in text
    assert "## Response 1\n4\n" in text and f"## Response 2\n{EMPTY_RESPONSE}" in text
    assert "## New user turn\nWhat is 2+2?" in text and "[ASSISTANT]\nhello" in text
    assert msgs[0]["role"] == "system" and "Ranking: <1-6>" in msgs[0]["content"]
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get", "arguments": {"a": 1}}}]}
    assert response_text(call) == '[calls tool get with {"a": 1}]'


# --------------------------------------------------------------------------- ring and tie-break


def test_ring_pairs():
    assert ring_pairs(4) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert ring_pairs(2) == [(0, 1), (1, 0)]
    assert ring_pairs(1) == [] and ring_pairs(0) == []
    for n in (2, 3, 5, 16):  # each response once in each position
        pairs = ring_pairs(n)
        assert len(pairs) == n
        assert sorted(i for i, _ in pairs) == list(range(n)) == sorted(j for _, j in pairs)


def test_tie_break():
    assert tie_break(4, 4, 1) == (6.5, 1.5)  # equal scores, response 1 far better
    assert tie_break(4, 4, 6) == (1.5, 6.5)
    assert tie_break(3, 3, 3) == (3.5, 2.5)
    assert tie_break(3, 3, 3.5) == (3, 3)  # the neutral fallback moves nothing
    assert tie_break(5, 2, 6) == (5, 2)  # unequal: unchanged, whatever the ranking
    s_i, s_j = tie_break(2, 2, 5)
    assert s_i + s_j == 4  # zero-sum


def test_ring_base_rewards_on_a_hand_made_group():
    # 3 responses; comparisons (0,1), (1,2), (2,0)
    verdicts = [J(4, 2, 2),   # 0: 4, 1: 2
                J(3, 3, 2),   # tie, ranking 2: 1: 3 + 1.5 = 4.5, 2: 3 − 1.5 = 1.5
                J(5, 5, 4)]   # tie, ranking 4: 2: 5 − 0.5 = 4.5, 0: 5 + 0.5 = 5.5
    assert ring_base_rewards(3, verdicts) == [pytest.approx((4 + 5.5) / 2), pytest.approx((2 + 4.5) / 2),
                                              pytest.approx((1.5 + 4.5) / 2)]
    assert ring_base_rewards(1, []) == [0.0]
    # two responses: (0, 1) then (1, 0); in the second, response 1 is in position 1
    assert ring_base_rewards(2, [J(5, 1, 1), J(2, 4, 5)]) == [4.5, 1.5]  # 0: (5 + 4)/2, 1: (1 + 2)/2
    with pytest.raises(ValueError):
        ring_base_rewards(3, verdicts[:2])


# --------------------------------------------------------------------------- the judge


class ScriptedGenerator:
    """Replies from a list per call (cycling the last); records what it was asked."""

    def __init__(self, replies_per_call):
        self.replies_per_call, self.calls = list(replies_per_call), []

    def generate(self, prompts, params, tools=None):
        self.calls.append((len(prompts), params.temperature))
        replies = self.replies_per_call.pop(0) if len(self.replies_per_call) > 1 else self.replies_per_call[0]
        return [[Completion(replies[i % len(replies)], token_ids=[1, 2, 3])] for i in range(len(prompts))]


def test_judge_retries_then_falls_back_and_counts():
    gen = ScriptedGenerator([[GOOD, "garbage"], ["still garbage"], ["Helpfulness 1: 9"]])
    judge = GenRMJudge(gen, retries=2, retry_temperature=0.7)
    out = judge.judge_many([[{"role": "user", "content": str(i)}] for i in range(2)])
    assert out == [J(5, 1, 1), NEUTRAL]
    assert gen.calls == [(2, 0.0), (1, 0.7), (1, 0.7)]  # first pass greedy and batched, retries only the failed
    assert judge.stats["calls"] == 2 and judge.stats["retries"] == 2 and judge.stats["fallbacks"] == 1
    assert judge.stats["failure/missing_lines"] == 3
    assert judge.stats["generated"] == 4
    unbatched = ScriptedGenerator([[GOOD]])
    GenRMJudge(unbatched, batched=False).judge_many([[{"role": "user", "content": "a"}]] * 3)
    assert unbatched.calls == [(1, 0.0)] * 3
    sampled = ScriptedGenerator([["nope"], [GOOD]])
    assert GenRMJudge(sampled, retries=1, temperature=1.0).judge_many([[{"role": "user", "content": "a"}]]) == [J(5, 1, 1)]
    assert sampled.calls == [(1, 1.0), (1, 0.7)]  # a sampled first pass; retries at retry_temperature
    with pytest.raises(ValueError):
        GenRMJudge(sampled, temperature=-1.0)


def test_judge_retry_can_recover():
    gen = ScriptedGenerator([["nope"], [GOOD]])
    judge = GenRMJudge(gen, retries=1)
    assert judge.judge_many([[{"role": "user", "content": "q"}]]) == [J(5, 1, 1)]
    assert judge.stats.get("fallbacks", 0) == 0 and judge.stats["retries"] == 1


# --------------------------------------------------------------------------- pairs and the environment


def _pairs_file(tmp_path, n=20):
    rows = [{"prompt": f"Question {i}?", "chosen": f"Good answer {i}.", "rejected": f"bad {i}"} for i in range(n)]
    rows.append({"messages": [{"role": "user", "content": "Hi"}], "response_1": "a", "response_2": "b",
                 "helpfulness_1": 2, "helpfulness_2": 3, "ranking": 4, "id": "scored"})
    p = tmp_path / "prefs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_pairs_formats_and_errors(tmp_path):
    pairs = read_pairs(_pairs_file(tmp_path))
    assert pairs[0].truth == J(4, 2, 2) and pairs[0].messages == [{"role": "user", "content": "Question 0?"}]
    assert pairs[-1].id == "scored" and pairs[-1].truth == J(2, 3, 4)
    with pytest.raises(PairsError, match="ranking"):
        pair_from_dict({"prompt": "x", "response_1": "a", "response_2": "b", "helpfulness_1": 2, "helpfulness_2": 3,
                        "ranking": 9}, "f:1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(PairsError, match="bad.jsonl:1"):
        read_pairs(bad)


def test_genrm_env_both_orders_and_disjoint_splits(tmp_path):
    env = GenRMEnv(pairs=str(_pairs_file(tmp_path)), val_frac=0.3)
    train, val, test = env.tasks("train"), env.tasks("dev"), env.tasks("test")
    assert len(train) % 2 == 0 and len(val) % 2 == 0 and len(train) + len(val) + len(test) == 42 and val and test
    ids_t = {t.metadata["pair_id"] for t in train}
    assert not ids_t & {t.metadata["pair_id"] for t in val} and not (ids_t | {t.metadata["pair_id"] for t in val}) & {
        t.metadata["pair_id"] for t in test}
    given, swapped = train[0], train[1]
    assert given.metadata["pair_id"] == swapped.metadata["pair_id"] and swapped.metadata["swapped"]
    assert swapped.ground_truth == {"h1": 2, "h2": 4, "rank": 5} and given.ground_truth == {"h1": 4, "h2": 2, "rank": 2}
    r1 = given.messages[1]["content"].split("## Response 1\n")[1].split("\n")[0]
    assert swapped.messages[1]["content"].split("## Response 2\n")[1].startswith(r1)
    perfect = {"role": "assistant", "content": format_judgement(J(4, 2, 2), "r1 better")}
    res = env.verify(given, [perfect])
    assert res.reward == 1.0 and res.reason == "ok" and res.components["rank_sign_ok"] == 1.0
    res = env.verify(swapped, [perfect])  # the same verdict on the swapped order: 2 + 2 + 3 = 7
    assert res.components["R"] == -7 and res.reward == pytest.approx(1 - 7 / 23) and res.components["rank_sign_ok"] == 0
    res = env.verify(given, [{"role": "assistant", "content": "I like both"}])
    assert res.reward == 0.0 and res.reason == "format:missing_lines" and res.components["format_error"] == 1.0
    assert score_judgement("", J(1, 5, 6)).reason == "format:empty"


# --------------------------------------------------------------------------- the reward scorer


class _R:
    def __init__(self, group, answer, think=""):
        self.group, self.task = group, type("T", (), {"messages": [{"role": "user", "content": f"q{group}"}]})()
        content = (f"<think>{think}</think>" if think else "") + answer
        self.messages = [{"role": "assistant", "content": content}]
        self.reward, self.reason = 0.0, ""


class PreferLonger:
    """A fake judge: helpfulness = min(5, 1 + len(answer) // 2) from the prompt text."""

    def __init__(self):
        self.stats, self.batches = {}, []

    def judge_many(self, prompts, seed=None):
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            text = p[1]["content"]
            a = text.split("## Response 1\n")[1].split("\n\n## Response 2")[0]
            b = text.split("## Response 2\n")[1].split("\n\nCompare")[0]
            out.append(J(min(5, 1 + len(a) // 2), min(5, 1 + len(b) // 2), 3.5))
        return out


def test_genrm_reward_scorer_judges_the_whole_step_in_one_batch():
    from posttrain.configs.rlhf import LengthControlConfig
    from posttrain.scorers.genrm import GenRMReward

    rollouts = [_R(0, "aa"), _R(0, "aaaa"), _R(0, "aaaaaa"), _R(1, "b", "tt"), _R(1, "bbb", "t")]
    judge = PreferLonger()
    m = GenRMReward(judge, None, LengthControlConfig(enabled=False))(rollouts)
    assert judge.batches == [5]  # 3 ring comparisons + 2 (both orders) in one call
    # group 0: scores 2, 3, 4 (each response has the same score in both its comparisons)
    assert [r.reward for r in rollouts[:3]] == [2, 3, 4]
    # group 1: "b" → 1, "bbb" → 2 (the reasoning is not shown to the judge)
    assert [r.reward for r in rollouts[3:]] == [1, 2]
    assert m["genrm_comparisons"] == 5 and m["think_len_mean"] == pytest.approx(3 / 5)
    # base spread: group 0 (2, 3, 4) → std sqrt(2/3); group 1 (1, 2) → 0.5; neither group is flat
    assert m["reward_base_group_std"] == pytest.approx(((2 / 3) ** 0.5 + 0.5) / 2)
    assert m["reward_base_flat_frac"] == 0.0
    flat = [_R(0, "aa"), _R(0, "bb"), _R(1, "c"), _R(1, "dddd")]  # group 0 flat (2, 2); group 1 (1, 3)
    m = GenRMReward(PreferLonger(), None, LengthControlConfig(enabled=False))(flat)
    assert m["reward_base_flat_frac"] == 0.5 and m["reward_base_group_std"] == pytest.approx(0.5)
    rollouts = [_R(0, "aa"), _R(0, "aaaa"), _R(0, "aaaaaa")]
    GenRMReward(judge, None, LengthControlConfig(unit="chars"))(rollouts)
    # answers 2, 4, 6 chars: w = 1, .5, 0 → w̃ = .5, 0, −.5; ×0.5; no reasoning: no think term;
    # bonus to the shortest answer only if its base (2) ≥ the 80th percentile (3.6): no
    assert [r.reward for r in rollouts] == [2.25, 3.0, 3.75]
    # scale: base_std → the same length terms times the group's base std sqrt(2/3)
    rollouts = [_R(0, "aa"), _R(0, "aaaa"), _R(0, "aaaaaa")]
    GenRMReward(judge, None, LengthControlConfig(unit="chars", scale="base_std"))(rollouts)
    sd = (2 / 3) ** 0.5
    assert [r.reward for r in rollouts] == pytest.approx([2 + 0.25 * sd, 3.0, 4 - 0.25 * sd])
    # an empty answer is counted and, by default, gets the longest's weight: the judge sees
    # "(empty response)" (16 chars → 5), "aaaa" → 3, "aaaaaa" → 4; answers 0, 4, 6 chars → w 0, 1, 0
    rollouts = [_R(0, ""), _R(0, "aaaa"), _R(0, "aaaaaa")]
    m = GenRMReward(judge, None, LengthControlConfig(unit="chars", bonus=0.0))(rollouts)
    assert m["answer_empty_frac"] == pytest.approx(1 / 3)
    assert [r.reward for r in rollouts] == pytest.approx([5 - 1 / 6, 3 + 1 / 3, 4 - 1 / 6])


def test_recipes_load_and_configs_check_their_sections():
    from pathlib import Path

    from posttrain.configs import ConfigError, load_config
    from posttrain.configs.dpo import DPOConfig
    from posttrain.configs.rlhf import GenRMConfig, RLHFConfig

    root = Path(__file__).parents[2] / "recipes"
    assert load_config(RLHFConfig, root / "rlhf.yaml").judge.model == "runs/genrm/best"
    assert load_config(GenRMConfig, root / "genrm.yaml").envs[0].name == "genrm"
    assert load_config(DPOConfig, root / "dpo.yaml").loss.variant == "sigmoid"
    with pytest.raises(ConfigError, match="genrm environment alone"):
        load_config(GenRMConfig, None, ["envs=[{name: math}]"])
    with pytest.raises(ConfigError, match="not both"):
        load_config(RLHFConfig, None, ["judge.model=x", "judge.url=http://h/v1"])
    assert load_config(RLHFConfig, root / "rlhf_judge_evidence.yaml").judge.verdict in ("text", "expected")
    with pytest.raises(ConfigError, match="needs judge.model"):
        load_config(RLHFConfig, None, ["judge.verdict=expected", "judge.url=http://h/v1"])
    with pytest.raises(ConfigError, match="verdict"):
        load_config(RLHFConfig, None, ["judge.verdict=probability"])
    with pytest.raises(ConfigError, match="loss.variant"):
        load_config(DPOConfig, None, ["loss.variant=hinge"])


def test_agreement_shows_position_bias_and_format_errors(tmp_path):
    from posttrain.envs.genrm.evaluate import genrm_agreement

    env = GenRMEnv(pairs=str(_pairs_file(tmp_path)), val_frac=0.3)
    n = len(env.tasks("dev"))
    # always "response 1 is better": exact on the given order of a chosen/rejected pair, wrong on the swap
    figures = genrm_agreement(ScriptedGenerator([["Helpfulness 1: 4\nHelpfulness 2: 2\nRanking: 2"]]), env, "dev",
                              records=tmp_path / "replies.jsonl")
    assert figures["n"] == n and figures["format_error_rate"] == 0
    assert figures["prefers_first"] == 1.0 and figures["order_consistency"] == 0.0
    assert figures["given/rank_side_acc"] == 1.0 and figures["swapped/rank_side_acc"] == 0.0
    assert figures["rank_side_acc"] == 0.5 and figures["given/reward"] == 1.0
    assert figures["swapped/h_abs_err"] == 2.0 and figures["swapped/rank_abs_err"] == 3.0
    assert len((tmp_path / "replies.jsonl").read_text().splitlines()) == n
    bad = genrm_agreement(ScriptedGenerator([["no verdict"]]), env, "dev")
    assert bad["format_error_rate"] == 1.0 and bad["rank_side_acc"] == 0.0 and bad["reward"] == 0.0


class TwoVerdicts:
    """Sampled judge stand-in: params.n replies per prompt, alternating "1 better" / "2 better"."""

    def __init__(self):
        self.params = []

    def generate(self, prompts, params, tools=None):
        self.params.append(params)
        v = ["Helpfulness 1: 4\nHelpfulness 2: 2\nRanking: 2", "Helpfulness 1: 2\nHelpfulness 2: 4\nRanking: 5"]
        return [[Completion(v[j % 2], token_ids=[1]) for j in range(params.n)] for _ in prompts]


def test_sampled_agreement_scores_every_reply_and_pairs_sample_by_sample(tmp_path):
    from posttrain.envs.genrm.evaluate import genrm_agreement

    env = GenRMEnv(pairs=str(_pairs_file(tmp_path)), val_frac=0.3)
    n = len(env.tasks("dev"))
    gen = TwoVerdicts()
    f = genrm_agreement(gen, env, "dev", temperature=1.0, samples=2, seed=3, records=tmp_path / "r.jsonl")
    assert gen.params[0].n == 2 and gen.params[0].temperature == 1.0 and gen.params[0].seed == 3
    assert f["n"] == 2 * n and len((tmp_path / "r.jsonl").read_text().splitlines()) == 2 * n
    # sample 0 always prefers position 1, sample 1 position 2: half right, no order consistency
    assert f["rank_side_acc"] == 0.5 and f["prefers_first"] == 0.5 and f["order_consistency"] == 0.0
    with pytest.raises(ValueError):
        genrm_agreement(gen, env, "dev", temperature=0.0, samples=2)


def test_genrm_env_weights_are_settable(tmp_path):
    env = GenRMEnv(pairs=str(_pairs_file(tmp_path)), val_frac=0.3, c2=2.0)
    given = env.tasks("train")[0]  # truth (4, 2, 2)
    res = env.verify(given, [{"role": "assistant", "content": format_judgement(J(4, 2, 3))}])
    assert res.components["R"] == -2.0 and res.reward == pytest.approx(1 - 2 / (10 + 8 + 10))
    assert env.verify(given, [{"role": "assistant", "content": ""}]).components["R"] == -28


def test_warmstart_rows_teach_the_format_only_and_never_show_held_out_pairs(tmp_path):
    from collections import Counter

    from posttrain.envs.genrm.env import warmstart_conversations

    env = GenRMEnv(pairs=str(_pairs_file(tmp_path)), val_frac=0.3)
    val_prompts = {json.dumps(t.messages) for t in env.tasks("dev")}
    rows = warmstart_conversations(env, "random", seed=0)
    assert len(rows) == len(env.tasks("train"))
    verdicts = []
    for row, task in zip(rows, env.tasks("train")):
        *prompt, reply = row["messages"]
        assert json.dumps(prompt) not in val_prompts and prompt == task.messages
        j = parse_judgement(reply["content"])
        assert isinstance(j, Judgement), reply["content"]  # every row is in the strict format
        assert (j.h1 > j.h2 and j.rank <= 3) or (j.h1 < j.h2 and j.rank >= 4) or (j.h1 == j.h2 and j.rank in (3, 4))
        assert reply["content"].startswith("Response 1 says: ")
        verdicts.append(j.rank <= 3)
    # random verdicts: no side is favoured (position information would leak through a skew)
    assert 0.25 < Counter(verdicts)[True] / len(verdicts) < 0.75
    truth = warmstart_conversations(env, "truth")
    for row, task in zip(truth, env.tasks("train")):
        j = parse_judgement(row["messages"][-1]["content"])
        assert (j.h1, j.h2, j.rank) == (task.ground_truth["h1"], task.ground_truth["h2"], task.ground_truth["rank"])


# --------------------------------------------------------------------------- expected verdicts


@pytest.fixture(scope="module")
def tiny_judge_model():
    from posttrain.models.loading import load_model

    loaded = load_model("tiny-llama", device="cpu")
    return loaded.model, loaded.tokenizer


def test_expected_value_by_hand():
    from posttrain.envs.genrm.judge import expected_value

    assert expected_value([0.0, 0.0], [1, 5]) == pytest.approx(3.0)
    # softmax([ln 3, 0]) = [0.75, 0.25]: 0.75 * 1 + 0.25 * 5 = 2.0
    assert expected_value([math.log(3.0), 0.0], [1, 5]) == pytest.approx(2.0)
    assert expected_value([1000.0, 0.0, 0.0], [1, 2, 3]) == pytest.approx(1.0)  # no overflow
    with pytest.raises(ValueError):
        expected_value([0.0], [1, 2])


def test_verdict_value_tokens_finds_the_last_three_numbers_only():
    from posttrain.envs.genrm.judge import verdict_value_tokens

    pieces = ["Ranking", ":", " 9", " then", "\n", "H", "elpfulness", " 1", ":", " 5", "\n",
              "Helpfulness 2", ":", " 1", "\n", "Ranking", ":", " 2"]
    assert verdict_value_tokens(pieces) == [9, 13, 17]
    assert verdict_value_tokens(pieces + ["\n"]) == [9, 13, 17]  # a trailing newline is not a line
    # a number that shares its token with other text cannot be read as a distribution
    assert verdict_value_tokens(pieces[:16] + [": 2"]) is None
    assert verdict_value_tokens(pieces[:-1] + [" 25"]) is None  # not one value
    assert verdict_value_tokens(["Helpfulness 1", ":", " 5"]) is None  # fewer than three lines
    swapped = pieces[:5] + ["Helpfulness 2", ":", " 5", "\n"] + pieces[11:]
    assert verdict_value_tokens(swapped) is None  # the lines out of order


def test_expected_verdicts_read_the_judges_own_distribution(tiny_judge_model):
    """The expected verdict of a real (tiny) model: the mean under its softmax over the value tokens,
    at the position that predicted each written number; text verdicts stay where asked."""
    model, tok = tiny_judge_model
    from posttrain.engines.hf import HFGenerator

    gen = HFGenerator(model, tok)
    prompt = [[{"role": "user", "content": "which is better?"}]]
    reply = "Both fine.\nHelpfulness 1: 5\nHelpfulness 2: 1\nRanking: 2"
    prompt_ids = gen.render_prompt(prompt[0], None, False)
    # a real reply ends on the end-of-turn token: it decodes to nothing and must not hide the last line
    end = [tok.convert_tokens_to_ids("<|im_end|>")]
    reply_ids = tok.encode(reply, add_special_tokens=False)

    class Scripted(HFGenerator):
        def generate(self, prompts, params, tools=None):
            return [[Completion(reply, token_ids=reply_ids + end, prompt_ids=prompt_ids)] for _ in prompts]

    scripted = Scripted(model, tok)
    assert GenRMJudge(scripted).judge_many(prompt) == [J(5, 1, 2)]
    soft = GenRMJudge(scripted, verdict="expected").judge_many(prompt)[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + reply_ids])).logits[0].float()
    want = []
    after_colon = [i for i, t in enumerate(reply_ids) if tok.decode([t]).strip().isdigit() and tok.decode([reply_ids[i - 1]]) == ":"]
    assert len(after_colon) == 3
    for digit_at, values in zip(after_colon,
                                [range(1, 6), range(1, 6), range(1, 7)]):
        cand = [tok.encode(f" {v}", add_special_tokens=False)[0] for v in values]
        row = logits[len(prompt_ids) + digit_at - 1]
        p = torch.softmax(row[cand], -1)
        want.append(float((p * torch.tensor(list(values), dtype=torch.float)).sum()))
    assert [soft.h1, soft.h2, soft.rank] == pytest.approx(want, abs=1e-4)
    assert soft != J(5, 1, 2) and 1 <= soft.h1 <= 5 and 1 <= soft.rank <= 6
    with pytest.raises(ValueError, match="local judge"):
        GenRMJudge(ScriptedGenerator([[GOOD]]), verdict="expected")

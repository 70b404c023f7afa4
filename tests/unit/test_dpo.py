"""DPO: the sigmoid and IPO losses and their gradients against hand-computed values, the SFT term,
pair rendering (only the reply is trained), the reference cache, and the tool-hallucination miner."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posttrain.algos.losses import LossInputs, make_loss
from posttrain.engines.base import Completion


def _pair(pc=-3.0, pr=-5.0, rc=-4.0, rr=-4.0):
    """One pair, one token each (the sequence log-prob is that token's), with grad."""
    lp = torch.tensor([[pc], [pr]], requires_grad=True)
    return lp, LossInputs(lp, torch.ones(2, 1), ref_logprobs_BT=torch.tensor([[rc], [rr]]))


def test_sigmoid_dpo_loss_and_gradient_by_hand():
    lp, x = _pair()
    out = make_loss("dpo", beta=0.1)(x)
    # h = (−3 + 4) − (−5 + 4) = 2; loss = −log σ(0.2)
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-0.2)))
    out.loss.backward()
    # dL/dπc = −β·σ(−βh) = −0.1·σ(−0.2); dL/dπr = +0.1·σ(−0.2)
    s = 1 / (1 + math.exp(0.2))
    assert lp.grad[0, 0].item() == pytest.approx(-0.1 * s) and lp.grad[1, 0].item() == pytest.approx(0.1 * s)
    assert out.metrics["margin"] == pytest.approx(0.2) and out.metrics["reward_acc"] == 1.0
    assert out.metrics["chosen_logp"] == -3 and out.metrics["rejected_logp"] == -5
    assert out.metrics["chosen_reward"] == pytest.approx(0.1) and out.metrics["rejected_reward"] == pytest.approx(-0.1)


def test_ipo_loss_and_gradient_by_hand():
    lp, x = _pair()
    out = make_loss("dpo", beta=0.1, variant="ipo")(x)
    # (h − 1/(2β))² = (2 − 5)² = 9; dL/dπc = 2(h − 5) = −6, dL/dπr = +6
    assert out.loss.item() == pytest.approx(9.0)
    out.loss.backward()
    assert lp.grad[:, 0].tolist() == pytest.approx([-6.0, 6.0])
    # at the target margin the IPO loss and its gradient vanish
    lp, x = _pair(pc=1.0, pr=-4.0)  # h = 5 − 0 = 5 = 1/(2·0.1)
    out = make_loss("dpo", beta=0.1, variant="ipo")(x)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.0) and lp.grad.abs().max() == pytest.approx(0.0)


def test_sft_term_and_pair_normalisation():
    # chosen has 2 tokens (−1, −2): mean NLL 1.5; rejected one token (−5, then a masked position)
    lp = torch.tensor([[-1.0, -2.0], [-5.0, -9.0]], requires_grad=True)
    x = LossInputs(lp, torch.tensor([[1, 1], [1, 0]]), ref_logprobs_BT=torch.tensor([[-2.0, -2.0], [-4.0, 0.0]]),
                   num_pairs=4.0)
    out = make_loss("dpo", beta=0.5, sft_coef=0.2)(x)
    h = (-3 + 4) - (-5 + 4)  # 2
    expect = (math.log(1 + math.exp(-0.5 * h)) + 0.2 * 1.5) / 4  # divided by the step's 4 pairs
    assert out.loss.item() == pytest.approx(expect) and out.metrics["sft_nll"] == pytest.approx(1.5)
    assert out.metrics_weight == 1.0  # its metrics are per-pair means: the loop weighs them by pairs, not tokens
    out.loss.backward()
    s = 1 / (1 + math.exp(0.5 * h))
    assert lp.grad[0].tolist() == pytest.approx([(-0.5 * s - 0.2 / 2) / 4] * 2)
    assert lp.grad[1].tolist() == pytest.approx([0.5 * s / 4, 0.0])  # the masked position gets nothing


def test_config_rejects_unknown_variant():
    import pydantic

    with pytest.raises(pydantic.ValidationError):
        make_loss("dpo", variant="hinge")


def test_render_reply_trains_only_the_reply():
    from posttrain.models.loading import load_tokenizer
    from posttrain.train.dpo import render_reply

    tok = load_tokenizer("tiny-llama")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "earlier reply"},
            {"role": "user", "content": "b"}]
    ids, mask = render_reply(tok, msgs, {"role": "assistant", "content": "final"}, None)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "final" in trained and "earlier" not in trained


def test_reference_cache_is_read_back(tmp_path):
    from posttrain.train.dpo import cached_reference

    calls = []

    def compute():
        calls.append(1)
        return [torch.tensor([-1.0, -2.0])]

    a, fresh = cached_reference(tmp_path / "ref.pt", "key", compute)
    b, again = cached_reference(tmp_path / "ref.pt", "key", compute)
    assert fresh and not again and len(calls) == 1 and torch.equal(a[0], b[0])
    _, changed = cached_reference(tmp_path / "ref.pt", "other data", compute)
    assert changed and len(calls) == 2


def test_read_dpo_rows_formats_and_errors(tmp_path):
    from posttrain.train.dpo import DPODataError, read_dpo_rows

    p = tmp_path / "pairs.jsonl"
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
    p.write_text(json.dumps({"prompt": "q", "chosen": "yes", "rejected": call}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "q2"}], "chosen": "a", "rejected": "b",
                               "tools": [{"type": "function", "function": {"name": "f"}}]}) + "\n")
    rows = read_dpo_rows(p)
    assert rows[0]["messages"] == [{"role": "user", "content": "q"}] and rows[0]["rejected"]["tool_calls"]
    assert rows[1]["tools"] and rows[0]["tools"] is None
    p.write_text('{"prompt": "q", "chosen": "a"}\n')
    with pytest.raises(DPODataError, match="pairs.jsonl:1"):
        read_dpo_rows(p)


class FixedReplies:
    def __init__(self, replies):
        self.replies, self.tools_seen = replies, []

    def generate(self, prompts, params, tools=None):
        self.tools_seen = list(tools)
        return [[Completion(self.replies[(i + j) % len(self.replies)]) for j in range(params.n)]
                for i in range(len(prompts))]


def test_tool_hallucination_pairs_from_own_samples():
    from posttrain.envs.base import Task, VerifyResult
    from posttrain.train.dpo_pairs import UNFITTING_TOOLS, calls_a_tool, tool_hallucination_pairs

    call = "<think>I should look it up</think><tool_call>\n<function=get_weather>\n</function>\n</tool_call>"
    assert calls_a_tool(call) and calls_a_tool("<tool_call>broken") and not calls_a_tool("<think><tool_call></think>4")

    class Env:
        name = "toy"

        def verify(self, task, messages):
            return VerifyResult(float(messages[-1]["content"].endswith("4")))

    tasks = [Task(id=f"t{i}", domain="x", messages=[{"role": "user", "content": "2+2?"}]) for i in range(3)]
    gen = FixedReplies([call, "It is 5", "It is 4", "<think>only thinking"])
    rows, stats, rates = tool_hallucination_pairs(gen, Env(), tasks, k=4, tools="both")
    assert gen.tools_seen == [None, UNFITTING_TOOLS, None]
    assert stats == {"prompts": 3, "samples": 12, "tool_calls": 3, "pairs": 3, "fallback_pairs": 0}
    assert [(r["env"], r["task_id"], r["reward"], r["tool_calls"]) for r in rates] == [
        ("toy/none", "t0", 0.25, 1), ("toy/unfitting", "t1", 0.25, 1), ("toy/none", "t2", 0.25, 1)]
    assert all(r["rejected"] == call and r["chosen"] == "It is 4" for r in rows)  # the correct plain answer
    assert rows[1]["tools"] == UNFITTING_TOOLS and rows[0]["tools"] is None
    rows, stats, rates = tool_hallucination_pairs(FixedReplies(["It is 4"]), Env(), tasks, k=2)
    assert rows == [] and stats["tool_calls"] == 0 and [r["reward"] for r in rates] == [0, 0, 0]  # no pair


def test_plain_fallback_takes_the_chosen_reply_from_the_question_without_tools():
    from posttrain.envs.base import Task, VerifyResult
    from posttrain.train.dpo_pairs import UNFITTING_TOOLS, tool_hallucination_pairs

    call = "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"

    class CallsWhenOffered:  # calls a tool whenever tools are offered, answers plainly otherwise
        def __init__(self):
            self.seen = []

        def generate(self, prompts, params, tools=None):
            self.seen.append(list(tools))
            return [[Completion(call if tl else "It is 4") for _ in range(params.n)] for tl in tools]

    class Env:
        name = "toy"

        def verify(self, task, messages):
            return VerifyResult(1.0)

    tasks = [Task(id=f"t{i}", domain="x", messages=[{"role": "user", "content": "2+2?"}]) for i in range(4)]
    gen = CallsWhenOffered()
    rows, stats, rates = tool_hallucination_pairs(gen, Env(), tasks, k=2, tools="both")
    assert rows == [] and [r["reward"] for r in rates] == [0, 1, 0, 1]  # off by default: no pair
    gen = CallsWhenOffered()
    rows, stats, rates = tool_hallucination_pairs(gen, Env(), tasks, k=2, tools="both", plain_fallback=True)
    assert gen.seen[1] == [None, None]  # only the two all-calling prompts are asked again, without tools
    assert [(r["task_id"], r["tools"], r["chosen"], r["rejected"], r["chosen_without_tools"]) for r in rows] == [
        ("t1", UNFITTING_TOOLS, "It is 4", call, True), ("t3", UNFITTING_TOOLS, "It is 4", call, True)]
    assert stats["pairs"] == stats["fallback_pairs"] == 2 and stats["samples"] == 8  # rates: first k only


def test_hallucination_rate_se_is_across_prompts():
    from posttrain.eval.compare import mean_and_se

    # prompts with rates 1, 0, 0.5, 0.5: mean 0.5, sample variance (0.25+0.25+0+0)/3 = 1/6, se sqrt(1/6/4)
    mean, se = mean_and_se([1.0, 0.0, 0.5, 0.5])
    assert mean == 0.5 and se == pytest.approx((1 / 24) ** 0.5)
    assert mean_and_se([0.25]) == (0.25, 0.0)
    assert all(math.isnan(x) for x in mean_and_se([]))

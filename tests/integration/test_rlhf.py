"""Tiny-model runs of ``posttrain rlhf``, ``posttrain genrm`` and ``posttrain dpo`` (a few steps
each) whose checkpoints load in transformers; DPO's cached reference survives a resume unrecomputed.

The RLHF judge is scripted (a fake ``Generator`` whose verdict prefers shorter answers, with one
malformed reply per call to exercise retries): a random tiny judge would fail the format every
time and every reward would be the fallback's.
"""

from __future__ import annotations

import argparse
import json

import pytest
from transformers import AutoModelForCausalLM

from posttrain.configs import load_config
from posttrain.configs.dpo import DPOConfig
from posttrain.configs.rlhf import RLHFConfig
from posttrain.engines.base import Completion
from posttrain.errors import UserError
from tests.integration.scale_env import EvenLengthEnv  # noqa: F401  (registers test_even_length)

pytestmark = pytest.mark.usefixtures("one_thread")


class ShortIsBetterJudge:
    """Verdict from the two answers' lengths in the prompt; the first reply of each call is malformed."""

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, params, tools=None):
        self.calls += 1
        out = []
        for k, p in enumerate(prompts):
            text = p[-1]["content"]
            a = len(text.split("## Response 1\n")[1].split("\n\n## Response 2")[0])
            b = len(text.split("## Response 2\n")[1].split("\n\nCompare")[0])
            h1, h2 = (4, 2) if a < b else (2, 4) if b < a else (3, 3)
            rank = 2 if a < b else 5 if b < a else 3
            reply = "hmm" if k == 0 and params.temperature == 0 else f"ok\nHelpfulness 1: {h1}\nHelpfulness 2: {h2}\nRanking: {rank}"
            out.append([Completion(reply, token_ids=[1] * 5)])
        return out


def _loads(ckpt):
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_rlhf_run_with_a_scripted_judge(tmp_path):
    from posttrain.train.rlhf import train_rlhf

    run_dir = tmp_path / "rlhf"
    over = {"model": "tiny-llama", "run_dir": run_dir, "train.steps": 2, "train.eval_every": 2, "train.save_every": 2,
            "rollout.prompts_per_step": 2, "rollout.group_size": 3, "rollout.max_new_tokens": 6,
            "algo.overlong_filter": False, "optim.lr": 1e-3,
            "envs": "[{name: test_even_length, train_tasks: 8, val_tasks: 2}]"}
    cfg = load_config(RLHFConfig, None, [f"{k}={v}" for k, v in over.items()])
    judge = ShortIsBetterJudge()
    res = train_rlhf(cfg, progress=False, judge_generator=judge)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows[1:]:
        assert r["genrm_comparisons"] == 6 and r["genrm_retries"] == 1 and r["genrm_fallbacks"] == 0
        assert {"reward_base", "think_len_mean", "answer_len_mean", "time_judge_s", "grad_norm"} <= set(r)
        assert 1.0 <= r["reward_base"] <= 5.0
    assert judge.calls == 2 * 2  # per step: one batched pass + one retry of the failed comparison
    assert any(r["rollouts_trained"] > 0 for r in rows[1:])  # rewards outside [0, 1] trained the policy
    assert "val_reward/test_even_length" in rows[-1]  # validation by the verifier, not the judge
    _loads(res.checkpoint)


def test_genrm_run_on_preference_pairs(tmp_path, capsys):
    from posttrain.commands import genrm as genrm_command

    pairs = tmp_path / "prefs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say something about {i}.", "chosen": f"{i} is a number.",
                                         "rejected": ""}) + "\n" for i in range(40)))  # enough for 2 test pairs
    run_dir = tmp_path / "genrm"
    args = argparse.Namespace(config=None, no_progress=True, mine=None, eval=None, warmstart=None, split="test",
                              reasoning="restate", eval_temperature=0.0, eval_samples=1, overrides=[
        f"{k}={v}" for k, v in {
            "model": "tiny-llama", "run_dir": run_dir, "train.steps": 2, "train.eval_every": 2, "train.save_every": 2,
            "rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 8,
            "algo.overlong_filter": False, "algo.dynamic_filter": False,
            "envs": f"[{{name: genrm, train_tasks: 8, val_tasks: 4, args: {{pairs: {pairs}, val_frac: 0.3}}}}]"}.items()])
    assert genrm_command.run(args) == 0
    assert "held-out reward" in capsys.readouterr().out
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "val_reward/genrm" in rows[0] and all(0 <= r["reward"] <= 1 for r in rows[1:])
    recs = [json.loads(x) for x in (run_dir / "validation" / "step_000002.jsonl").read_text().splitlines()]
    assert recs and all(r["reason"] == "ok" or r["reason"].startswith("format:") for r in recs)
    _loads(run_dir / "checkpoints" / "step_000002")
    # the trained checkpoint measured as a judge on the held-out pairs (both orders)
    args.eval, args.out = str(run_dir / "checkpoints" / "step_000002"), str(tmp_path / "agreement.json")
    assert genrm_command.run(args) == 0
    figures = json.loads((tmp_path / "agreement.json").read_text())
    assert figures["n"] == 4 and 0 <= figures["format_error_rate"] <= 1 and "swapped/rank_side_acc" in figures
    test_pairs = {json.loads(x)["pair_id"] for x in (tmp_path / "agreement.replies.jsonl").read_text().splitlines()}
    # --split dev: the pairs to choose a checkpoint on, none of them a test pair, and the file says which
    args.split = "dev"
    assert genrm_command.run(args) == 0
    assert json.loads((tmp_path / "agreement.json").read_text())["split"] == "dev"
    dev_pairs = {json.loads(x)["pair_id"] for x in (tmp_path / "agreement.replies.jsonl").read_text().splitlines()}
    assert dev_pairs and not dev_pairs & test_pairs
    args.split = "test"
    # sampled, as an RLHF run with judge.temperature uses it: every reply of every task is scored
    args.eval_temperature, args.eval_samples = 1.0, 2
    assert genrm_command.run(args) == 0
    figures = json.loads((tmp_path / "agreement.json").read_text())
    assert figures["n"] == 8 and figures["samples"] == 2 and figures["temperature"] == 1.0
    args.eval_temperature, args.eval_samples = 0.0, 1
    # --warmstart: the format-teaching SFT rows of the train pairs, in the file SFT reads
    from posttrain.envs.genrm.format import parse_judgement

    args.eval, args.warmstart, args.verdicts = None, str(tmp_path / "warm.jsonl"), "random"
    assert genrm_command.run(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "warm.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(parse_judgement(r["messages"][-1]["content"]).rank in range(1, 7) for r in rows)
    args.reasoning = "cue"  # a cue names the worse reply: random verdicts would contradict it
    with pytest.raises(UserError, match="needs verdicts='truth'"):
        genrm_command.run(args)


def test_dpo_run_resumes_with_the_cached_reference(tmp_path, monkeypatch):
    from posttrain.train import dpo

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {i}+1?", "chosen": f"It is {i + 1}.",
                                         "rejected": "<tool_call>\n<function=calc>\n</function>\n</tool_call>"}) + "\n"
                             for i in range(10)))
    over = {"model": "tiny-llama", "run_dir": tmp_path / "dpo", "data.train": pairs, "data.val_frac": 0.2,
            "train.steps": 3, "train.save_every": 1, "train.batch_size": 4, "train.micro_batch_pairs": 2,
            "optim.lr": 1e-3, "loss.variant": "ipo", "loss.sft_coef": 0.1}
    cfg = load_config(DPOConfig, None, [f"{k}={v}" for k, v in over.items()])
    first = dpo.train_dpo(cfg, progress=False, stop_after=1)  # as if killed after step 1
    assert first.reference_computed and (tmp_path / "dpo" / dpo.REF_FILE).exists()
    rows = [json.loads(x) for x in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reference_computed"] == 1.0 and "val_reward_acc" in rows[0]
    # at step 0 the policy is the reference: implicit rewards are 0, no pair is "won"
    assert rows[0]["val_margin"] == pytest.approx(0.0, abs=1e-4)
    for k in ("loss", "reward_acc", "margin", "chosen_logp", "rejected_logp", "chosen_reward", "sft_nll"):
        assert k in rows[1], k

    def boom(*a, **kw):
        raise AssertionError("a resumed run recomputed the reference log-probs")

    monkeypatch.setattr(dpo, "compute_reference", boom)
    res = dpo.train_dpo(cfg, progress=False)
    assert not res.reference_computed and res.checkpoint.name == "step_000003"
    rows = [json.loads(x) for x in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and "val_reward_acc" in rows[-1]
    for r in rows[1:]:  # a share of the step's 4 pairs, not a token-weighted mean of micro-batch shares
        assert r["reward_acc"] * 4 == pytest.approx(round(r["reward_acc"] * 4)), r["reward_acc"]
    _loads(res.checkpoint)


def test_dpo_command(tmp_path, capsys):
    from posttrain.commands import dpo as dpo_command

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Hi {i}", "chosen": "Hello!", "rejected": "Go away."}) + "\n"
                             for i in range(4)))
    args = argparse.Namespace(config=None, no_progress=True, overrides=[
        "model=tiny-llama", f"run_dir={tmp_path / 'run'}", f"data.train={pairs}", "train.steps=1",
        "train.batch_size=2", "data.val_frac=0.25"])
    assert dpo_command.run(args) == 0
    assert "reference log-probs computed" in capsys.readouterr().out


def test_dpo_pairs_and_tool_decisions_commands_write_rates_and_compare(tmp_path, capsys):
    """The measurement commands of docs/results/dpo_tool_hallucination.md on tiny-llama: per-prompt
    rates with their se, per-point decisions, and the paired comparison against a saved file."""
    from posttrain.cli import main

    rates = tmp_path / "rates.jsonl"
    common = ["dpo-pairs", "--model", "tiny-llama", "--envs", "mcq", "--split", "dev", "--n", "2", "--k", "2",
              "--max-new-tokens", "4", "--out", str(tmp_path / "pairs.jsonl")]
    assert main([*common, "--rates", str(rates)]) == 0
    rows = [json.loads(x) for x in rates.read_text().splitlines()]
    assert [(r["env"], r["samples"]) for r in rows] == [("mcq/none", 2), ("mcq/unfitting", 2)]
    assert main([*common, "--against", str(rates)]) == 0
    out = capsys.readouterr().out
    assert "tool-call rate (all):" in out and "across 2 prompts" in out and "| mcq/none | 1 |" in out
    assert main([*common, "--against", str(tmp_path / "missing.jsonl")]) == 2

    decisions = tmp_path / "decisions.jsonl"
    base = ["tool-decisions", "--model", "tiny-llama", "--n", "1", "--max-new-tokens", "4"]
    assert main([*base, "--out", str(decisions)]) == 0
    assert main([*base, "--out", str(tmp_path / "again.jsonl"), "--against", str(decisions)]) == 0
    out = capsys.readouterr().out
    assert "banking@call_exact" in out and "| banking@plain | 1 |" in out

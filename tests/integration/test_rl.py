"""The RL stage end to end on tiny models: a few GRPO steps write metrics, plots, the best and last
checkpoints; an interrupted run resumes to bit-identical weights; NemotronH routers stay frozen while
their biases move; skipping zero-advantage rollouts leaves the gradient unchanged; filters count.

The tiny random models almost never write ``<|im_end|>``, so every rollout hits the length limit:
the runs switch overlong filtering off (it is tested on hand-made rollouts instead), and the stand-in
environment pays for something a random model does about half the time (an even-length reply).
"""

from __future__ import annotations

import argparse
import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from posttrain.algos.advantages import make_advantage
from posttrain.algos.losses import make_loss
from posttrain.configs import load_config
from posttrain.envs.base import ENVIRONMENTS, Episode, StepResult, VerifyResult
from posttrain.models.loading import load_model
from posttrain.models.moe import find_routers
from posttrain.commands import rl as rl_command
from posttrain.train import rl
from posttrain.configs.rl import AlgoConfig, RLConfig
from posttrain.episodes.collect import Rollout
from posttrain.serving.build import build_envs
from posttrain.train.autocast import autocast
from posttrain.train.rl import filtered_batch, train_rl
from tests.integration.scale_env import EvenLengthEnv  # registers test_even_length (shared with the Ray tests)




pytestmark = pytest.mark.usefixtures("one_thread")  # shared fixture in tests/conftest.py


def _cfg(run_dir, model="tiny-llama", **over) -> RLConfig:
    base = {
        "model": model, "run_dir": str(run_dir), "train.steps": 3, "train.eval_every": 3, "train.save_every": 2,
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 6,
        "algo.overlong_filter": False, "optim.lr": 1e-3,
        "envs": "[{name: test_even_length, train_tasks: 12, val_tasks: 2}]",
    }
    base.update(over)
    return load_config(RLConfig, None, [f"{k}={v}" for k, v in base.items()])


def test_rl_run_writes_metrics_plot_and_checkpoints(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = argparse.Namespace(config=None, no_progress=True, overrides=[
        f"{k}={v}" for k, v in {
            "model": "tiny-llama", "run_dir": run_dir, "train.steps": 3, "train.eval_every": 3,
            "train.save_every": 2, "rollout.prompts_per_step": 4, "rollout.group_size": 4,
            "rollout.max_new_tokens": 6, "algo.overlong_filter": False, "optim.lr": 1e-3,
            "envs": "[{name: test_even_length, train_tasks: 12, val_tasks: 2}]"}.items()])
    assert rl_command.run(args) == 0
    assert "best validation reward" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "val_reward" in rows[0] and "val_reward/test_even_length" in rows[-1]
    for r in rows[1:]:
        for key in ("reward", "pass_rate", "reward/test_even_length", "response_tokens_mean", "groups_dropped",
                    "clip_frac", "is_masked_frac", "logprob_abs_err", "entropy_est", "time_generate_s",
                    "time_verify_s", "time_train_s", "rollouts_trained", "grad_norm"):
            assert key in r, key
        assert 0 <= r["reward"] <= 1 and 1 <= r["response_tokens_mean"] <= r["response_tokens_max"] <= 6
        # same weights sample and train, so the two log-prob computations agree closely
        assert r["logprob_abs_err"] < 1e-3 and r["is_masked_frac"] == 0
        assert r["rollouts_trained"] + r["rollouts_zero_adv"] + 4 * r["groups_dropped"] == 16
    assert (run_dir / "rewards.png").stat().st_size > 0 and (run_dir / "config.yaml").exists()
    assert (run_dir / "checkpoints" / "step_000003").exists() and (run_dir / "best" / "config.json").exists()
    before = load_model("tiny-llama", device="cpu", dtype=torch.float32).model.state_dict()
    after = load_file(str(run_dir / "checkpoints" / "step_000003" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in after)  # the policy moved
    for step, row in ((0, rows[0]), (3, rows[-1])):  # per-task validation records agree with the metric
        recs = [json.loads(line) for line in (run_dir / "validation" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert [r["env"] for r in recs] == ["test_even_length"] * 2
        assert sum(r["reward"] for r in recs) / 2 == pytest.approx(row["val_reward/test_even_length"])
        assert all(r["reason"] in ("even", "odd") for r in recs)


def test_validate_command_rescores_a_checkpoint_like_the_run(tmp_path, capsys):
    """``posttrain validate`` on a run's config and checkpoint reproduces the run's own per-task
    validation (same tasks, greedy), and ``--against`` prints the paired gain table."""
    from posttrain.cli import main

    run_dir = tmp_path / "run"
    train_rl(_cfg(run_dir, **{"train.steps": 2, "train.eval_every": 2, "envs":
                              "[{name: test_even_length, train_tasks: 12, val_tasks: 6}]"}), progress=False)
    ran = (run_dir / "validation" / "step_000002.jsonl").read_text().splitlines()
    out, base = tmp_path / "ckpt.jsonl", tmp_path / "base.jsonl"
    common = ["validate", "-c", str(run_dir / "config.yaml"), "--no-progress", "--threads", "1"]
    assert main(common + ["--model", "tiny-llama", "--out", str(base)]) == 0
    assert main(common + ["--model", str(run_dir / "checkpoints" / "step_000002"), "--out", str(out),
                          "--against", str(base)]) == 0
    again = out.read_text().splitlines()
    assert [json.loads(r)["task_id"] for r in again] == [json.loads(r)["task_id"] for r in ran]
    assert [json.loads(r)["reward"] for r in again] == [json.loads(r)["reward"] for r in ran]
    printed = capsys.readouterr().out
    assert "| test_even_length | 6 |" in printed and "gain ± paired se" in printed
    assert main(common + ["--out", str(tmp_path / "x.jsonl"), "--against", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    # --split test: as many tasks, none of them the dev tasks the run validated on
    test = tmp_path / "test.jsonl"
    assert main(common + ["--model", "tiny-llama", "--out", str(test), "--split", "test"]) == 0
    test_ids = [json.loads(r)["task_id"] for r in test.read_text().splitlines()]
    assert len(test_ids) == 6 and not set(test_ids) & {json.loads(r)["task_id"] for r in ran}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_interrupted_run_resumes_to_identical_weights(tmp_path, precision):
    over = {"train.steps": 4, "train.eval_every": 0, "train.precision": precision}
    full = train_rl(_cfg(tmp_path / "full", **over), progress=False)
    cut = _cfg(tmp_path / "cut", **over)
    train_rl(cut, progress=False, stop_after=3)  # "killed" after step 3: the last checkpoint is step 2
    resumed = train_rl(cut, progress=False)
    a = load_file(str(full.checkpoint / "model.safetensors"))
    b = load_file(str(resumed.checkpoint / "model.safetensors"))
    assert resumed.checkpoint.name == "step_000004" and a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # step 3 of the cut run was dropped and redone, not logged twice


def test_nemotronh_routers_frozen_biases_move(tmp_path):
    res = train_rl(_cfg(tmp_path / "run", model="tiny-nemotronh", **{
        "train.steps": 2, "train.eval_every": 0, "moe.bias_update_rate": 0.01}), progress=False)
    start = load_model("tiny-nemotronh", device="cpu", dtype=torch.float32).model
    routers = find_routers(start)
    assert routers
    before = start.state_dict()
    from transformers import AutoModelForCausalLM

    after = AutoModelForCausalLM.from_pretrained(res.checkpoint).state_dict()  # on-disk names differ
    for name in routers:
        assert torch.equal(before[f"{name}.weight"], after[f"{name}.weight"]), name  # bit-identical
    assert any(not torch.equal(before[f"{n}.e_score_correction_bias"], after[f"{n}.e_score_correction_bias"])
               for n in routers)
    assert any(not torch.equal(before[k], after[k]) for k in after if "router" not in k and "gate" not in k)


def _rollout(group, reward, prompt, completion, finish="length"):
    ids = prompt + completion
    return Rollout("test_even_length", f"t{group}", group, ids, [0] * len(prompt) + [1] * len(completion),
                   [-1.5] * len(completion), finish, reward)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero_advantage_skip_gives_the_same_gradient(pg_backward, precision):
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 500, (n,), generator=g).tolist()  # noqa: E731
    # group 0: rewards 0, .5, .5, 1 → the two 0.5 rollouts have advantage exactly 0; group 1 informative
    rollouts = [_rollout(0, r, ids(5), ids(4 + i)) for i, r in enumerate([0.0, 0.5, 0.5, 1.0])]
    rollouts += [_rollout(1, r, ids(7), ids(3 + i)) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    batch, _ = filtered_batch(rollouts, AlgoConfig(overlong_filter=False))
    adv = make_advantage("grpo")(batch)
    assert (adv[1:3] == 0).all() and (adv[0] != 0).any()
    base = load_model("tiny-llama", device="cpu", dtype=torch.float32).model
    grads, trained = [], []
    for skip in (True, False):
        m = copy.deepcopy(base)
        with autocast(precision, "cpu"):
            out = pg_backward(m, rollouts, batch, adv, make_loss("pg"), skip=skip)
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        trained.append(out["rollouts_trained"])
    assert trained == [6, 8]
    # bf16: the skipped rows change the matmul shapes, hence bf16 rounding, not the gradient
    tol = {"atol": 1e-7, "rtol": 1e-5} if precision == "fp32" else {"atol": 2e-3, "rtol": 5e-2}
    for n in grads[1]:
        torch.testing.assert_close(grads[0][n], grads[1][n], **tol)


def test_filters_count_overlong_and_uninformative_groups():
    rollouts = [
        _rollout(0, 1.0, [1, 2], [3, 4], "stop"), _rollout(0, 0.0, [1, 2], [5, 6], "length"),  # overlong
        _rollout(1, 1.0, [1, 2], [3], "stop"), _rollout(1, 0.0, [1, 2], [4], "done"),
        _rollout(2, 0.0, [1, 2], [3], "stop"), _rollout(2, 0.0, [1, 2], [4, 5, 6], "context"),  # overlong
    ]
    batch, stats = filtered_batch(rollouts, AlgoConfig())
    assert stats == {"truncated": 2.0, "groups_dropped": 2.0}  # group 0 and 2 are left with one reward each
    assert batch.mask_BT.sum(dim=1).tolist() == [0, 0, 1, 1, 0, 0]
    _, stats = filtered_batch(rollouts, AlgoConfig(overlong_filter=False, dynamic_filter=False))
    assert stats == {"truncated": 0.0, "groups_dropped": 0.0}


def test_config_rejects_kl_and_duplicate_envs(tmp_path):
    with pytest.raises(Exception, match="reference model"):
        AlgoConfig(loss={"type": "pg", "kl_coef": 0.1})
    with pytest.raises(Exception, match="appear once"):
        build_envs(_cfg(tmp_path, envs="[{name: math}, {name: math}]").envs)


def test_profile_command_feeds_the_gaussian_curriculum(tmp_path, capsys):
    from posttrain.algos.curriculum import read_profile
    from posttrain.commands import profile

    out = tmp_path / "profile.jsonl"
    p = argparse.ArgumentParser()
    profile.add_arguments(p)
    args = p.parse_args(["--env", "test_even_length", "--model", "tiny-llama", "--out", str(out), "--n", "12",
                         "--k", "3", "--max-new-tokens", "6", "--judge", "none", "--no-progress"])
    assert profile.run(args) == 0
    assert "test_even_length: 12 tasks" in capsys.readouterr().out
    rows = read_profile(out)
    assert len(rows) == 12 and {r.domain for r in rows} == {"test_even_length"} and {r.k for r in rows} == {3}
    assert all(r.pass_rate in (0, 1 / 3, 2 / 3, 1) for r in rows) and len({r.pass_rate for r in rows}) > 1
    res = train_rl(_cfg(tmp_path / "run", **{"train.steps": 1, "train.eval_every": 0, "curriculum.profile": out,
                                              "rollout.prompts_per_step": 2}), progress=False)
    assert "pass_rate_gain" in res.last
    # a profile made for another task pool is refused with a clear message
    with pytest.raises(Exception, match="not in the training pools"):
        train_rl(_cfg(tmp_path / "bad", **{"curriculum.profile": out,
                                           "envs": "[{name: test_even_length, train_tasks: 12, task_seed: 5}]"}))


class TwoTurnEpisode(Episode):
    def step(self, assistant_message):
        self.count("turns")
        done = self.stats["turns"] >= 2
        return StepResult([] if done else [{"role": "user", "content": "Go on."}], done)


class TwoTurnEnv(EvenLengthEnv):
    """Multi-turn stand-in: the user says "Go on." once; reward on the total reply length."""

    name = "test_two_turn"
    multi_turn = True

    def start_episode(self, task):
        return TwoTurnEpisode(task)

    def verify(self, task, messages):
        total = sum(len(m["content"]) for m in messages if m["role"] == "assistant")
        return VerifyResult(float(total % 2 == 0))


def test_multi_turn_rollouts_train_on_every_sampled_turn(pg_backward, sample_rollouts):
    """Tool/user environments go through run_episodes; the trainer scores exactly the sampled turns
    (its log-probs match the sampler's), and observation tokens get no loss."""
    from posttrain.models.chat_template import IM_END
    from posttrain.engines.hf import HFGenerator

    tiny = load_model("tiny-llama", device="cpu", dtype=torch.float32)
    model, tok = tiny.model, tiny.tokenizer
    stop = torch.zeros(len(tok))
    stop[tok.convert_tokens_to_ids(IM_END)] = 6.0  # the random model must end turns for a second turn
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: out + stop)
    try:
        env = TwoTurnEnv()
        picks = [("test_two_turn", t) for t in env.tasks("train", 3)]
        cfg = RLConfig(rollout={"group_size": 4, "max_new_tokens": 8}).rollout
        rollouts = sample_rollouts(HFGenerator(model, tok), {"test_two_turn": env}, picks, cfg, seed=1)
        two = [r for r in rollouts if r.finish_reason == "done"]
        assert len(rollouts) == 12 and two and [r.group for r in rollouts] == [g for g in range(3) for _ in range(4)]
        for r in two:  # two sampled segments separated by unmasked observation tokens
            starts = [i for i in range(1, len(r.loss_mask)) if r.loss_mask[i] and not r.loss_mask[i - 1]]
            assert len(starts) == 2 and r.response_tokens == sum(r.loss_mask)
        batch, _ = filtered_batch(rollouts, AlgoConfig(dynamic_filter=False))
        adv = torch.ones_like(batch.mask_BT) * batch.mask_BT  # every token trains, so every turn is scored
        out = pg_backward(model, rollouts, batch, adv, make_loss("pg"))
        assert out["rollouts_trained"] == int(batch.valid_B.sum()) and out["logprob_abs_err"] < 1e-4
    finally:
        hook.remove()


def _write_profile(path, n=12, rate=0.5):
    from posttrain.algos.curriculum import TaskProfile, write_profile

    write_profile(path, [TaskProfile(f"even/train/0/{i}", "test_even_length", rate, 4) for i in range(n)])


def test_plateau_reprofiles_rebuilds_the_curriculum_and_survives_resume(tmp_path):
    """min_delta 1.0 makes every window a plateau: the rule fires after max(min_steps, 2·window)
    steps, the live policy writes a new profile, and a resumed run keeps sampling from it."""
    _write_profile(tmp_path / "p.jsonl")
    over = {"curriculum.profile": str(tmp_path / "p.jsonl"), "curriculum.reprofile.enabled": True,
            "curriculum.reprofile.k": 2, "curriculum.reprofile.window": 1, "curriculum.reprofile.min_steps": 2,
            "curriculum.reprofile.min_delta": 1.0, "train.steps": 5, "train.save_every": 1, "train.eval_every": 0}
    cfg = _cfg(tmp_path / "run", **over)
    train_rl(cfg, progress=False, stop_after=3)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("reprofiled", 0) for r in rows] == [0, 1, 0]
    new = tmp_path / "run" / "profiles" / "step_000002.jsonl"
    assert len(new.read_text().splitlines()) == 12  # every pool task, re-scored by the current policy
    assert all("curriculum_target" in r and "pass_rate_gain" in r for r in rows)
    # the target restarts at mean_start after the re-profile (progress 0 of the new phase)
    assert rows[2]["curriculum_target"] == pytest.approx(cfg.curriculum.mean_start)
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_000003" / "trainer_state.pt", weights_only=False)
    assert state["phase"]["profile"] == str(new) and state["phase"]["start"] == 2
    res = train_rl(cfg, progress=False)  # resumes at step 3 from the re-profiled phase
    assert res.steps == 5
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[3]["curriculum_target"] == pytest.approx(
        cfg.curriculum.mean_start + (3 - 2) / (5 - 2) * (cfg.curriculum.mean_end - cfg.curriculum.mean_start))


def test_informative_groups_ignores_overlong_rollouts():
    def r(group, reward, finish="stop"):
        return Rollout("e", "t", group, [1, 2], [0, 1], [-0.1], finish, reward)

    rollouts = [r(0, 1.0), r(0, 0.0), r(1, 1.0), r(1, 0.0, "length"), r(2, 0.0), r(2, 0.0)]
    assert rl.informative_groups(rollouts, overlong_filter=True) == ([0], [1, 2])
    assert rl.informative_groups(rollouts, overlong_filter=False) == ([0, 1], [2])


def test_refill_replaces_dropped_groups_with_fresh_tasks(tmp_path):
    """With refill rounds the step keeps sampling same-environment tasks until P groups are
    informative (or the rounds run out); the surplus of the last round is discarded."""
    cfg = _cfg(tmp_path / "run", **{"algo.refill_rounds": 3, "train.steps": 2, "train.eval_every": 0,
                                    "rollout.group_size": 2})
    train_rl(cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("refill_groups" in m for m in rows)
    for m in rows:
        informative = m["rollouts_trained"] + m["rollouts_zero_adv"]
        assert informative <= cfg.rollout.prompts_per_step * cfg.rollout.group_size
    assert sum(m["refill_groups"] for m in rows) > 0  # with G=2 and p≈0.5 about half the groups drop


def test_profile_from_an_rl_recipe_uses_its_pools_and_sampling_settings(tmp_path, capsys):
    from posttrain.algos.curriculum import read_profile
    from posttrain.commands import profile

    recipe = tmp_path / "rl.yaml"
    recipe.write_text("model: tiny-llama\nenvs: [{name: test_even_length, train_tasks: 5, task_seed: 3}]\n"
                      "rollout: {max_new_tokens: 4, temperature: 0.7}\n")
    out = tmp_path / "profile.jsonl"
    p = argparse.ArgumentParser()
    profile.add_arguments(p)
    args = p.parse_args(["--config", str(recipe), "rollout.group_size=2", "--out", str(out), "--k", "2",
                         "--no-progress"])
    assert profile.run(args) == 0
    assert [r.task_id for r in read_profile(out)] == [f"even/train/3/{i}" for i in range(5)]
    with pytest.raises(Exception, match="need --config"):
        profile.run(p.parse_args(["--env", "test_even_length", "x=1", "--out", str(out)]))


def test_ratio_zero_environment_is_validated_but_never_trained(tmp_path):
    if TwoTurnEnv.name not in ENVIRONMENTS:
        ENVIRONMENTS.register(TwoTurnEnv.name)(TwoTurnEnv)
    cfg = _cfg(tmp_path / "run", **{
        "envs": "[{name: test_even_length, train_tasks: 12, val_tasks: 2}, "
                "{name: test_two_turn, ratio: 0, train_tasks: 4, val_tasks: 2}]",
        "train.steps": 1, "train.eval_every": 1})
    res = train_rl(cfg, progress=False)
    assert "val_reward/test_two_turn" in res.last and "reward/test_two_turn" not in res.last
    with pytest.raises(Exception, match="ratio > 0"):
        train_rl(_cfg(tmp_path / "bad", envs="[{name: test_even_length, ratio: 0}]"), progress=False)


def _anchor_data(path, n=6):
    rows = [{"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i} {i} {i}"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_anchor_trains_the_supervised_rows_every_step(tmp_path):
    """algo.sft_anchor (PPO-ptx): every step also trains on rows of the SFT data, so their
    cross-entropy falls where a run with a negligible coefficient leaves it; its metrics are its own
    (the pg metrics still average over rollout tokens only) and the rows are a function of (seed, step)."""
    data = _anchor_data(tmp_path / "sft.jsonl")

    def run(name, coef):
        cfg = _cfg(tmp_path / name, **{"train.steps": 6, "train.eval_every": 0, "optim.lr": 3e-3,
                                       "algo.sft_anchor.data": json.dumps(str(data)), "algo.sft_anchor.coef": coef,
                                       "algo.sft_anchor.rows_per_step": 3})
        train_rl(cfg, progress=False)
        return cfg, [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    cfg, rows = run("anchored", 5.0)
    _, control = run("control", 1e-9)
    assert all(m["anchor_tokens"] > 0 and "anchor_nll" in m for m in rows)
    assert rows[0]["anchor_nll"] == pytest.approx(control[0]["anchor_nll"], rel=1e-4)  # same weights, same rows
    assert rows[-1]["anchor_nll"] < control[-1]["anchor_nll"] - 0.3
    assert all(0 <= m["is_masked_frac"] <= 1 for m in rows if "is_masked_frac" in m)
    examples = [object() for _ in range(6)]
    pick = lambda step: [id(e) for e in rl.anchor_rows_pick(examples, cfg, step)]  # noqa: E731
    assert pick(2) == pick(2) and pick(2) != pick(3)


def test_sft_anchor_loss_routes_rows_by_their_inputs():
    """Rollout rows (with an advantage) get the RL loss; supervised rows coef x cross-entropy."""
    from posttrain.algos.losses import LossInputs, cross_entropy_loss

    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss = rl.AnchoredLoss(make_loss("pg", is_mode="none"), coef=0.3)
    sup = loss(LossInputs(lp, mask, num_tokens=6.0))
    assert torch.allclose(sup.loss, 0.3 * cross_entropy_loss(LossInputs(lp, mask, num_tokens=6.0)).loss)
    assert set(sup.metrics) == {"anchor_nll"}
    pg = loss(LossInputs(lp, mask, advantages_BT=torch.ones(1, 3)))
    assert "clip_frac" in pg.metrics and "anchor_nll" not in pg.metrics


def test_sft_anchor_bad_data_fails_before_the_model_loads(tmp_path):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="not found"):
        train_rl(_cfg(tmp_path / "run", **{"algo.sft_anchor.data": str(tmp_path / "missing.jsonl")}), progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "nope"}\n')
    with pytest.raises(UserError):
        train_rl(_cfg(tmp_path / "run2", **{"algo.sft_anchor.data": str(bad)}), progress=False)
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()

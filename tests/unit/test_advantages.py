"""Advantage estimators against hand-computed numbers (the arithmetic is in the comments)."""

import pydantic
import pytest
import torch

from posttrain.algos.advantages import (
    ADVANTAGES,
    ScoredBatch,
    broadcast_to_tokens,
    group_advantages,
    make_advantage,
    mopd_token_advantages,
)
from posttrain.algos.rollout_filters import overlong_filter


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_grpo_std_normalised_one_group():
    # rewards [1, 1, 0, 0]: mean 0.5, centred [.5, .5, -.5, -.5], population std 0.5 → ±1
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([7, 7, 7, 7]))
    close(adv, [1.0, 1.0, -1.0, -1.0])


def test_grpo_without_std_is_reward_minus_group_mean():
    # rewards [1, 0, 0]: mean 1/3 → [2/3, -1/3, -1/3]
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), scale_by_std=False)
    close(adv, [2 / 3, -1 / 3, -1 / 3])


def test_grpo_groups_are_independent_and_equal_rewards_give_zero():
    # group 0 = rows 0, 2: rewards [1, 0] → mean .5, std .5 → [+1, -1]
    # group 1 = rows 1, 3: rewards [.5, .5] → centred 0, std 0 → 0/(0 + eps) = 0 (not NaN)
    adv = group_advantages(torch.tensor([1.0, 0.5, 0.0, 0.5]), torch.tensor([0, 1, 0, 1]))
    close(adv, [1.0, 0.0, -1.0, 0.0])


def test_grpo_std_of_three_rewards():
    # rewards [1, 0, 0]: centred [2/3, -1/3, -1/3]; var = (4/9 + 1/9 + 1/9)/3 = 2/9, std = 0.471405
    # → [0.666667/0.471405, -0.333333/0.471405, ...] = [1.414214, -0.707107, -0.707107]
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]))
    close(adv, [1.414214, -0.707107, -0.707107])


def test_grpo_estimator_broadcasts_to_tokens_and_skips_masked_out_rollouts():
    # row 2 was overlong: its mask row is all zero, so the group is rows 0, 1 with rewards [1, 0]
    # → mean .5, std .5 → [+1, -1]; row 2 gets 0 and row 1's padding (last position) gets 0.
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.float)
    mask, n_dropped = overlong_filter(["stop", "stop", "length"], mask)
    assert n_dropped == 1
    batch = ScoredBatch(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), mask)
    adv = make_advantage("grpo")(batch)
    close(adv, [[1, 1, 1], [-1, -1, 0], [0, 0, 0]])


def test_broadcast_to_tokens():
    close(broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 0], [1, 1]])), [[2, 0], [-1, -1]])


def test_mopd_is_teacher_minus_student_on_the_mask_without_gradient():
    # [-1 - (-1.5), -2 - (-1), masked] = [0.5, -1, 0]
    teacher = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    student = torch.tensor([[-1.5, -1.0, -9.0]], requires_grad=True)
    adv = mopd_token_advantages(teacher, student, torch.tensor([[1, 1, 0]]))
    close(adv, [[0.5, -1.0, 0.0]])
    assert not adv.requires_grad


def test_mopd_plus_verifier_reward():
    # token part (rows): [[0.5, -1], [0, 0.25]]; rewards [1, 0] one group → grpo [+1, -1];
    # with reward_coef 0.5: [[0.5 + 0.5, -1 + 0.5], [0 - 0.5, 0.25 - 0.5]] = [[1, -0.5], [-0.5, -0.25]]
    batch = ScoredBatch(
        rewards_B=torch.tensor([1.0, 0.0]),
        group_ids_B=torch.tensor([0, 0]),
        mask_BT=torch.ones(2, 2),
        sampler_logprobs_BT=torch.tensor([[-1.5, -1.0], [-1.0, -2.0]]),
        teacher_logprobs_BT=torch.tensor([[-1.0, -2.0], [-1.0, -1.75]]),
    )
    close(make_advantage("mopd")(batch), [[0.5, -1.0], [0.0, 0.25]])
    close(make_advantage("mopd", reward_coef=0.5)(batch), [[1.0, -0.5], [-0.5, -0.25]])


def test_mopd_without_teacher_logprobs_is_an_error():
    batch = ScoredBatch(torch.zeros(1), torch.zeros(1, dtype=torch.long), torch.ones(1, 2))
    with pytest.raises(ValueError, match="teacher_logprobs_BT"):
        make_advantage("mopd")(batch)


def test_registry_and_config_validation():
    assert {"grpo", "mopd"} <= set(ADVANTAGES.names())
    with pytest.raises(pydantic.ValidationError, match="'grpo', 'mopd', 'rft'"):  # names the known types
        make_advantage("ppo")
    with pytest.raises(pydantic.ValidationError):
        make_advantage("grpo", eps=0.0)
    with pytest.raises(pydantic.ValidationError):
        make_advantage("grpo", scale_std=False)  # misspelt field is an error, not ignored


def test_scored_batch_checks_shapes():
    with pytest.raises(ValueError, match="rewards_B must have shape \\(2,\\)"):
        ScoredBatch(torch.zeros(3), torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(ValueError, match="teacher_logprobs_BT must have shape \\(2, 4\\)"):
        ScoredBatch(torch.zeros(2), torch.zeros(2), torch.ones(2, 4), teacher_logprobs_BT=torch.zeros(2, 3))


def test_rft_keeps_the_passing_rollouts_whole_groups_included():
    # rewards [1, 0 | 1, 1 | 0.5]: kept 1, 0 | 1, 1 (a group that all passed still teaches) | 0 (below 1).
    # The loop divides by the batch's 9 tokens; the kept rollouts hold 2 + 3 + 1 = 6, so each kept token
    # gets 9/6 = 1.5 and the loss is a token mean over the kept samples
    batch = ScoredBatch(
        rewards_B=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5]),
        group_ids_B=torch.tensor([0, 0, 1, 1, 2]),
        mask_BT=torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]).float(),
    )
    adv = make_advantage("rft")(batch)
    close(adv, [[1.5, 1.5, 0], [0, 0, 0], [1.5, 1.5, 1.5], [1.5, 0, 0], [0, 0, 0]])
    assert float((adv * batch.mask_BT).sum() / batch.mask_BT.sum()) == pytest.approx(1.0)
    close(make_advantage("rft", threshold=0.5)(batch)[4], [9 / 8, 9 / 8, 0])  # 8 kept tokens of 9
    batch.mask_BT[0] = 0  # out of the batch: no advantage even though it passed; 7 tokens, 4 kept
    close(make_advantage("rft")(batch)[:3, 0], [0, 0, 7 / 4])
    none = ScoredBatch(torch.zeros(2), torch.tensor([0, 0]), torch.ones(2, 2))
    close(make_advantage("rft")(none), [[0, 0], [0, 0]])  # nothing passed: no gradient, no division by zero


def test_rft_refuses_the_dynamic_filter_that_would_drop_all_passed_groups():
    from posttrain.configs.rl import AlgoConfig

    with pytest.raises(pydantic.ValidationError, match="dynamic_filter=false"):
        AlgoConfig(advantage="rft")
    assert AlgoConfig(advantage="rft", dynamic_filter=False).advantage.type == "rft"

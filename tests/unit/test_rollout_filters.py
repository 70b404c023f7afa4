"""Overlong and dynamic filtering, and refilling a batch from a queue of groups."""

import pytest
import torch

from posttrain.algos.rollout_filters import dynamic_filter, fill_groups, group_is_informative, overlong_filter


def test_overlong_filter_zeroes_the_whole_rollout_and_counts():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out, n = overlong_filter(["stop", "length", "stop"], mask)
    assert n == 1
    assert out.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert mask.tolist()[1] == [1, 1, 1]  # the input is not modified in place


def test_overlong_filter_checks_lengths():
    with pytest.raises(ValueError, match="2 finish reasons for 3 rollouts"):
        overlong_filter(["stop", "stop"], torch.ones(3, 2))


@pytest.mark.parametrize(
    "rewards, informative",
    [([], False), ([1.0], False), ([1.0, 1.0, 1.0], False), ([0.0, 1e-12], False), ([0.0, 0.5], True)],
)
def test_group_is_informative(rewards, informative):
    assert group_is_informative(rewards) is informative


def test_dynamic_filter_drops_groups_with_equal_rewards():
    # groups 0 (all solved) and 2 (all 0.5) carry no gradient; group 1 differs
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    keep, dropped = dynamic_filter(rewards, groups)
    assert keep.tolist() == [False, False, True, True, False, False]
    assert dropped == 2


def test_dynamic_filter_ignores_invalid_rollouts():
    # group rewards [1, 0, 1] but the 0 was overlong (invalid) → the valid rewards are equal → dropped
    keep, dropped = dynamic_filter(
        torch.tensor([1.0, 0.0, 1.0]), torch.tensor([4, 4, 4]), valid_B=torch.tensor([True, False, True])
    )
    assert keep.tolist() == [False, False, False] and dropped == 1


def test_fill_groups_pulls_lazily_until_enough_informative_groups():
    queue = [[1, 1], [0, 1], [0, 0], [1, 0], [0, 1]]
    pulled = []

    def source():
        for g in queue:
            pulled.append(g)
            yield g

    kept, dropped = fill_groups(source(), 2, rewards=lambda g: g)
    assert kept == [[0, 1], [1, 0]]
    assert dropped == 2
    assert len(pulled) == 4  # stops as soon as the batch is full; the last group stays queued


def test_fill_groups_returns_short_batch_when_the_queue_runs_out():
    kept, dropped = fill_groups(iter([[1, 1], [0, 1]]), 3, rewards=lambda g: g)
    assert kept == [[0, 1]] and dropped == 1

"""Group-relative length control by hand, including degenerate groups."""

from __future__ import annotations

import pytest

from posttrain.algos.length_control import conciseness_bonus, length_controlled_rewards, length_weights, percentile


def test_length_weights_by_hand():
    # w = 1 − (ℓ − 10)/(30 − 10): 1, .5, 0, .75 → mean .5625 → centred
    assert length_weights([10, 20, 30, 15]) == pytest.approx([0.4375, -0.0625, -0.5625, 0.1875])
    assert sum(length_weights([3, 8, 1, 100])) == pytest.approx(0)


@pytest.mark.parametrize("lengths", [[7, 7, 7], [5], [0, 0], []])
def test_degenerate_lengths_give_no_term_and_no_bonus(lengths):
    assert length_weights(lengths) == [0.0] * len(lengths)
    assert conciseness_bonus(lengths, [1.0] * len(lengths)) == [0.0] * len(lengths)


def test_percentile_is_linear_interpolation():
    assert percentile([1, 2, 3, 4, 5], 0.8) == pytest.approx(4.2)
    assert percentile([3.0], 0.8) == 3.0
    assert percentile([4, 1], 0.8) == pytest.approx(3.4)


def test_conciseness_bonus_quality_gate():
    base = [1.0, 2.0, 3.0, 4.0, 5.0]  # 80th percentile 4.2
    assert conciseness_bonus([10, 20, 30, 40, 5], base) == [0, 0, 0, 0, 0.5]  # shortest has base 5 ≥ 4.2
    assert conciseness_bonus([5, 20, 30, 40, 50], base) == [0] * 5  # shortest has base 1 < 4.2: gated out
    assert conciseness_bonus([9, 9, 30, 4, 4], [5, 5, 1, 4.5, 5]) == [0, 0, 0, 0, 0.5]  # tie at 4: only the gated one
    assert conciseness_bonus([4, 9, 4], [3, 3, 3]) == [0.5, 0, 0.5]  # equal rewards: both shortest pass


def test_length_controlled_rewards_by_hand():
    base = [4.0, 3.0, 2.0, 5.0]
    think = [100, 50, 0, 200]  # w = .5, .75, 1, 0 → mean .5625 → −.0625, .1875, .4375, −.5625
    answer = [10, 10, 30, 20]  # w = 1, 1, 0, .5 → mean .625 → .375, .375, −.625, −.125
    # gate: 80th percentile of base = 4.4; shortest reasoning is #2 (base 2): no bonus;
    # shortest answers are #0 (4 < 4.4) and #1: no bonus
    out = length_controlled_rewards(base, think, answer)
    expect = [4 + 0.5 * (-0.0625 + 0.375), 3 + 0.5 * (0.1875 + 0.375), 2 + 0.5 * (0.4375 - 0.625),
              5 + 0.5 * (-0.5625 - 0.125)]
    assert out == pytest.approx(expect)
    # the best response now also writes the shortest answer: +0.5 for it
    out = length_controlled_rewards(base, think, [10, 10, 30, 5])
    w = [0.15, 0.15, -0.65, 0.35]  # w = .8, .8, 0, 1 → mean .65
    assert out[3] == pytest.approx(5 + 0.5 * (-0.5625 + w[3] + 0.0) + 0.5)
    assert out[0] == pytest.approx(4 + 0.5 * (-0.0625 + w[0]))


def test_length_controlled_rewards_degenerate_groups():
    assert length_controlled_rewards([3.0], [10], [5]) == [3.0]  # one response
    # reasoning off (all reasoning empty) and empty answers everywhere: base rewards unchanged
    assert length_controlled_rewards([1.0, 2.0, 3.0], [0, 0, 0], [0, 0, 0]) == [1.0, 2.0, 3.0]
    # the recipe as written: one empty answer among others is the shortest (w = 1), no bonus with a low reward
    out = length_controlled_rewards([1.0, 4.0, 4.0], [0, 0, 0], [0, 10, 20], bonus=0.5, empty_answer_credit=True)
    assert out == pytest.approx([1 + 0.5 * 0.5, 4 + 0.5 * 0.0, 4 + 0.5 * -0.5])
    # the default: the empty answer gets the longest's w = 0; w = 0, 1, 0 → centred −1/3, 2/3, −1/3,
    # and the shortest non-empty answer (10, base 4 ≥ gate 4) takes the bonus
    out = length_controlled_rewards([1.0, 4.0, 4.0], [0, 0, 0], [0, 10, 20], bonus=0.5)
    assert out == pytest.approx([1 - 0.5 / 3, 4 + 0.5 * 2 / 3 + 0.5, 4 - 0.5 / 3])
    with pytest.raises(ValueError):
        length_controlled_rewards([1.0, 2.0], [1], [1, 2])
    # coefficients a, b separately
    assert length_controlled_rewards([0.0, 0.0], [1, 2], [2, 1], think_coef=1.0, answer_coef=0.0, bonus=0.0) == [0.5, -0.5]


def test_a_lazy_empty_answer_is_not_paid_for_silence():
    """The collapse of docs/results/rlhf_length_control.md: a judge that barely tells replies apart
    (spread 0.1) and one empty reply. As the recipe writes it the empty reply has the top reward of
    the group; by default it has the lowest."""
    base, think, answer = [2.9, 3.0, 3.05, 3.1], [0, 0, 0, 0], [0, 60, 90, 120]
    written = length_controlled_rewards(base, think, answer, empty_answer_credit=True)
    assert max(range(4), key=written.__getitem__) == 0
    guarded = length_controlled_rewards(base, think, answer)
    assert min(range(4), key=guarded.__getitem__) == 0
    assert length_weights([0, 0, 5], empty_credit=False) == pytest.approx([-1 / 3, -1 / 3, 2 / 3])
    assert conciseness_bonus([0, 5, 9], [3, 3, 3], empty_credit=False) == [0, 0.5, 0]
    assert conciseness_bonus([0, 0], [3, 3], empty_credit=False) == [0, 0]


def test_scale_multiplies_every_length_term_and_zero_turns_them_off():
    base, think, answer = [4.0, 3.0, 2.0, 5.0], [100, 50, 0, 200], [10, 10, 30, 20]
    one = length_controlled_rewards(base, think, answer)
    half = length_controlled_rewards(base, think, answer, scale=0.5)
    assert [h - b for h, b in zip(half, base)] == pytest.approx([(o - b) / 2 for o, b in zip(one, base)])
    assert length_controlled_rewards(base, think, answer, scale=0.0) == base
    with pytest.raises(ValueError):
        length_controlled_rewards(base, think, answer, scale=-1.0)


def test_grpo_advantage_does_not_assume_unit_rewards():
    """RLHF rewards (≈1–5 plus length terms, possibly negative) and the genrm environment's [0, 1]
    map of R: GRPO's group-normalised advantage is the same under a positive affine map."""
    import torch

    from posttrain.algos.advantages import group_advantages

    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    r = torch.tensor([4.75, 2.0, -0.5, 3.0, 3.5, 7.0])
    a = group_advantages(r, groups)
    assert torch.allclose(a, group_advantages(1 + r / 23, groups), atol=1e-4)
    assert torch.allclose(a[:3].sum(), torch.tensor(0.0), atol=1e-5) and a[0] > 0 > a[2]

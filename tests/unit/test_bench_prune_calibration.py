"""bench/prune_calibration.py's rule: the cheapest setting within max(2 paired se, 0.01 nats) of the best."""

import pytest

from tests.script_module import script_module


def test_pick_takes_the_cheapest_setting_within_the_margin_of_the_best():
    with script_module("bench", "prune_calibration") as m:
        cost = {8: 1, 32: 4, 128: 16}
        # 8 rows: 0.05 worse than the best (128) in every draw, se 0 -> outside the 0.01 margin;
        # 32 rows: 0.005 worse -> inside it, and cheaper than 128: picked.
        losses = {8: [1.05, 1.15, 1.25], 32: [1.005, 1.105, 1.205], 128: [1.0, 1.1, 1.2]}
        chosen, table = m.pick([8, 32, 128], losses, cost)
        assert chosen == 32
        assert table[8]["minus_best"][0] == pytest.approx(0.05)
        assert table[128]["minus_best"] == pytest.approx((0.0, 0.0))
        # a noisy difference: 0.03 on average but se large -> within 2 se, so the cheap one is kept
        noisy = {8: [0.9, 1.3, 0.99], 128: [1.0, 1.1, 1.0]}
        assert m.pick([8, 128], noisy, {8: 1, 128: 16})[0] == 8


def test_settings_vary_one_choice_at_a_time_from_the_defaults():
    with script_module("bench", "prune_calibration") as m:
        args = type("A", (), {"samples": [8, 64], "lengths": [128, 256]})()
        got = [m.key(s) for s in m.settings(args)]
        assert got == ["64x256/mean", "8x256/mean", "64x128/mean", "64x256/l2"]

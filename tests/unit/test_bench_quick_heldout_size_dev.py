"""bench/quick_heldout_size_dev.py: the sizing rule, written before the bench ran."""

from __future__ import annotations

from tests.script_module import script_module


def test_pick_is_the_smallest_size_clear_on_every_seed():
    with script_module("bench", "quick_heldout_size_dev") as bench:
        clear = (0.15, 0.04)  # 3.75 se
        short = (0.10, 0.04)  # 2.5 se
        # 96 misses on one seed, 144 is clear on all three: 144, not 192
        assert bench.pick({96: [clear, short, clear], 144: [clear, clear, clear], 192: [clear] * 3}) == 144
        assert bench.pick({96: [clear] * 3, 144: [short] * 3, 192: [short] * 3}) == 96
        # exactly 3 se counts; none clear anywhere: the largest
        assert bench.pick({96: [(0.12, 0.04)] * 3, 144: [short] * 3, 192: [short] * 3}) == 96
        assert bench.pick({96: [short] * 3, 144: [short] * 3, 192: [short] * 3}) == 192
        # a negative gain is never clear, even with a zero se
        assert bench.pick({96: [(-0.1, 0.0)] * 3, 144: [clear] * 3, 192: [clear] * 3}) == 144

"""bench/grpo_vs_trl.py's posttrain side: the equal-work mode trains every rollout, the skip mode only
those with a non-zero advantage (tiny model; TRL is not needed for this)."""

from __future__ import annotations

import pytest

from tests.script_module import script_module

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def grpo_bench():
    with script_module("bench", "grpo_vs_trl") as m:
        yield m


def test_equal_work_trains_every_rollout_and_skip_mode_only_informative_ones(grpo_bench, tmp_path):
    rollouts = grpo_bench.PROMPTS * grpo_bench.GROUP
    equal = grpo_bench.run_posttrain("tiny-llama", 1, tmp_path / "equal", "equal", threads=1)
    assert equal["rollouts_per_step"] == [rollouts]
    # the random tiny model rarely earns a reward: most groups have equal rewards, and the skip mode
    # drops them whole (same seed, same rollouts: only the trained count differs)
    skip = grpo_bench.run_posttrain("tiny-llama", 1, tmp_path / "skip", "skip", threads=1)
    assert all(n % grpo_bench.GROUP == 0 for n in skip["rollouts_per_step"])
    assert sum(skip["rollouts_per_step"]) < sum(equal["rollouts_per_step"])
    assert skip["reward"] == equal["reward"]
    # what makes the two modes differ is in each run's saved config, not only in the bench's table
    import yaml

    algo = {m: yaml.safe_load((tmp_path / m / "config.yaml").read_text())["algo"] for m in ("equal", "skip")}
    assert not algo["equal"]["dynamic_filter"] and not algo["equal"]["skip_zero_advantage"]
    assert algo["skip"]["dynamic_filter"] and algo["skip"]["skip_zero_advantage"]

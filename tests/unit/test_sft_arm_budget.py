"""The longer-SFT arm's budget: the RL stage's time at the SFT stage's pace (experiments/pipeline.py)."""

from posttrain.experiments.pipeline import arm_budget


def test_the_arm_gets_the_rl_stages_time_at_the_sft_pace_on_cpu_time():
    sft = {"steps": 40, "seconds": 200.0, "cpu_seconds": 400.0}
    rl = {"seconds": 600.0, "cpu_seconds": 1000.0}
    # 10 CPU s a step; the RL stage's 1000 CPU s buys 100 steps (wall time would say 120 on a shared machine)
    assert arm_budget(sft, rl) == ("cpu_seconds", 10.0, 100)


def test_wall_time_when_a_stage_recorded_no_cpu_time():
    assert arm_budget({"steps": 2, "seconds": 4.0, "cpu_seconds": 0.0}, {"seconds": 10.0, "cpu_seconds": 7.0}) == \
        ("seconds", 2.0, 5)


def test_a_stage_faster_than_the_clock_does_not_divide_by_zero():
    # a tiny model's two SFT steps on a Zen 5 recorded 0.0 s on both clocks: the CI pipeline test crashed here
    clock, pace, steps = arm_budget({"steps": 2, "seconds": 0.0, "cpu_seconds": 0.0}, {"seconds": 0.5, "cpu_seconds": 0.0})
    assert (clock, pace, steps) == ("seconds", 1e-3, 500)
    assert arm_budget({"steps": 2, "seconds": 0.0, "cpu_seconds": 0.0}, {"seconds": 0.0, "cpu_seconds": 0.0})[2] == 1


def test_a_resumed_sft_stage_paces_by_the_steps_it_ran():
    """Killed at step 30 of 40 and resumed: the cached stage timed 10 steps, not 40. Dividing by 40
    would make each step look 4x cheaper and hand the same-time control 4x the steps."""
    sft = {"steps": 40, "steps_run": 10, "seconds": 100.0, "cpu_seconds": 100.0}
    assert arm_budget(sft, {"seconds": 200.0, "cpu_seconds": 200.0}) == ("cpu_seconds", 10.0, 20)
    # resumed after its last step: nothing ran, and the pace is not a division by zero
    assert arm_budget({**sft, "steps_run": 0, "cpu_seconds": 3.0}, {"seconds": 6.0, "cpu_seconds": 6.0})[2] == 2

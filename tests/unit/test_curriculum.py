"""Curriculum: the moving Gaussian target, domain shares, samplers, the plateau rule, profile files."""

import math
from collections import Counter

import numpy as np
import pytest

from posttrain.algos.curriculum import (
    DomainMixSampler,
    GaussianCurriculum,
    PlateauDetector,
    ProfileError,
    RandomSampler,
    TaskProfile,
    largest_remainder,
    profile_row,
    read_profile,
    sample_without_replacement,
    target_mean,
    write_profile,
)

MATH = [TaskProfile("m-easy", "math", 0.8, 4), TaskProfile("m-mid", "math", 0.5, 4),
        TaskProfile("m-solved", "math", 1.0, 4), TaskProfile("m-hard", "math", 0.2, 4)]


def test_target_mean_moves_linearly_and_clamps():
    # 0.8 + p·(0.2 − 0.8)
    assert target_mean(0.0, 0.8, 0.2) == pytest.approx(0.8)
    assert target_mean(0.5, 0.8, 0.2) == pytest.approx(0.5)
    assert target_mean(1.0, 0.8, 0.2) == pytest.approx(0.2)
    assert target_mean(1.7, 0.8, 0.2) == pytest.approx(0.2)


def test_curriculum_drops_solved_tasks_and_weights_by_gaussian_density():
    # σ = 0.3, 2σ² = 0.18. At p = 0 (μ = 0.8), rates [0.8, 0.5, 0.2] (1.0 dropped):
    #   log w = [0, −0.09/0.18, −0.36/0.18] = [0, −0.5, −2] → w = [1, 0.606531, 0.135335], Σ = 1.741866
    #   p = [0.574097, 0.348207, 0.077696]
    # At p = 1 (μ = 0.2) the same numbers in reverse order.
    cur = GaussianCurriculum(MATH, mean_start=0.8, mean_end=0.2, std=0.3)
    assert cur.n_solved_dropped == 1
    np.testing.assert_allclose(cur.probabilities("math", 0.0), [0.574097, 0.348207, 0.077696], atol=1e-6)
    np.testing.assert_allclose(cur.probabilities("math", 1.0), [0.077696, 0.348207, 0.574097], atol=1e-6)


def test_gumbel_top_k_draws_with_the_right_probabilities():
    # first-drawn frequencies over 4000 seeded draws match p = [0.574, 0.348, 0.078] (±0.03, ~4 s.e.)
    lw = np.array([0.0, -0.5, -2.0])
    rng = np.random.default_rng(0)
    firsts = Counter(int(sample_without_replacement(lw, 1, rng)[0]) for _ in range(4000))
    np.testing.assert_allclose([firsts[i] / 4000 for i in range(3)], [0.574097, 0.348207, 0.077696], atol=0.03)


def test_sampling_is_without_replacement_and_seeded():
    cur = GaussianCurriculum(MATH, std=0.3)
    draw = cur.sample("math", 3, 0.5, np.random.default_rng(1))
    assert sorted(draw) == ["m-easy", "m-hard", "m-mid"]
    assert draw == cur.sample("math", 3, 0.5, np.random.default_rng(1))
    with pytest.raises(ValueError, match="domain 'math' has 3 tasks"):
        cur.sample("math", 4, 0.5, np.random.default_rng(1))


def test_far_tasks_stay_possible_without_underflow():
    # σ tiny: exp(−0.36/2e-8) underflows to 0 in linear space, but log-space sampling still draws it
    cur = GaussianCurriculum(MATH, std=1e-4)
    assert sorted(cur.sample("math", 3, 0.0, np.random.default_rng(0))) == ["m-easy", "m-hard", "m-mid"]


@pytest.mark.parametrize(
    "ratios, total, expected",
    [
        # quotas 3.5, 2.1, 1.4 → floors 3, 2, 1 (6); one unit left → largest remainder (.5) → math
        ({"math": 0.5, "code": 0.3, "if": 0.2}, 7, {"math": 4, "code": 2, "if": 1}),
        # quotas 4/3 each → floors 1, 1, 1; one left, remainders tie → the first listed
        ({"a": 1, "b": 1, "c": 1}, 4, {"a": 2, "b": 1, "c": 1}),
        ({"a": 2, "b": 0}, 5, {"a": 5, "b": 0}),
    ],
)
def test_largest_remainder(ratios, total, expected):
    assert largest_remainder(ratios, total) == expected


def test_largest_remainder_always_sums_to_total():
    rng = np.random.default_rng(0)
    for total in range(0, 40):
        ratios = {str(i): float(r) for i, r in enumerate(rng.random(5))}
        assert sum(largest_remainder(ratios, total).values()) == total
    with pytest.raises(ValueError):
        largest_remainder({"a": 0.0}, 3)


def _two_domain_profile():
    rows = [TaskProfile(f"m{i}", "math", i / 10, 8) for i in range(10)]
    rows += [TaskProfile(f"c{i}", "code", i / 10, 8) for i in range(10)]
    return rows


def test_domain_mix_keeps_fixed_shares_and_is_deterministic_per_step():
    mix = DomainMixSampler(GaussianCurriculum(_two_domain_profile()), {"math": 0.75, "code": 0.25}, seed=3)
    for step in range(5):
        batch = mix.sample(8, step=step, progress=step / 4)
        assert Counter(d for d, _ in batch) == {"math": 6, "code": 2}
        assert len(set(batch)) == 8
        assert all(t.startswith(d[0]) for d, t in batch)
    assert mix.sample(8, step=2, progress=0.5) == mix.sample(8, step=2, progress=0.5)
    assert mix.sample(8, step=2, progress=0.5) != mix.sample(8, step=3, progress=0.5)


def test_curriculum_hardens_over_training():
    # mean profiled pass rate of drawn math tasks: high at p = 0 (μ = 0.8), low at p = 1 (μ = 0.2)
    cur = GaussianCurriculum(_two_domain_profile(), std=0.15)
    rng = np.random.default_rng(0)
    early = np.mean([cur.expected_pass_rate(cur.sample("math", 3, 0.0, rng)) for _ in range(200)])
    late = np.mean([cur.expected_pass_rate(cur.sample("math", 3, 1.0, rng)) for _ in range(200)])
    assert early > 0.6 and late < 0.35


def test_domain_mix_rejects_unknown_domains():
    with pytest.raises(ValueError, match="'chat'"):
        DomainMixSampler(RandomSampler({"math": ["a"]}), {"math": 1, "chat": 1})


def test_random_sampler_from_profile_drops_solved_and_draws_distinct():
    rs = RandomSampler.from_profile(MATH)
    assert sorted(rs.sample("math", 3, 0.0, np.random.default_rng(0))) == ["m-easy", "m-hard", "m-mid"]
    assert "m-solved" in RandomSampler.from_profile(MATH, drop_solved=False).sample(
        "math", 4, 0.0, np.random.default_rng(0)
    )


def test_plateau_detector():
    # W = 2, δ = 0.1, M = 4.
    # step 4: last 2 mean (.3 + .4)/2 = .35 vs before (.1 + .2)/2 = .15 → +.2 ≥ .1 → keep going
    # step 5: (.4 + .45)/2 = .425 vs (.2 + .3)/2 = .25 → +.175 → keep going
    # step 6: (.45 + .42)/2 = .435 vs (.3 + .4)/2 = .35 → +.085 < .1 → plateau, then counting restarts
    det = PlateauDetector(window=2, min_delta=0.1, min_steps=4)
    fired = [det.update(v) for v in [0.1, 0.2, 0.3, 0.4, 0.45, 0.42]]
    assert fired == [False] * 5 + [True]
    # flat afterwards: needs max(M, 2W) = 4 new values before it can fire again
    assert [det.update(0.4) for _ in range(4)] == [False, False, False, True]


def test_plateau_detector_waits_min_steps():
    det = PlateauDetector(window=2, min_delta=0.1, min_steps=6)
    assert [det.update(0.5) for _ in range(6)] == [False] * 5 + [True]


def test_profile_row():
    assert profile_row("t", "math", [1, 0, 1, 1]) == TaskProfile("t", "math", 0.75, 4)


def test_profile_roundtrip(tmp_path):
    path = tmp_path / "profile.jsonl"
    write_profile(path, MATH)
    assert read_profile(path) == MATH


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"task_id": "a", "domain": "math", "pass_rate": 1.5, "k": 4}', "field 'pass_rate'"),
        ('{"task_id": "a", "domain": "math", "pass_rate": 0.5}', "field 'k'"),
        ('{"task_id": "", "domain": "math", "pass_rate": 0.5, "k": 4}', "field 'task_id'"),
        ('{"task_id": "a", "domain": "math", "pass_rate": 0.5, "k": 4, "x": 1}', "unknown field"),
        ('{"task_id": "a", ', "invalid JSON"),
    ],
)
def test_profile_errors_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"task_id": "z", "domain": "math", "pass_rate": 0.5, "k": 4}\n' + line + "\n")
    with pytest.raises(ProfileError, match=rf"p\.jsonl:2: .*{message}"):
        read_profile(path)


def test_profile_duplicate_task(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"task_id": "z", "domain": "math", "pass_rate": 0.5, "k": 4}\n' * 2)
    with pytest.raises(ProfileError, match="p.jsonl:2: task_id 'z' already on line 1"):
        read_profile(path)


def test_expected_pass_rate():
    cur = GaussianCurriculum(MATH)
    assert cur.expected_pass_rate(["m-easy", "m-hard"]) == pytest.approx(0.5)
    assert math.isnan(cur.expected_pass_rate([]))

import json
import math

import pytest

from posttrain.eval.compare import modal_choice, paired_gain, read_task_rewards


def test_paired_gain_hand_computed():
    before = {"a": 0.0, "b": 1.0, "c": 0.0, "d": 0.0}
    after = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "extra": 1.0}  # "extra" is not in before: ignored
    g = paired_gain(before, after)
    # differences 1, 0, 1, 0: mean 0.5, sample variance 1/3, se = sqrt(1/3 / 4)
    assert (g.n, g.gained, g.lost) == (4, 2, 0)
    assert g.before == pytest.approx(0.25) and g.after == pytest.approx(0.75)
    assert g.gain == pytest.approx(0.5)
    assert g.se == pytest.approx(math.sqrt(1 / 3 / 4))


def test_paired_se_is_smaller_than_unpaired_when_tasks_agree():
    # 40 tasks both solve or both fail, 2 flip up: the paired se sees only the flips
    before = {str(i): float(i < 20) for i in range(42)}
    after = dict(before, **{"40": 1.0, "41": 1.0})
    g = paired_gain(before, after)
    unpaired = math.sqrt(g.before * (1 - g.before) / 42 + g.after * (1 - g.after) / 42)
    assert g.gain == pytest.approx(2 / 42)
    assert g.se < unpaired / 2


def test_paired_gain_needs_shared_tasks():
    with pytest.raises(ValueError, match="same validation tasks"):
        paired_gain({"a": 1.0}, {"b": 1.0})


def test_read_task_rewards(tmp_path):
    f = tmp_path / "v.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"env": "math", "task_id": "m1", "reward": 1.0}, {"env": "mcq", "task_id": "q1", "reward": 0}]) + "\n")
    assert read_task_rewards(f) == {"math": {"m1": 1.0}, "mcq": {"q1": 0.0}}
    f.write_text('{"env": "math", "reward": 1}\n')
    with pytest.raises(ValueError, match=r"v.jsonl:1: not a validation row"):
        read_task_rewards(f)


def test_modal_choice_names_the_letter_a_guessing_policy_sits_on():
    reasons = ["correct: chose C", "wrong_answer: chose C", "no_answer", "wrong_answer: chose C", "wrong_answer: chose A"]
    assert modal_choice(reasons) == ("C", 0.75, 4)  # replies without a letter do not count
    assert modal_choice(["correct", "wrong_answer", "not_a_number"]) is None  # not multiple choice
    assert modal_choice([]) is None


def test_mean_over_runs_by_hand():
    from posttrain.eval.compare import mean_over_runs

    # gains 0.1 and 0.3 with paired se 0.03 and 0.04: mean 0.2, se sqrt(0.0009 + 0.0016) / 2 = 0.025
    assert mean_over_runs([(0.1, 0.03), (0.3, 0.04)]) == pytest.approx((0.2, 0.025))
    assert mean_over_runs([(-0.05, 0.02)]) == pytest.approx((-0.05, 0.02))
    with pytest.raises(ValueError):
        mean_over_runs([])

"""The report's RL-against-controls table names the split it read: a dev table (``table_split=dev``,
where settings are chosen) must never be printed as the test one."""

from __future__ import annotations

from posttrain.experiments import pipeline_report


def _table(split: str | None) -> dict:
    t = {"scores": {"sft": {"all": 0.4}, "rl": {"all": 0.5}}, "n_tasks": 4,
         "comparisons": {"RL − SFT": {"all": {"gain": 0.1, "se": 0.04}}}}
    if split:
        t["split"] = split
    return t


def test_a_dev_table_is_labelled_dev_and_not_as_chosen_on_nothing():
    text = "\n".join(pipeline_report.test_table_md(_table("dev")))
    assert "**dev** split" in text and "settings are chosen on these figures" in text
    assert "test" not in text and "nothing was chosen" not in text


def test_a_test_table_and_an_old_one_without_a_split_read_test():
    for split in ("test", None):
        text = "\n".join(pipeline_report.test_table_md(_table(split)))
        assert "**test** split" in text and "nothing was chosen on these figures" in text


def test_the_markdown_table_gives_the_constant_answer_and_flags_who_does_no_better():
    t = _table("test")
    t["constant_answer"] = {"math": {"constant": {"answer": "1", "score": 0.25, "n": 200}, "models": {
        "sft": {"answer": "15", "share": 0.07, "score": 0.045, "flagged": True},
        "rl": {"answer": "1", "share": 0.34, "score": 0.30, "flagged": False}}}}
    text = "\n".join(pipeline_report.test_table_md(t))
    assert "one constant answer (`1`) would score 0.250 on these 200 tasks" in text
    assert "| most common answer | `15` (7%) | `1` (34%) |" in text and "| score | 0.045 ⚑ | 0.300 |" in text


def test_the_markdown_table_gives_each_shortcut_and_the_score_beyond_them():
    t = _table("test")
    t["shortcuts"] = {"lcm": {"n": 70, "pays": {"product": 0.4, "larger number": 0.2}, "n_beyond": 28, "models": {
        "sft": {"n": 70, "score": 0.05, "gives": {"product": 0.1, "larger number": 0.0}, "beyond": {"n": 28, "score": 0.0}},
        "rl": {"n": 70, "score": 0.2, "gives": {"product": 0.0, "larger number": 0.6}, "beyond": {"n": 28, "score": None}}},
        "beyond_comparisons": {"RL − SFT": {"gain": 0.0, "se": 0.0, "n": 28}}}}
    text = "\n".join(pipeline_report.test_table_md(t))
    assert "(product: 40%, larger number: 20%); 28 tasks no shortcut answers" in text
    assert "| gives larger number | 0% | 60% |" in text and "| score beyond shortcuts | 0.000 | n/a |" in text
    assert "- RL − SFT, beyond shortcuts: +0.000 ± 0.000 (28 tasks)" in text

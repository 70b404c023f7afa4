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

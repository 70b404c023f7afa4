"""bench/math_family_probe.py's lazy answers: what a policy that needs no skill earns on a family's dev
questions (the most common answer, and the family's shortcuts), the check trial 9 lacked."""

from __future__ import annotations

from tests.script_module import script_module


def test_lazy_answers_give_the_most_common_answer_and_each_shortcut_on_dev():
    with script_module("bench", "math_family_probe") as probe:
        lazy = probe.lazy_answers(["gcd", "lcm", "addition", probe.INSTRUCTION], 60)
    gcd, lcm, add = lazy["gcd"], lazy["lcm"], lazy["addition"]
    # "always 1" is a constant: when 1 is GCD's most common answer it pays exactly the modal share
    assert gcd["modal"] == "1" and gcd["shortcuts"]["always 1"] == gcd["modal_share"] > 0.2
    assert set(lcm["shortcuts"]) == {"product", "larger number"} and lcm["best"] == max(lcm["shortcuts"].values()) > 0.2
    assert add["shortcuts"] == {} and add["best"] == add["modal_share"] < 0.2
    assert all(x["tasks"] == 60 for x in lazy.values())
    assert probe.INSTRUCTION not in lazy  # no numeric answer: nothing to say

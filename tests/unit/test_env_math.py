"""Math environment: tasks from reasoning-gym families, binary reward via math_verify."""

import threading
import time

import pytest

from posttrain.envs.base import Task, make_env
from posttrain.envs.math_env import FAMILIES, MathEnv, grade_math, number_core


def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def task(gold: str) -> Task:
    return Task(id="t", domain="math", messages=[{"role": "user", "content": "?"}], ground_truth=gold)


@pytest.fixture(scope="module")
def env() -> MathEnv:
    return make_env("math")


@pytest.fixture(scope="module")
def train(env) -> list[Task]:
    return env.tasks("train", 400, seed=0)


@pytest.mark.parametrize(
    "gold, text",
    [
        ("7", "3 + 4 = 7\nAnswer: 7"),
        ("7", "Answer: 7.0"),
        ("7", "\\boxed{7}"),
        ("-4", "Answer: \u22124"),
        ("0.5", "Answer: 1/2"),
        ("138/583", "Answer: \\frac{276}{1166}"),
        ("$\\dfrac{3}{37}$", "Answer: 3/37"),
        ("4/5", "Answer: \\dfrac{4}{5}"),  # bare LaTeX, as the question itself writes it
        ("4/5", "\\boxed{\\dfrac{8}{10}}"),
        ("13", "Answer: e = 13"),
        ("2842", "Answer: 2,842"),
        ("1687.5", "The answer is 1687.5 dollars."),
    ],
)
def test_correct_answers_score_one(env, gold, text):
    result = env.verify(task(gold), reply(text))
    assert result.reward == 1.0 and result.components == {"format": 1.0, "correct": 1.0}


@pytest.mark.parametrize(
    "gold, text, reason",
    [
        ("7", "Answer: 8", "wrong_answer"),
        ("138/583", "Answer: 0.2367", "wrong_answer"),  # rounded, not equal
        ("7", "I have no idea.", "no_answer"),
        ("7", "", "no_answer"),
        ("7", "Answer: seven-ish", "not_a_number"),
        ("7", "Answer: 10^10^10", "not_a_number"),  # would hang sympy; never reaches it
        ("7", "Answer: 9**9**9**9", "not_a_number"),
        ("7", "Answer: " + "1+" * 150 + "1", "answer_too_long"),
        ("-39", "Answer: 6 + 9 * -5", "not_a_number"),  # echoing the question is not an answer
        ("7", "Answer: 3 + 4", "not_a_number"),
    ],
)
def test_wrong_or_missing_answers_score_zero(env, gold, text, reason):
    result = env.verify(task(gold), reply(text))
    assert result.reward == 0.0 and result.reason == reason


@pytest.mark.parametrize(
    "pred, core",
    [("-39", "-39"), ("x = 13", "13"), ("1687.5 dollars", "1687.5"), ("2,842", "2,842"),
     ("\\dfrac{4}{5}", "\\dfrac{4}{5}"), ("4 / 5", "4 / 5"), ("7 legs in total.", "7"), ("45°", "45"),
     ("7 \\text{ legs}", "7"), ("6 + 9 * -5", None), ("2^{10}", None), ("seven", None), ("13 = e", None)],
)
def test_number_core(pred, core):
    assert number_core(pred) == core


def test_fractions_must_be_in_lowest_terms():
    gold = "$\\frac{4}{5}$"
    assert grade_math("\\frac{4}{5}", gold, "lowest_terms") == (True, "correct")
    assert grade_math("4/5", gold, "lowest_terms") == (True, "correct")
    assert grade_math("20/25", gold, "lowest_terms") == (False, "not_in_lowest_terms")
    assert grade_math("0.8", gold, "lowest_terms") == (False, "not_in_lowest_terms")
    assert grade_math("5/4", gold, "lowest_terms") == (False, "wrong_answer")
    assert grade_math("20/25", gold) == (True, "correct")  # the plain number form accepts it


def test_fraction_tasks_carry_their_answer_form(env):
    t = next(env._stream("fraction_simplification", 1, seed=0))
    unsimplified = t.messages[0]["content"].split("fraction ")[1].split(" to its")[0].strip("$")
    assert t.metadata["answer_form"] == "lowest_terms"
    assert env.verify(t, reply(f"Answer: {unsimplified}")).reason == "not_in_lowest_terms"
    assert env.verify(t, reply(f"Answer: {t.ground_truth}")).reward == 1.0


def test_last_number_fallback_is_graded_but_flagged_as_format_0(env):
    result = env.verify(task("7"), reply("3 + 4 makes 7"))
    assert result.reward == 1.0 and result.components["format"] == 0.0


def test_echo_of_the_question_scores_zero():
    """Repeating the question used to score 1.0 on 95 of 2,000 training tasks (the last-number
    fallback read the question's last number: "LCM of 3 and 12", "5 * 1", "0 + 7")."""
    from posttrain.envs.math_env import ANSWER_INSTRUCTION, MathEnv

    env = MathEnv()
    for t in env.tasks("train", n=2000):
        question = t.messages[0]["content"].replace(ANSWER_INSTRUCTION, "").strip()
        assert env.verify(t, reply(question)).reward == 0.0, question
    lcm = Task("x", "math", [{"role": "user", "content": "Find the LCM of 3 and 12.\n\n" + ANSWER_INSTRUCTION}], "12")
    assert env.verify(lcm, reply("Find the LCM of 3 and 12.")).reason == "echoes_question"
    assert env.verify(lcm, reply("12")).reward == 1.0  # a bare answer is no echo
    assert env.verify(lcm, reply("The LCM of 3 and 12 is 12")).reward == 1.0
    assert env.verify(lcm, reply("3 and 12 give 12")).reward == 1.0


def test_reasoning_is_never_graded(env):
    wrong_final = env.verify(task("7"), reply("<think>Answer: 7</think>\nAnswer: 8"))
    right_final = env.verify(task("7"), reply("<think>maybe 8? Answer: 8</think>\nAnswer: 7"))
    truncated = env.verify(task("7"), reply("<think>so it is 7. Answer: 7"))  # never closed
    assert (wrong_final.reward, right_final.reward, truncated.reward) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize("text", ["\x00\x01\ufffd", "}}}{{{\\boxed{", "Answer: \\frac{1}{0}", "Answer: nan", "Answer: zoo"])
def test_garbage_scores_zero_without_raising(env, text):
    assert env.verify(task("7"), reply(text)).reward == 0.0


def test_pathological_answers_are_rejected_fast():
    start = time.perf_counter()
    for expr in ["10^{10^{10}}", "(2^{50})^{50}", "2^{100000}"]:
        assert grade_math(expr, "7")[0] is False
    assert time.perf_counter() - start < 5


def test_verify_works_off_the_main_thread(env):
    # math_verify's default signal-based timeout raises in non-main threads; ours is off.
    results = []
    worker = threading.Thread(target=lambda: results.append(env.verify(task("0.5"), reply("Answer: 2/4"))))
    worker.start()
    worker.join(timeout=30)
    assert [r.reward for r in results] == [1.0]


def test_tasks_are_deterministic_and_splits_disjoint(env, train):
    assert [t.to_dict() for t in env.tasks("train", 400, seed=0)] == [t.to_dict() for t in train]
    assert [t.id for t in env.tasks("train", 50, seed=1)] != [t.id for t in train[:50]]
    ids = {t.id for t in train} | {t.id for t in env.tasks("train", 400, seed=1)}
    validation = {t.id for s in (0, 1) for t in env.tasks("dev", 60, seed=s)}
    assert len({t.id for t in train}) == len(train) and not ids & validation


def test_tasks_cover_the_difficulty_spread(train):
    levels = {(t.metadata["family"], t.metadata["difficulty"]) for t in train}
    assert {("addition", 1), ("addition", 2), ("addition", 3)} <= levels
    easy = sum(t.metadata["difficulty"] == 1 for t in train) / len(train)
    assert easy > 0.35  # the curriculum needs tasks the small model can solve
    prompt = train[0].messages[0]["content"]
    assert prompt.rstrip().endswith('"Answer: <answer>".')


def test_every_family_reference_grades_itself_and_rejects_a_neighbour(env):
    for family, spec in FAMILIES.items():
        for level in spec.levels:
            stream = env._stream(family, level, seed=0)
            for _ in range(3):
                t = next(stream)
                assert t.metadata["family"] == family and t.metadata["difficulty"] == level
                gold = t.ground_truth
                assert grade_math(gold.strip("$"), gold, spec.answer_form) == (True, "correct"), (family, gold)
                if gold.lstrip("-").isdigit():
                    assert grade_math(str(int(gold) + 1), gold)[0] is False


def test_one_digit_addition_pool_runs_dry_instead_of_repeating(env):
    questions = [t.messages[0]["content"] for t in env._stream("addition", 1, seed=0)]
    assert len(questions) == len(set(questions)) <= 121  # 0..10 + 0..10


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown math families"):
        MathEnv(families=["calculus"])


@pytest.mark.timeout(20)
def test_trailing_unit_strip_does_not_backtrack_exponentially():
    # 30 letters then a comma took ~5 minutes with the nested-quantifier unit regex.
    from posttrain.envs.math_env import number_core

    assert number_core("11 " + "x" * 60 + ",") is None
    assert number_core("so the answer is eleven which represents the whole total, really") is None
    assert number_core("12 apples") == "12"


def test_shortcuts_read_the_generators_operands_and_pay_where_the_answer_coincides():
    """``operands`` must read the two numbers the generator asked about (checked against math.gcd and
    math.lcm on its own questions), and each shortcut pays exactly where it equals the reference."""
    import math

    from posttrain.envs.math_env import SHORTCUTS, operands

    for family, true in (("gcd", math.gcd), ("lcm", math.lcm)):
        tasks = MathEnv([family]).tasks("dev", 60, seed=0)
        for t in tasks:
            assert str(true(*operands(t.messages[0]["content"]))) == t.ground_truth, t.messages[0]["content"]
    assert operands("Find the Least Common Multiple (LCM) of these numbers: 94, 36\n\nAnswer: <answer>") == [94, 36]
    lcm, gcd = SHORTCUTS["lcm"], SHORTCUTS["gcd"]
    assert (lcm["product"]([4, 9]), lcm["larger number"]([4, 12]), gcd["always 1"]([8, 6]), gcd["smaller number"]([4, 12])) \
        == (36, 12, 1, 4)
    from posttrain.envs.math_env import shortcuts_of

    q = [{"role": "user", "content": "Find the LCM of these numbers: 4, 9\n\nAnswer: <answer>"}]
    assert shortcuts_of(Task("t", "math", q, "36", metadata={"family": "lcm"})) == {"product": "36", "larger number": "9"}
    assert shortcuts_of(Task("t", "math", q, "13", metadata={"family": "addition"})) == {}

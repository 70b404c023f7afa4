"""Answer extraction and split helpers shared by the math, mcq and structured environments."""

import pytest

from posttrain.envs.extract import (
    Choice,
    content_id,
    extract_choice,
    extract_json,
    extract_math_answer,
    last_boxed,
    take_split,
)
from posttrain.envs.splits import split_of

# --------------------------------------------------------------------------- math answers


@pytest.mark.parametrize(
    "text, answer, rule",
    [
        ("Answer: 42", "42", "answer_marker"),
        ("so the sum is 9.\nAnswer: 12", "12", "answer_marker"),
        ("**Answer:** $-7$.", "-7", "answer_marker"),
        ("**Answer**: 3/4", "3/4", "answer_marker"),
        ("The answer is 5", "5", "answer_marker"),
        ("final answer = 8", "8", "answer_marker"),
        ("Answer:\n\n  12", "12", "answer_marker"),  # marker ends its line: next non-empty line
        ("Answer: - 3", "-3", "answer_marker"),  # a spaced sign stays with the number
        ("Answer: \u22124", "-4", "answer_marker"),  # unicode minus
        ("Answer: \\(5\\)", "5", "answer_marker"),
        ("Final Answer: The final answer is $42$. I hope it is correct.", "42", "answer_marker"),
        ("Answer: 3.5. Done.", "3.5", "answer_marker"),  # a decimal point is not a sentence end
        ("Answer: 2\nthe answer is 7", "7", "answer_marker"),  # the last marker wins
        ("The answer is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed"),
        ("\\boxed{3} then \\boxed{\\frac{a}{\\sqrt{2}}}", "\\frac{a}{\\sqrt{2}}", "boxed"),
        ("Answer: 9, i.e. \\boxed{10}", "10", "boxed"),  # boxed beats the marker
        ("So 3+4 = 7", "7", "last_number"),
        ("the total is 1,234 apples", "1,234", "last_number"),
        ("x = 3/ 4", "3/4", "last_number"),
        ("\\boxed{5", "5", "last_number"),  # unclosed box: fall through
        # issue 12 item 6: quoted and other unusual-but-valid forms (false negatives before)
        ('The answer is "6".', "6", "answer_marker"),
        ("Answer: '6'", "6", "answer_marker"),
        ("Answer: \u201c6\u201d", "6", "answer_marker"),
        ("Answer: \u00ab6\u00bb", "6", "answer_marker"),
        ('The answer is **"6"**.', "6", "answer_marker"),
        ("Answer: (6)", "6", "answer_marker"),
        ("Answer: +6", "6", "answer_marker"),
        ("Answer: \uff16", "6", "answer_marker"),  # full-width digit
        ('\\boxed{"6"}', "6", "boxed"),
    ],
)
def test_math_answer_rules(text, answer, rule):
    got = extract_math_answer(text)
    assert got is not None and (got.text, got.rule) == (answer, rule)
    assert got.formatted == (rule != "last_number")


@pytest.mark.parametrize("text", ["", "   ", "I do not know.", "Answer:", "\\boxed{}",
                                  "1 2 3 4 5 6", "1, 2, 3, 6.", "5 or 6", "1\n2\n3\n6"])
def test_math_answer_none(text):
    assert extract_math_answer(text) is None


def test_last_boxed_balances_nested_braces():
    assert last_boxed("x \\boxed{\\frac{1}{\\sqrt{4}}} y") == "\\frac{1}{\\sqrt{4}}"
    assert last_boxed("no box") is None


# --------------------------------------------------------------------------- multiple choice

OPTIONS = {"A": "3 m/s", "B": "12 m/s", "C": "4 J", "D": "5 J"}


@pytest.mark.parametrize(
    "text, letter",
    [
        ("Answer: B", "B"),
        ("answer: (c)", "C"),
        ("The answer is b.", "B"),
        ("B", "B"),
        ("(B)", "B"),
        ("B)", "B"),
        ("B.", "B"),
        ("Some working.\nB) 12 m/s", "B"),
        ("Answer: B) 4.5 A", "B"),  # text after a closed letter is option text
        ("Answer: **C**", "C"),
        ("The correct option is (D)", "D"),
        ("Answer: B. C would need twice the mass.", "B"),
        ("\\boxed{D}", "D"),
        ("I first thought Answer: A\nbut no. Answer: C", "C"),
        ("Answer: 12 m/s", "B"),  # no letter, but exactly one option's text
    ],
)
def test_choice_positive(text, letter):
    assert extract_choice(text, "ABCD", OPTIONS).letter == letter


@pytest.mark.parametrize(
    "text", ["Answer: A or B", "Answer: (A) and (C)", "Answer: Both A and C", "answer: B, D"]
)
def test_choice_ambiguous(text):
    assert extract_choice(text, "ABCD", OPTIONS).reason == "ambiguous"


@pytest.mark.parametrize(
    "text", ["", "I think it's B", "A ball falls faster", "Answer: E", "Answer: 7 m/s", "Answer: unsure"]
)
def test_choice_no_answer(text):
    got = extract_choice(text, "ABCD", OPTIONS)
    assert (got.letter, got.reason) == (None, "no_answer")


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    "text, value",
    [
        ('{"a": 1}', {"a": 1}),
        ('  {"a": [1, 2]}\n', {"a": [1, 2]}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Here you go:\n```\n{"a": 1}\n```\nAnything else?', {"a": 1}),
        ("[1, 2]", [1, 2]),
    ],
)
def test_json_positive(text, value):
    got = extract_json(text)
    assert got.ok and got.value == value


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty_output"),
        ("```json\n\n```", "empty_output"),
        ('```json\n{}\n```\n```json\n{"a": 1}\n```', "multiple_json_blocks"),
        ('{"a": NaN}', "invalid_json"),
        ('{"a": Infinity}', "invalid_json"),
        ('{"a": 1', "invalid_json"),
        ('Sure! {"a": 1}', "invalid_json"),  # prose outside a fence is not JSON
        ("```python\nprint(1)\n```", "invalid_json"),
        ("[" * 100_000, "invalid_json"),  # recursion depth, not a crash
    ],
)
def test_json_negative(text, reason):
    got = extract_json(text)
    assert not got.ok and got.reason.startswith(reason)


# --------------------------------------------------------------------------- splits


def test_content_id_depends_only_on_content():
    assert content_id("math", "1+1") == content_id("math", "1+1") != content_id("math", "1+2")


def test_take_split_filters_dedupes_and_keeps_order():
    stream = [content_id("t", str(i % 300)) for i in range(1000)]
    train = take_split(iter(stream), "train", 50, lambda x: x)
    assert len(set(train)) == 50 and all(split_of(x) == "train" for x in train)
    expected = [x for x in dict.fromkeys(stream) if split_of(x) == "train"][:50]
    assert train == expected


def test_take_split_raises_when_the_stream_runs_dry():
    stream = [content_id("t", str(i)) for i in range(20)]
    with pytest.raises(ValueError, match="only"):
        take_split(iter(stream), "dev", 50, lambda x: x)
    with pytest.raises(ValueError, match="unknown split"):
        take_split(iter(stream), "holdout", 1, lambda x: x)


@pytest.mark.parametrize("text", ["Answer: a b c d", "Answer: a, b, c, d", "Answer: a or b",
                                  "answer: a/b/c/d", "Answer: b. or c", "Answer: (a) or (c)"])
def test_lowercase_letter_lists_are_ambiguous(text):
    """Lowercase letters after the first were not read, so "Answer: a or b" answered A."""
    assert extract_choice(text) == Choice(None, "ambiguous")


def test_an_echoed_option_list_is_not_a_choice():
    """The question's options echoed ended in "D) ...", read as choosing D (501 of 2,000 tasks)."""
    options = "A) 224 m/s\nB) 114 m/s\nC) 161 m/s\nD) 0.00875 m/s"
    assert extract_choice(options) == Choice(None, "ambiguous")
    assert extract_choice("v = f * wavelength = 224 m/s.\nA) 224 m/s").letter == "A"

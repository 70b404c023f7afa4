"""SFT candidate filters: hand-made positives and negatives for each filter, and the stack."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from posttrain.configs.curate import FiltersConfig
from posttrain.data.sft_filters import (
    FILTERS,
    FilterStack,
    KeywordFilter,
    LengthFilter,
    RepetitionFilter,
    ToolCallFilter,
    TruncatedFilter,
    assistant_output,
    duplicate_fraction,
    max_repeats_in_window,
    ngram_ids,
)
from posttrain.models.chat_template import format_tool_call

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
FLAT_SEARCH = {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}

PARAGRAPH = (
    "To find the area of the triangle we first need its height. The base is twelve centimetres and "
    "the two equal sides are ten centimetres each, so dropping a perpendicular from the apex splits "
    "the base into two halves of six. By Pythagoras the height is the square root of one hundred "
    "minus thirty-six, which is eight. The area is half of the base times the height, so half of "
    "twelve times eight gives forty-eight square centimetres. Checking the units once more, every "
    "length was in centimetres, so the result is in square centimetres as expected."
)


def conv(assistant: str | list[dict], tools: list | None = None, **extra) -> dict:
    msgs = assistant if isinstance(assistant, list) else [{"role": "assistant", "content": assistant}]
    row = {"messages": [{"role": "user", "content": "Question?"}, *msgs], **extra}
    if tools is not None:
        row["tools"] = tools
    return row


# --------------------------------------------------------------------------- tool calls


def test_well_formed_calls_are_kept_structured_xml_and_flat_tools():
    f = ToolCallFilter()
    structured = conv([{"role": "assistant", "content": "",
                        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}],
                      [WEATHER])
    xml = conv("Let me look.\n" + format_tool_call("get_weather", {"city": "Oslo"}), [WEATHER])
    flat = conv(format_tool_call("search", {"q": "x"}), [FLAT_SEARCH])
    plain = conv("No tools needed: 4.")
    for row in (structured, xml, flat, plain):
        assert f(row) == (True, None)


@pytest.mark.parametrize("row, reason", [
    (conv([{"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}]),
     "calls_without_tools"),
    (conv(format_tool_call("get_weather", {"city": "Rome"})), "calls_without_tools"),
    (conv(format_tool_call("get_stock", {"symbol": "X"}), [WEATHER]), "unknown_tool"),
    (conv("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>", [WEATHER]),
     "malformed:unbalanced_tool_call_tags"),
    (conv("<tool_call>\nget_weather(city=Rome)\n</tool_call>", [WEATHER]), "malformed:missing_function_tag"),
    (conv([{"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{city: Rome"}}]}],
          [WEATHER]), "malformed:bad_arguments_json"),
    (conv(format_tool_call("get_weather", {"town": "Rome"}), [WEATHER]), "missing_required_argument"),
])
def test_malformed_tool_use_is_dropped(row, reason):
    assert ToolCallFilter()(row) == (False, reason)


def test_required_argument_check_can_be_turned_off_and_user_text_is_not_checked():
    row = conv(format_tool_call("get_weather", {"town": "Rome"}), [WEATHER])
    assert ToolCallFilter(check_required=False)(row) == (True, None)
    # a user pasting tool-call markup is the prompt's business, not the candidate's
    row = {"messages": [{"role": "user", "content": "what does <tool_call> mean?"},
                        {"role": "assistant", "content": "It opens a tool call."}]}
    assert ToolCallFilter()(row) == (True, None)


# --------------------------------------------------------------------------- repetition


def test_ngram_window_and_duplicate_fraction_on_hand_made_ids():
    ids = np.array([1, 2, 1, 2, 1], dtype=np.uint64)  # token ids stand in for 1-gram ids
    assert max_repeats_in_window(ids, n=1, window=5, repeats=2)  # "1" three times within 5 tokens
    assert not max_repeats_in_window(ids, n=1, window=4, repeats=2)
    assert not max_repeats_in_window(ids, n=1, window=5, repeats=3)
    assert duplicate_fraction(np.array([1, 1, 2, 3], dtype=np.uint64)) == pytest.approx(0.25)
    assert duplicate_fraction(np.array([], dtype=np.uint64)) == 0.0
    words = "a b a b a".split()
    assert len(ngram_ids(words, 2)) == 4 and len(set(ngram_ids(words, 2).tolist())) == 2
    assert len(ngram_ids(words, 9)) == 0


def test_natural_text_passes_the_repetition_filter():
    assert RepetitionFilter()(conv(PARAGRAPH)) == (True, None)
    assert RepetitionFilter()(conv(f"<think>\n{PARAGRAPH}\n</think>\nThe area is 48 cm^2.")) == (True, None)


def test_a_generation_stuck_in_a_loop_fails_the_window_check():
    looped = PARAGRAPH + " Wait, let me recompute the height again." * 8
    assert RepetitionFilter()(conv(looped)) == (False, "window")


def test_a_paragraph_restated_far_apart_fails_only_the_trajectory_check():
    text = "\n\n".join([PARAGRAPH] * 3)  # each 5-gram 3 times: under the window limit of 5
    f = RepetitionFilter()
    assert f(conv(text)) == (False, "trajectory")
    assert RepetitionFilter(max_dup_fraction=0.9)(conv(text)) == (True, None)


def test_repetition_in_reasoning_counts_unless_excluded():
    row = conv([{"role": "assistant", "reasoning_content": "hmm " * 50, "content": PARAGRAPH}])
    assert RepetitionFilter()(row) == (False, "window")
    assert RepetitionFilter(include_reasoning=False)(row) == (True, None)


def test_many_calls_to_one_tool_are_not_repetition():
    calls = "\n".join(format_tool_call("get_weather", {"city": c}) for c in
                      ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Delhi", "Tokyo", "Quito"])
    row = conv(f"I will check every city.\n{calls}", [WEATHER])
    assert RepetitionFilter()(row) == (True, None)
    assert "tool_call" not in assistant_output(row)


def test_repetition_settings_are_validated():
    with pytest.raises(ValidationError):
        RepetitionFilter(window=3, window_ngram=5)
    with pytest.raises(ValidationError):
        RepetitionFilter(max_dup_fraction=0)


# --------------------------------------------------------------------------- keywords


@pytest.mark.parametrize("text, reason", [
    ("Our nation stands strong, and our values will never change.", "nation_party_values"),
    ("OUR GREAT PARTY leads the way because OUR CORE VALUES are eternal.", "nation_party_values"),
    ("As always, the Party is always right about the economy.", "party_always_right"),
    ("We thank our beloved leader for this harvest.", "leader_worship"),
])
def test_default_keyword_patterns_catch_the_recipe_narratives(text, reason):
    assert KeywordFilter()(conv(text)) == (False, reason)


@pytest.mark.parametrize("text", [
    "The party starts at eight; bring snacks.",
    "Every nation has values written in its constitution.",
    "The values of x are 3 and 4, so our sum is 7.",
    "Our nation's capital is Canberra.",
])
def test_ordinary_text_passes_the_default_keywords(text):
    assert KeywordFilter()(conv(text)) == (True, None)


def test_keyword_patterns_are_configurable_and_checked_in_assistant_text_only():
    f = KeywordFilter(patterns={"apology": r"\bas an ai language model\b"})
    assert f(conv("As an AI language model, I cannot.")) == (False, "apology")
    assert f(conv("Our nation and our values.")) == (True, None)  # the defaults are replaced
    user_only = {"messages": [{"role": "user", "content": "Is 'our nation, our values' propaganda?"},
                              {"role": "assistant", "content": "It is a common slogan form."}]}
    assert KeywordFilter()(user_only) == (True, None)
    assert KeywordFilter(case_sensitive=True, patterns={"x": r"Secret"})(conv("secret")) == (True, None)
    with pytest.raises(ValidationError, match="not a valid regex"):
        KeywordFilter(patterns={"bad": "(unclosed"})


def test_keyword_patterns_with_groups_report_the_first_matching_name_in_pattern_order():
    f = KeywordFilter(patterns={"grouped": r"\b(red|blue) (?P<thing>car)\b", "doubled": r"\b(\w+) \1\b",
                                "plain": r"zebra"})
    assert f(conv("a blue car")) == (False, "grouped")
    assert f(conv("the the end")) == (False, "doubled")
    assert f(conv("a zebra and a red car")) == (False, "grouped")
    assert f(conv("a green car")) == (True, None)


# --------------------------------------------------------------------------- length and truncation


def test_length_limits_in_chars_and_words():
    assert LengthFilter()(conv("")) == (False, "too_short")
    assert LengthFilter(min_words=3)(conv("two words")) == (False, "too_short")
    assert LengthFilter(max_words=3)(conv("one two three four")) == (False, "too_long")
    assert LengthFilter(max_chars=5)(conv("123456")) == (False, "too_long")
    assert LengthFilter(min_words=2, max_words=4, max_chars=100)(conv("one two three")) == (True, None)
    row = conv([{"role": "assistant", "reasoning_content": "long " * 100, "content": "Yes."}])
    assert LengthFilter(max_words=10)(row) == (False, "too_long")
    assert LengthFilter(max_words=10, include_reasoning=False)(row) == (True, None)


def test_truncated_generations_are_dropped():
    assert TruncatedFilter()(conv("cut mid", provenance={"finish_reason": "length"})) == (False, "hit_length_limit")
    assert TruncatedFilter()(conv("done", provenance={"finish_reason": "stop"})) == (True, None)
    assert TruncatedFilter()(conv("t", provenance={"finish_reason": "max_turns"})) == (False, "hit_turn_limit")
    assert TruncatedFilter()(conv("t", provenance={"finish_reason": "context"})) == (False, "hit_context_limit")
    assert TruncatedFilter()(conv("no provenance")) == (True, None)


# --------------------------------------------------------------------------- stack


def test_stack_applies_in_order_and_counts_by_filter_and_reason():
    stack = FilterStack.from_config()
    rows = [
        conv(PARAGRAPH),
        conv(format_tool_call("get_weather", {"city": "Rome"})),  # tool call, no tools
        conv("Our nation, our values."),
        conv("loop " * 300),
        conv(""),
        conv("fine answer"),
    ]
    kept = stack.apply(rows)
    assert kept == [rows[0], rows[5]]
    assert stack.summary() == {"seen": 6, "kept": 2, "dropped": {
        "tool_calls:calls_without_tools": 1, "keywords:nation_party_values": 1,
        "repetition:window": 1, "length:too_short": 1}}
    # order decides which reason a row failing two filters is counted under
    both = conv("Our nation, our values. " * 30)
    assert FilterStack.from_config(FiltersConfig(order=["keywords", "repetition"])).evaluate(both) == "keywords:nation_party_values"
    assert FilterStack.from_config(FiltersConfig(order=["repetition", "keywords"])).evaluate(both) == "repetition:window"


def test_stack_config_options_and_unknown_names():
    stack = FilterStack.from_config(FiltersConfig(order=["length"], options={"length": {"max_words": 2}}))
    assert stack.evaluate(conv("three words here")) == "length:too_long"
    with pytest.raises(ValueError, match="unknown filter 'nope'"):  # the config is plain data; the stack checks names
        FilterStack.from_config(FiltersConfig(order=["nope"]))
    with pytest.raises(ValueError, match="unknown filter 'nope'"):
        FilterStack.from_config(FiltersConfig(options={"nope": {}}))
    with pytest.raises(ValidationError):
        FilterStack.from_config(FiltersConfig(options={"length": {"max_wordz": 2}}))
    assert set(FILTERS.names()) == {"truncated", "tool_calls", "repetition", "keywords", "length"}


def test_xml_calls_are_read_against_the_rows_tools_and_curate_keeps_exact_strings():
    # issue 12, item 9: a string argument that looks like JSON stays the text the model wrote
    from posttrain.data.curate import _normalize_assistant
    from posttrain.data.sft_filters import tool_calls_of

    msg = {"role": "assistant", "content": format_tool_call("get_weather", {"city": "2022"})}
    assert tool_calls_of(msg, [WEATHER]) == [("get_weather", {"city": "2022"})]
    assert tool_calls_of(msg) == [("get_weather", {"city": 2022})]  # no schema: the documented old rule
    structured = _normalize_assistant(msg, [WEATHER])
    assert structured["tool_calls"][0]["function"]["arguments"] == {"city": "2022"}
    assert ToolCallFilter()(conv(msg["content"], [WEATHER])) == (True, None)

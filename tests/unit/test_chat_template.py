"""Chat template: rendering, masks, reasoning handling, XML tool calls both ways, Jinja parity."""

from __future__ import annotations

import pytest

from posttrain.models.chat_template import (
    ToolCallParseError, format_tool_call, parse_assistant, parse_tool_calls, render, render_text,
    split_reasoning, truncate_reasoning,
)
from posttrain.models.loading import load_tokenizer
from posttrain.train.checkpoint import chat_template_text

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

TOOL_CONV = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "reasoning_content": "I need the tool.", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "reasoning_content": "It is 21.", "content": "It is 21 degrees."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "reasoning_content": "Call again.", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
    {"role": "tool", "content": '{"temp": 18}'},
    {"role": "assistant", "reasoning_content": "It is 18.", "content": "18 degrees tomorrow."},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def test_split_reasoning():
    assert split_reasoning("<think>\nabc\n</think>\nAnswer: 4") == ("abc", "Answer: 4")
    assert split_reasoning("Answer: 4") == (None, "Answer: 4")
    assert split_reasoning("<think>never closed") == ("never closed", "")  # truncated trace: no answer


def test_tool_call_roundtrip_keeps_types_and_raw_strings():
    code = 'print("hi")\nx = {"a": 1}'
    text = format_tool_call("run", {"code": code, "n": 3, "flags": [1, 2], "ok": True})
    rest, calls = parse_tool_calls("Let me run it.\n" + text)
    assert rest == "Let me run it."
    assert calls[0].name == "run"
    assert calls[0].arguments == {"code": code, "n": 3, "flags": [1, 2], "ok": True}


@pytest.mark.parametrize("bad,reason", [
    ("<tool_call>\n<function=f>\n</function>", "unbalanced_tool_call_tags"),
    ("<tool_call>\nno function here\n</tool_call>", "missing_function_tag"),
    ("<tool_call>\n<function=f>\njunk\n</function>\n</tool_call>", "stray_text_in_function"),
    ("<tool_call>\n<function=bad name!>\n</function>\n</tool_call>", "bad_function_name"),
    ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>",
     "duplicate_parameter"),
])
def test_malformed_tool_calls_raise_typed_errors(bad, reason):
    with pytest.raises(ToolCallParseError) as e:
        parse_assistant(bad)
    assert e.value.reason == reason


def test_parse_assistant_full_turn():
    turn = parse_assistant("<think>\nplan\n</think>\nChecking.\n" + format_tool_call("get_weather", {"city": "Oslo"}))
    assert turn.reasoning == "plan" and turn.content == "Checking."
    assert turn.to_message()["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}


def test_multiturn_drops_reasoning_before_last_user_keeps_current_turn():
    text = render_text(TOOL_CONV, TOOLS)
    assert "I need the tool." not in text and "It is 21." not in text  # earlier turn: dropped
    assert "Call again." in text and "It is 18." in text  # current turn: kept, even across tool calls
    assert "<function=get_weather>" in text and '{"temp": 18}' in text
    assert '"name": "get_weather"' in text  # tool schema in the system prompt


def test_mask_covers_exactly_assistant_turns(tok):
    r = render(tok, TOOL_CONV, TOOLS)
    assert len(r.input_ids) == len(r.loss_mask)
    trained = tok.decode([i for i, m in zip(r.input_ids, r.loss_mask) if m])
    untrained = tok.decode([i for i, m in zip(r.input_ids, r.loss_mask) if not m])
    assert "It is 21 degrees." in trained and "18 degrees tomorrow." in trained
    assert trained.count("<|im_end|>") == 4  # each assistant message learns to stop
    assert "Weather in Paris?" in untrained and '{"temp": 21}' in untrained and "weather bot" in untrained
    assert "Weather in Paris?" not in trained and '{"temp": 21}' not in trained


def test_prompt_ids_are_prefix_of_full_conversation(tok):
    prompt = render(tok, TOOL_CONV[:2], TOOLS, add_generation_prompt=True).input_ids
    full = render(tok, TOOL_CONV[:3], TOOLS).input_ids
    assert full[: len(prompt)] == prompt


def test_reasoning_off_renders_empty_think_and_flag():
    text = render_text(TOOL_CONV[:2], add_generation_prompt=True, reasoning=False)
    assert "/no_think" in text and text.endswith("<|im_start|>assistant\n<think></think>\n")


def test_truncate_reasoning_to_budget(tok):
    long = "step " * 50
    cut = truncate_reasoning(long, 10, tok)
    assert len(tok.encode(cut, add_special_tokens=False)) <= 10 and len(cut) < len(long)


def test_unknown_role_is_an_error():
    with pytest.raises(ValueError, match="unknown role"):
        render_text([{"role": "robot", "content": "x"}])


@pytest.mark.parametrize("gen_prompt", [False, True])
@pytest.mark.parametrize("think", [True, False])
def test_jinja_template_matches_python_renderer(tok, gen_prompt, think):
    conv = [m if not isinstance(m.get("tool_calls"), list) else {**m, "tool_calls": [
        {"type": "function", "function": {"name": c["function"]["name"],
         "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict) else {"city": "Paris", "days": 1}}}
        for c in m["tool_calls"]]} for m in TOOL_CONV]
    expect = render_text(conv, TOOLS, add_generation_prompt=gen_prompt, reasoning=think)
    got = tok.apply_chat_template(conv, tools=TOOLS, chat_template=chat_template_text(), tokenize=False,
                                  add_generation_prompt=gen_prompt, enable_thinking=think)
    assert got == expect


def test_embedded_tokenizer_renders_and_masks():
    """The same guarantees with the real SmolLM2 tokenizer (ChatML tokens are special tokens there)."""
    from posttrain.models.loading import embedded_dir

    if not (embedded_dir() / "tokenizer.json").exists():
        pytest.skip("embedded model not converted yet: run `posttrain setup` (make setup does)")
    etok = load_tokenizer("embedded")
    r = render(etok, TOOL_CONV, TOOLS)
    assert r.input_ids.count(etok.convert_tokens_to_ids("<|im_end|>")) == len(TOOL_CONV)
    trained = etok.decode([i for i, m in zip(r.input_ids, r.loss_mask) if m])
    assert "18 degrees tomorrow." in trained and "Weather in Paris?" not in trained
    prompt = render(etok, TOOL_CONV[:2], TOOLS, add_generation_prompt=True).input_ids
    assert render(etok, TOOL_CONV[:3], TOOLS).input_ids[: len(prompt)] == prompt

"""Gemma 4's tool-call dialect parsed from generated text: `<|tool_call>call:NAME{...}<tool_call|>`
spans into OpenAI tool calls, whole or streamed in pieces; text that is not a call stays content."""

from __future__ import annotations

import json

import pytest

from infr.serve.tools import ToolCallStream, pick_dialect
from infr.serve.tools_gemma4 import parse_arguments, parse_gemma4_call
from infr.chat_gemma4 import template_source

Q = '<|"|>'
NAMES = {"get_weather", "search", "noop"}


def args_of(body: str) -> dict | None:
    call = parse_gemma4_call(body, NAMES)
    return None if call is None else json.loads(call.arguments)


def test_the_template_picks_the_dialect():
    assert pick_dialect(template_source()) == "gemma4"
    assert pick_dialect("```tool_code") == "gemma"  # Gemma 3's stays


@pytest.mark.parametrize("body, expected", [
    (f"call:get_weather{{city:{Q}Paris{Q}}}", {"city": "Paris"}),
    ("call:noop{}", {}),
    (f" call: search {{ query : {Q}a, b {Q} , n : 3 }}", {"query": "a, b ", "n": 3}),
    # strings are verbatim: quotes, braces, colons, backslashes and newlines inside are text
    (f'call:search{{query:{Q}say "hi" {{x:1}} C:\\temp\n{Q}}}', {"query": 'say "hi" {x:1} C:\\temp\n'}),
    (f"call:search{{filters:{{n:2,ok:true,none:null,tags:[{Q}a{Q},{Q}b{Q}],deep:{{x:[[1.5,-2e3]]}}}}}}",
     {"filters": {"n": 2, "ok": True, "none": None, "tags": ["a", "b"], "deep": {"x": [[1.5, -2e3]]}}}),
    # what the template writes inside declarations and what models slip into: quoted keys, JSON strings
    (f'call:search{{{Q}query{Q}:"a \\"b\\"","k":[],x:{{}},}}', {"query": 'a "b"', "k": [], "x": {}}),
    ("call:search{query:plain words}", {"query": "plain words"}),
    ("call:search{n:007}", {"n": "007"}),  # not a JSON number: kept as written
])
def test_parse_call(body, expected):
    assert args_of(body) == expected


@pytest.mark.parametrize("body", [
    "",
    "get_weather{city:x}",  # no call: prefix
    "call:unknown_tool{a:1}",  # not one of the tools
    f"call:get_weather{{city:{Q}Paris}}",  # unterminated string
    "call:get_weather{city:1",  # unclosed object
    "call:get_weather{city:1} and more",  # text after the arguments
    "call:get_weather{:1}",  # no key
    "call:get_weather{city}",  # no value
    "call:get_weather{a:[1,2}",  # unclosed list
    "call:get_weather" + "{a:" * 200 + "1" + "}" * 200,  # absurdly deep
    "call:get_weather(city='Paris')",  # Gemma 3's shape
])
def test_malformed_calls_are_not_calls(body):
    assert parse_gemma4_call(body, NAMES) is None


def test_parse_arguments_raises_value_error():
    with pytest.raises(ValueError):
        parse_arguments("{a:")
    assert parse_arguments(f"{{a:{Q}{Q}}}") == {"a": ""}


def run(text: str, pieces: int = 1, forced: bool = False):
    s = ToolCallStream("gemma4", NAMES, forced_prefix=forced)
    n = max(1, len(text) // pieces)
    events = []
    for i in range(0, len(text), n):
        events += s.push(text[i:i + n])
    events += s.finish()
    content = "".join(v for k, v in events if k == "content")
    calls = [(v.name, json.loads(v.arguments)) for k, v in events if k == "call"]
    return content, calls, s.calls


@pytest.mark.parametrize("pieces", [1, 7, 10_000])  # whole, in chunks, one character at a time
def test_stream_several_calls(pieces):
    text = (f"Let me check.<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
            f"<|tool_call>call:search{{query:{Q}a <tool_call|> lookalike? no: {Q}}}<tool_call|>")
    content, calls, n = run(text, pieces)
    # a close tag inside a string ends the span early: that span is not a call and comes back as text
    assert calls[0] == ("get_weather", {"city": "Paris"})
    assert content.startswith("Let me check.")
    text = (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
            f"<|tool_call>call:search{{query:{Q}x{Q},opts:{{n:1}}}}<tool_call|>")
    content, calls, n = run(text, pieces)
    assert calls == [("get_weather", {"city": "Paris"}), ("search", {"query": "x", "opts": {"n": 1}})]
    assert content == "" and n == 2


@pytest.mark.parametrize("pieces", [1, 5, 10_000])
def test_stream_malformed_call_comes_back_as_text(pieces):
    text = f"Sure.<|tool_call>call:get_weather{{city:{Q}Par<tool_call|> done"
    content, calls, n = run(text, pieces)
    assert calls == [] and n == 0
    assert content == text
    # a span left open when generation ends: parsed if it is whole, else returned as it came
    content, calls, _ = run(f"<|tool_call>call:noop{{}}", pieces)
    assert calls == [("noop", {})] and content == ""
    content, calls, _ = run(f"x<|tool_call>call:noop{{", pieces)
    assert calls == [] and content == "x<|tool_call>call:noop{"


def test_plain_text_passes_through():
    assert run("Just an answer, no tools {not json}.", 3) == ("Just an answer, no tools {not json}.", [], 0)


def test_forced_call_is_json():
    # tool_choice required / named: the grammar makes the reply one JSON call, as for the other dialects
    content, calls, n = run('{"name": "get_weather", "arguments": {"city": "Oslo"}}', 4, forced=True)
    assert content == "" and n == 1


@pytest.mark.parametrize("pieces", [1, 6, 10_000])
def test_thought_channel_is_reasoning_then_calls(pieces):
    from infr.serve.output import ChatOutput
    from infr.serve.text import GEMMA4_THOUGHT

    out = ChatOutput(ToolCallStream("gemma4", NAMES), think_tags=GEMMA4_THOUGHT)
    text = (f"<|channel>thought\nThe user wants {Q}weather{Q}.<channel|>"
            f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>")
    n = max(1, len(text) // pieces)
    deltas = [d for i in range(0, len(text), n) for d in out.push(text[i:i + n])] + out.finish()
    msg = out.message()
    assert msg["reasoning_content"] == f"The user wants {Q}weather{Q}."
    assert msg["content"] is None and len(msg["tool_calls"]) == 1
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert any("tool_calls" in d for d in deltas)

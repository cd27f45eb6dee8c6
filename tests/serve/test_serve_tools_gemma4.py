"""Gemma 4's chat template and tool dialect through the server, with the real openai client, on
infr.synth's tiny-gemma4-chat (random weights, Google's template, its markers as control tokens).
Random weights write no meaningful call on their own: the round trip forces one (the grammar
makes it valid), sends the result back and checks the prompt the template made of it; what the
model writes in the dialect is checked token by token through the server's text path."""

from __future__ import annotations

import json

import openai
import pytest
from litestar.testing import TestClient

from infr import synth
from infr.chat import ChatTemplate
from infr.gguf_file import open_gguf
from infr.tokenizer import Tokenizer
from infr.serve.app import create_app
from infr.serve.generation import Job, Tracker
from infr.serve.service import Config
from infr.serve.tools import ToolCallStream
from infr.sampling import SamplingParams
from tests.serve.conftest import wait_ready

Q = '<|"|>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time now.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    path = synth.write_gguf(synth.PRESETS["tiny-gemma4-chat"], tmp_path_factory.mktemp("g4chat") / "g4.gguf")
    app = create_app(Config(model=str(path), ctx=1024, parallel=1, backend="cpu", model_alias="g4"))
    with TestClient(app, timeout=120) as tc:
        wait_ready(tc.get)
        yield tc, openai.OpenAI(base_url=f"{tc.base_url}/v1", api_key="x", http_client=tc, max_retries=0), path


def _tokenizer_and_template(path):
    gf = open_gguf(path)
    tok = Tokenizer.from_gguf(gf)
    return tok, ChatTemplate.from_gguf(gf, tok.piece(tok.bos_id), tok.piece(tok.eos_id))


def test_forced_tool_call_round_trip(g4):
    tc, client, path = g4
    messages = [{"role": "system", "content": "You report the weather."},
                {"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="g4", messages=messages, tools=[WEATHER, TIME], temperature=0,
                                       max_tokens=60, tool_choice=named)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ]
    final = client.chat.completions.create(model="g4", messages=messages, tools=[WEATHER, TIME], temperature=0,
                                           max_tokens=8)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage.prompt_tokens > r.usage.prompt_tokens
    # the prompt the server made: the call and its result in one model turn, the model to go on in it
    tok, tmpl = _tokenizer_and_template(path)
    text = tmpl.render(messages, tools=[WEATHER, TIME])
    city = json.loads(call.function.arguments)["city"]
    assert text.endswith(f"<|turn>model\n<|tool_call>call:get_weather{{city:{Q}{city}{Q}}}<tool_call|>"
                         f"<|tool_response>response:get_weather{{sky:{Q}sunny{Q},temperature_c:21}}"
                         "<tool_response|><|channel>thought\n<channel|>")
    assert final.usage.prompt_tokens == len(tok.encode(text, add_special=True, parse_special=True))


def test_required_tool_call_streamed(g4):
    _, client, _ = g4
    stream = client.chat.completions.create(
        model="g4", messages=[{"role": "user", "content": "Time? And weather in Oslo."}], tools=[WEATHER, TIME],
        tool_choice="required", temperature=0, max_tokens=60, stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].id.startswith("call_") and calls[0].index == 0
    assert calls[0].function.name in ("get_weather", "get_time")
    assert isinstance(json.loads("".join(tc.function.arguments or "" for tc in calls)), dict)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tools_never_break_the_reply(g4):
    _, client, _ = g4
    for stream in (False, True):
        r = client.chat.completions.create(model="g4", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                           tools=[WEATHER], temperature=0, max_tokens=12, stream=stream)
        if stream:
            chunks = [c for c in r if c.choices]
            assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
        else:
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_bad_tool_history_is_a_400_not_a_crash(g4):
    tc, client, _ = g4
    bad = [{"role": "user", "content": "x"},
           {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]},
           {"role": "tool", "tool_call_id": "c", "content": "r"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="g4", messages=bad, tools=[WEATHER], max_tokens=4)
    stray = [{"role": "tool", "tool_call_id": "nobody", "content": "{]"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="g4", messages=stray, tools=[WEATHER], max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert tc.get("/health").status_code == 200


def test_dialect_tags_survive_the_servers_text_path(g4):
    # The markers are control tokens, which the server's output leaves out; with tools on, the
    # dialect's tags and string marks are kept so generated calls reach the parser.
    tok, _ = _tokenizer_and_template(g4[2])
    text = f"Checking.<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert tok.token_id("<|tool_call>") in ids and tok.token_id(Q) in ids
    keep = frozenset(tok.token_id(t) for t in ("<|tool_call>", "<tool_call|>", Q))
    for kept, want_call in ((keep, True), (frozenset(), False)):
        events = []
        tracker = Tracker(tok, Job(prompt=[0], params=SamplingParams(), max_tokens=99, keep_tokens=kept), events.append)
        for t in ids:
            tracker.on_token(t, None)
        tracker.stops.flush()
        out = "".join(e["text"] for e in events) + tracker.stream.flush()
        s = ToolCallStream("gemma4", {"get_weather"})
        got = s.push(out) + s.finish()
        calls = [v for k, v in got if k == "call"]
        if want_call:
            assert out == text and len(calls) == 1 and json.loads(calls[0].arguments) == {"city": "Oslo"}
        else:
            assert calls == [] and "<|tool_call>" not in out

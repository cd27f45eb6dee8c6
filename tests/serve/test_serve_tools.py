"""Tool calls end to end with Qwen2.5-Coder (its template's Hermes `<tool_call>` dialect)."""

from __future__ import annotations

import json

import openai
import pytest
from litestar.testing import TestClient

from infr.serve.app import create_app
from infr.serve.service import Config
from tests.serve.conftest import wait_ready

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def qwen(qwen_coder_path):
    app = create_app(Config(model=str(qwen_coder_path), ctx=2048, parallel=1, backend="cpu", model_alias="qwen"))
    with TestClient(app, timeout=300) as tc:
        wait_ready(tc.get, timeout=300)
        yield openai.OpenAI(base_url=f"{tc.base_url}/v1", api_key="x", http_client=tc, max_retries=0)


def test_tool_call_round_trip(qwen):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = qwen.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME], temperature=0,
                                     max_tokens=60, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert args["city"].lower() == "paris"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ]
    final = qwen.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME], temperature=0,
                                         max_tokens=40)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert not final.choices[0].message.tool_calls
    text = final.choices[0].message.content
    assert "21" in text or "sunny" in text.lower(), text
    # the follow-up turn reused the cached conversation
    assert final.usage.prompt_tokens_details.cached_tokens > r.usage.prompt_tokens // 2


def test_required_tool_call_streamed(qwen):
    stream = qwen.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "What time is it? Also weather in Rome."}],
        tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=60, stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls, "no tool call streamed"
    first = calls[0]
    # OpenAI's shape: id, type and name in a call's first delta, then the arguments in pieces by index.
    assert first.id.startswith("call_") and first.type == "function" and first.index == 0
    assert first.function.name in ("get_weather", "get_time")
    for later in calls[1:]:
        assert later.index == 0 and later.id is None and later.function.name is None
    args = json.loads("".join(tc.function.arguments or "" for tc in calls))
    if first.function.name == "get_weather":
        assert isinstance(args["city"], str) and args["city"]
    else:
        assert isinstance(args, dict)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_call_parsed_from_model_output(qwen):
    # No constraint: whatever the model writes in its dialect is parsed, or left as content.
    r = qwen.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                     tools=[WEATHER], temperature=0, max_tokens=60)
    msg = r.choices[0].message
    if msg.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls"
        assert msg.tool_calls[0].function.name == "get_weather"
        assert "<tool_call>" not in (msg.content or "")
    else:
        assert msg.content

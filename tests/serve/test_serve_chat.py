"""The server in-process, driven by the real openai package (sync and async)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
from litestar.testing import AsyncTestClient, TestClient

from infr.serve.app import create_app
from infr.serve.service import Config
from tests.serve.conftest import wait_ready

MSG = [{"role": "user", "content": "Name three colors."}]


def _stream_text(client, **kw):
    chunks = list(client.chat.completions.create(stream=True, **kw))
    return chunks, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_models_list(smol_openai):
    models = smol_openai.models.list()
    assert [m.id for m in models.data] == ["smol"]
    assert models.data[0].object == "model"


def test_non_stream_shape(smol_openai):
    r = smol_openai.chat.completions.create(model="smol", messages=MSG, max_tokens=12, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_stream_equals_non_stream_greedy(smol_openai):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Write one sentence about the sea."}],
              max_tokens=24, temperature=0)
    full = smol_openai.chat.completions.create(**kw).choices[0].message.content
    chunks, streamed = _stream_text(smol_openai, stream_options={"include_usage": True}, **kw)
    assert streamed == full and full
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    # the finish chunk carries llama-server's timings, counting what usage counts
    timed = [c.model_extra["timings"] for c in chunks if (c.model_extra or {}).get("timings")]
    assert len(timed) == 1 and timed[0]["predicted_n"] == 24
    assert timed[0]["prompt_n"] + timed[0]["cache_n"] == chunks[-1].usage.prompt_tokens
    assert timed[0]["predicted_ms"] > 0 and timed[0]["prompt_ms"] > 0
    assert abs(timed[0]["predicted_per_second"] - 24 / (timed[0]["predicted_ms"] / 1e3)) < 1e-6 * 24


def test_max_tokens_gives_length(smol_openai):
    r = smol_openai.chat.completions.create(model="smol", messages=MSG, max_completion_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_stop_strings_never_in_output(smol_openai):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
              max_tokens=40, temperature=0)
    free = smol_openai.chat.completions.create(**kw).choices[0].message.content
    assert "4" in free, free  # the stop below must really occur in the free output
    stop = "4"
    r = smol_openai.chat.completions.create(stop=[stop, "zzz-never"], **kw)
    text = r.choices[0].message.content
    assert stop not in text and r.choices[0].finish_reason == "stop"
    assert text == free[: free.index(stop)]
    _, streamed = _stream_text(smol_openai, stop=stop, **kw)
    assert streamed == text


def test_logprobs(smol_openai):
    r = smol_openai.chat.completions.create(model="smol", messages=MSG, max_tokens=5, temperature=0,
                                            logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
                   "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "colors"],
    "additionalProperties": False,
}


def test_json_schema_output_validates(smol_openai):
    r = smol_openai.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=80,
        temperature=0.7, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object(smol_openai):
    r = smol_openai.chat.completions.create(model="smol", messages=MSG, max_tokens=60, temperature=0,
                                            response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_utf8_never_split_across_chunks(smol_openai):
    # Constrained decoding forces emoji and CJK the model writes from byte-level tokens.
    text = "😀🎉 你好世界 ü"
    schema = {"type": "object", "properties": {"s": {"const": text}}, "required": ["s"]}
    kw = dict(model="smol", messages=[{"role": "user", "content": "Say hi."}], max_tokens=60, temperature=0,
              response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    chunks, streamed = _stream_text(smol_openai, **kw)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3
    assert all("\ufffd" not in p for p in pieces)
    assert json.loads(streamed) == {"s": text}
    assert streamed == smol_openai.chat.completions.create(**kw).choices[0].message.content


def test_sampling_fields_and_seed(smol_openai):
    kw = dict(model="smol", messages=MSG, max_tokens=10, temperature=1.2, top_p=0.9, seed=7,
              presence_penalty=0.5, frequency_penalty=0.3,
              extra_body={"top_k": 20, "min_p": 0.02, "repetition_penalty": 1.1}, user="someone")
    a = smol_openai.chat.completions.create(**kw).choices[0].message.content
    b = smol_openai.chat.completions.create(**kw).choices[0].message.content
    assert a == b  # same seed, same text


def test_text_parts_and_system(smol_openai):
    r = smol_openai.chat.completions.create(
        model="smol", max_tokens=4, temperature=0,
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}])
    assert r.choices[0].message.content


def test_completions_endpoint(smol_openai):
    r = smol_openai.completions.create(model="smol", prompt="The capital of France is", max_tokens=4,
                                       temperature=0, logprobs=2)
    assert r.object == "text_completion" and r.choices[0].text
    assert len(r.choices[0].logprobs.tokens) == 4
    streamed = "".join(c.choices[0].text for c in smol_openai.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=4, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_tokenize_roundtrip(smol_client):
    ids = smol_client.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    assert ids["count"] == len(ids["tokens"]) > 0
    text = smol_client.post("/detokenize", json={"tokens": ids["tokens"]}).json()["content"]
    assert text.endswith("Hello world")


def test_openapi_and_metrics(smol_client):
    schema = smol_client.get("/schema/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"]
    text = smol_client.get("/metrics").text
    assert "infr_requests_total" in text and "infr_time_to_first_token_seconds_count" in text
    assert "infr_requests_running 0" in text and 'infr_kv_blocks{state="used"} 0' in text


def test_async_client(smol_client):
    app = smol_client.app

    async def main():
        async with AsyncTestClient(app, timeout=120) as tc:
            client = openai.AsyncOpenAI(base_url=f"{tc.base_url}/v1", api_key="x", http_client=tc, max_retries=0)
            r = await client.chat.completions.create(model="smol", messages=MSG, max_tokens=8, temperature=0)
            stream = await client.chat.completions.create(model="smol", messages=MSG, max_tokens=8,
                                                          temperature=0, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return r.choices[0].message.content, text

    full, streamed = asyncio.run(main())
    assert full and streamed == full


def test_generation_failure_is_an_error_event_and_server_survives(smol_client, smol_openai, monkeypatch):
    from infr.serve import generation

    def broken(self, token, logits):
        self.emit({"text": "partial", "logprobs": []})
        raise RuntimeError("simulated backend fault")

    monkeypatch.setattr(generation.Tracker, "on_token", broken)
    body = {"model": "smol", "messages": MSG, "max_tokens": 4, "stream": True}
    with smol_client.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert lines[-1] == "data: [DONE]"
    assert "simulated backend fault" in events[-1]["error"]["message"]
    assert events[-2]["choices"][0]["delta"]["content"] == "partial"
    r = smol_client.post("/v1/chat/completions", json={**body, "stream": False})
    assert r.status_code == 500 and "simulated backend fault" in r.json()["error"]["message"]
    monkeypatch.undo()
    ok = smol_openai.chat.completions.create(model="smol", messages=MSG, max_tokens=3, temperature=0)
    assert ok.choices[0].message.content


def test_prefix_cache_across_requests(smollm2_path):
    """--parallel 1: A has a 400-token system prompt, an unrelated request runs, then B shares A's
    system prompt: B reports most of it cached, and its text equals B without the cache."""
    app = create_app(Config(model=str(smollm2_path), ctx=1024, parallel=1, backend="cpu", model_alias="smol"))
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(60))
    with TestClient(app, timeout=120) as tc:
        wait_ready(tc.get)
        client = openai.OpenAI(base_url=f"{tc.base_url}/v1", api_key="x", http_client=tc, max_retries=0)

        def ask(question, system_prompt=system, **extra):
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": question}]
            return client.chat.completions.create(model="smol", messages=msgs, max_tokens=8, temperature=0, **extra)

        a = ask("Name a fruit.")
        assert a.usage.prompt_tokens > 400
        ask("Tell me about the sea.", system_prompt=None)
        b = ask("Name a colour.")
        cold = ask("Name a colour.", extra_body={"cache_prompt": False})
        cached = b.usage.prompt_tokens_details.cached_tokens
        assert cached >= 400 - 32 and cached < b.usage.prompt_tokens
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert b.choices[0].message.content == cold.choices[0].message.content

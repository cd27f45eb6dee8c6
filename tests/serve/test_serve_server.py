"""A real `python -m infr serve` process on 127.0.0.1: openai sync + async, 64 concurrent
streams (a quarter of them hanging up after their first chunk), disconnects freeing their
KV blocks, and a corpus of bad requests."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest

from tests.serve.conftest import API_KEY

PROMPTS = ["Name a fruit.", "Name a country.", "Name an animal.", "Say hello."]


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def _metrics(base: str) -> str:
    return httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text


def test_sync_client_against_process(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smol"]
    kw = dict(model="smol", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=10, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert full and streamed == full


USED = 'infr_kv_blocks{state="used"}'


def test_sixty_four_concurrent_streams_with_disconnects(server):
    """Every kept stream gives exactly its single-request text; the ones that hang up free their blocks."""
    client = openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)
    prompts = PROMPTS + ["Name a colour.", "Count to three.", "Name a city.", "Say goodbye."]
    expected = {p: client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": p}], max_tokens=8, temperature=0,
        extra_body={"cache_prompt": False}).choices[0].message.content for p in prompts}
    before = _metric(_metrics(server), "infr_requests_cancelled_total")

    async def one(aclient, i):
        prompt = prompts[i % len(prompts)]
        stream = await aclient.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0, stream=True)
        if i % 4 == 3:  # a quarter of the clients leave after their first chunk
            async for _ in stream:
                break
            await stream.close()
            return prompt, None
        return prompt, "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main():
        async with openai.AsyncOpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0, timeout=300) as a:
            return await asyncio.gather(*(one(a, i) for i in range(64)))

    results = asyncio.run(main())
    kept = [(p, t) for p, t in results if t is not None]
    assert len(kept) == 48
    for prompt, text in kept:
        assert text == expected[prompt], prompt
    m = _await_idle(server)
    assert _metric(m, USED) == 0 and _metric(m, "infr_requests_waiting") == 0
    assert _metric(m, "infr_requests_cancelled_total") - before >= 1  # some left before their answer ended
    assert _metric(m, "infr_batch_rows_max") > 1  # requests shared steps
    assert httpx.get(server + "/health").json() == {"status": "ok"}


def _await_idle(server) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = _metrics(server)
        if _metric(m, "infr_requests_running") == 0 and _metric(m, USED) == 0:
            break
        time.sleep(0.2)
    return m


def _await_cancelled(server, before: float) -> str:
    """The metrics once a cancellation past `before` is counted and no sequence runs (2 minutes at most)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = _metrics(server)
        if _metric(m, "infr_requests_cancelled_total") > before and _metric(m, "infr_requests_running") == 0:
            break
        time.sleep(0.2)
    return m


def test_disconnect_cancels_and_frees_blocks(server):
    before = _metric(_metrics(server), "infr_requests_cancelled_total")
    body = {"model": "smol", "messages": [{"role": "user", "content": "Tell a very long story."}],
            "max_tokens": 600, "temperature": 0.8, "stream": True}
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few chunks, then hang up
            assert any(line.startswith("data: ") for line in got)
    m = _await_cancelled(server, before)
    assert _metric(m, "infr_requests_cancelled_total") == before + 1
    assert _metric(m, "infr_requests_running") == 0 and _metric(m, USED) == 0


def test_non_stream_disconnect_cancels_and_frees_blocks(server):
    m = _metrics(server)
    before = _metric(m, "infr_requests_cancelled_total")
    # A const string forces ~600 tokens, so the answer cannot be ready when the client gives up.
    schema = {"const": "tick " * 600}
    body = {"model": "smol", "messages": [{"role": "user", "content": "Say tick."}], "max_tokens": 900,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}}
    with pytest.raises(httpx.ReadTimeout):  # the client hangs up after 2 s without an answer
        httpx.post(server + "/v1/chat/completions", json=body, headers=AUTH, timeout=httpx.Timeout(60, read=2.0))
    m = _await_cancelled(server, before)
    assert _metric(m, "infr_requests_cancelled_total") == before + 1
    assert _metric(m, "infr_requests_running") == 0 and _metric(m, USED) == 0
    assert _metric(m, 'infr_errors_total{status="499"}') >= 1  # the answer nobody received


def _chat(**extra):
    return {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


AUTH = {"Authorization": f"Bearer {API_KEY}"}
BAD = [
    # (name, method, path, body (dict, bytes or None), headers, status, words in the message)
    ("no key", "POST", "/v1/chat/completions", _chat(), {}, 401, "missing api key"),
    ("wrong key", "POST", "/v1/chat/completions", _chat(), {"Authorization": "Bearer nope"}, 401, "invalid api key"),
    ("garbage bytes", "POST", "/v1/chat/completions", b"\x00\xff{garbage", AUTH, 400, "not valid json"),
    ("not an object", "POST", "/v1/chat/completions", b"[1, 2]", AUTH, 400, "expected `object`"),
    ("missing messages", "POST", "/v1/chat/completions", {"model": "smol"}, AUTH, 400, "messages"),
    ("wrong type", "POST", "/v1/chat/completions", _chat(max_tokens="ten"), AUTH, 400, "max_tokens"),
    ("bad role", "POST", "/v1/chat/completions",
     {"messages": [{"role": "wizard", "content": "x"}]}, AUTH, 400, "messages[0].role"),
    ("content type", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": 42}]}, AUTH, 400, "messages[0].content"),
    ("image part", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, AUTH, 400,
     "only text parts"),
    ("message without content", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user"}]}, AUTH, 400, "messages[0].content"),
    ("empty messages", "POST", "/v1/chat/completions", {"messages": []}, AUTH, 400, "at least one message"),
    ("huge max_tokens", "POST", "/v1/chat/completions", _chat(max_tokens=10**9), AUTH, 400, "max_tokens is too large"),
    ("max_tokens overflow", "POST", "/v1/chat/completions", _chat(max_tokens=10**20), AUTH, 400, "max_tokens"),
    ("zero max_tokens", "POST", "/v1/chat/completions", _chat(max_tokens=0), AUTH, 400, "max_tokens"),
    ("temperature range", "POST", "/v1/chat/completions", _chat(temperature=9), AUTH, 400, "temperature"),
    ("n > 1", "POST", "/v1/chat/completions", _chat(n=3), AUTH, 400, "unsupported field(s): n"),
    ("logit_bias", "POST", "/v1/chat/completions", _chat(logit_bias={"1": 5}), AUTH, 400, "logit_bias"),
    ("unknown model id", "GET", "/v1/models/nope", None, AUTH, 404, "'nope' does not exist"),
    ("invalid schema", "POST", "/v1/chat/completions",
     _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}), AUTH, 400,
     "invalid"),
    ("bad response_format", "POST", "/v1/chat/completions", _chat(response_format={"type": "yaml"}), AUTH, 400,
     "response_format"),
    ("tool_choice without tools", "POST", "/v1/chat/completions", _chat(tool_choice="required"), AUTH, 400,
     "tool_choice needs tools"),
    ("top_logprobs alone", "POST", "/v1/chat/completions", _chat(top_logprobs=2), AUTH, 400, "needs logprobs"),
    ("prompt too long", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "word " * 2000}]}, AUTH, 400, "tokens but the context holds 1024"),
    ("stop type", "POST", "/v1/chat/completions", _chat(stop=5), AUTH, 400, "stop"),
    ("completion token out of vocab", "POST", "/v1/completions", {"prompt": [10**7]}, AUTH, 400, "vocabulary"),
    ("unknown route", "GET", "/v1/nothing", None, AUTH, 404, "no such endpoint"),
    ("wrong method", "GET", "/v1/chat/completions", None, AUTH, 405, "not allowed"),
    ("detokenize bad id", "POST", "/detokenize", {"tokens": [-1]}, AUTH, 400, "tokens"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_requests(server, case):
    name, method, path, body, headers, status, words = case
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    if isinstance(body, bytes):
        headers = {**headers, "Content-Type": "application/json"}
    r = httpx.request(method, server + path, headers=headers, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words.lower() in err["message"].lower(), err
    assert err["type"] and "code" in err
    # the server still answers
    assert httpx.get(server + "/health").status_code == 200


def test_any_model_name_is_served(server):
    """Without --strict-model the one model answers whatever `model` a client names, under its own id."""
    r = httpx.post(server + "/v1/chat/completions", json=_chat(model="nope"), headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "smol"


def test_health_open_and_alive_after_corpus(server):
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    r = httpx.post(server + "/v1/chat/completions", json=_chat(), headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    assert _metric(_metrics(server), 'infr_errors_total{status="400"}') >= 10

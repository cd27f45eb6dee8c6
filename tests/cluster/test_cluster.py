"""`infr cluster` end to end on a local Ray cluster: SmolLM2 as two models ("smol" and "smol-b", the
same file), two CPU engine replicas each, behind the Ray Serve ingress; the real openai client.
One cluster for the module; the drain test tears it down, so it runs last."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from litestar.testing import TestClient
from ray import serve

from cluster_kit import free_port, running, wait_for  # tests/cluster is on sys.path
from infr.cluster import app as cluster_app
from infr.cluster.config import ClusterConfig, ModelEntry
from infr.serve.app import create_app
from infr.serve.service import Config

KEY = "sk-cluster-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
# ~150 tokens: several full KV blocks (32 tokens) past the template's shared system prompt
STORY = ("Here is a long note about the lighthouse keeper {n}, who counted ships every evening, wrote down "
         "their flags and colours, fed the gulls at dawn, repaired the lamp twice a winter, kept a garden of "
         "thyme and onions behind the stone wall, and sent letters to a sister in a faraway harbour town. ") * 2




@pytest.fixture(scope="module")
def cluster(smollm2_path):
    cfg = ClusterConfig(models=[ModelEntry(str(smollm2_path), "smol"), ModelEntry(str(smollm2_path), "smol-b")],
                        replicas=2, num_cpus=1, ctx=512, parallel=4, backend="cpu", port=free_port(),
                        local_cpus=8, object_store_mb=200, replica_logs=False, api_key=KEY, drain_s=30,
                        event_gap_s=30, probe_s=0.5)
    with running(cfg):
        yield cfg


@pytest.fixture(scope="module")
def base(cluster):
    return f"http://127.0.0.1:{cluster.port}"


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)


def _metrics(base: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{base}/metrics", headers=AUTH, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _sample(m: dict, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for key, value in m.items():
        if key == name or key.startswith(name + "{"):
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += value
    return total


def test_models_health_and_aggregated_metrics(base, client):
    assert [m.id for m in client.models.list().data] == ["smol", "smol-b"]
    assert httpx.get(f"{base}/health").json() == {"status": "ok", "models": {"smol": {"live": 2, "replicas": 2},
                                                                             "smol-b": {"live": 2, "replicas": 2}}}
    text = httpx.get(f"{base}/metrics", headers=AUTH).text
    assert text.count("# TYPE infr_generated_tokens_total counter") == 1  # one family, four replicas' samples
    for model in ("smol", "smol-b"):
        for i in (0, 1):
            assert f'infr_kv_blocks{{model="{model}",replica="{i}",state="free"}}' in text
    assert 'infr_cluster_replicas{model="smol",state="live"} 2' in text


def test_chat_stream_and_tools_through_the_ingress(client):
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=8, temperature=0)
    assert r.model == "smol" and r.choices[0].message.content and r.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Count to 3."}],
                                                 max_tokens=8, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    t = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, temperature=0)
    assert t.choices[0].finish_reason == "tool_calls"
    (call,) = t.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)


def test_answers_and_error_bodies_match_infr_serve(base, client, smollm2_path):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "x"}], temperature=-1)
    cases = [  # (method, path, body, headers): each answered by the cluster exactly as by `infr serve`
        ("POST", "/tokenize", {"model": "smol", "content": "Hello world", "with_pieces": True}, AUTH),
        ("POST", "/detokenize", {"model": "smol", "tokens": [19556, 905]}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "smol", "messages": []}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "x"}],
                                          "temperature": -1}, AUTH),
        ("POST", "/v1/completions", {"model": "smol", "prompt": [999999]}, AUTH),
        ("POST", "/v1/chat/completions", b"{not json", AUTH),
        ("POST", "/v1/chat/completions", {"model": 5, "messages": [{"role": "user", "content": "x"}]}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "smol", "messages": "hi"}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "x"}],
                                          "max_tokens": 10**6}, AUTH),
        ("POST", "/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": "x"}]}, {}),
        ("GET", "/v1/models/gpt-5", None, AUTH),
        ("POST", "/tokenize", {"model": "smol", "content": "x", "messages": []}, AUTH),
        ("GET", "/v1/nothing", None, AUTH),
    ]
    ref = create_app(Config(model=str(smollm2_path), ctx=512, backend="cpu", model_alias="smol", strict_model=True,
                            api_key=KEY))
    with TestClient(ref, timeout=60) as tc:
        wait_for(lambda: tc.get("/health").status_code == 200, 60, "the reference server")
        for method, path, body, headers in cases:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
            want = tc.request(method, path, headers=headers, **kw)
            got = httpx.request(method, base + path, headers=headers, timeout=60, **kw)
            expected = want.json()
            # the cluster names both its models
            if "this server serves 'smol'" in expected.get("error", {}).get("message", ""):
                expected["error"]["message"] += ", 'smol-b'"
            assert (got.status_code, got.json()) == (want.status_code, expected), (method, path, body)
    assert httpx.get(f"{base}/health").status_code == 200  # bad input harmed nothing


def test_sixteen_concurrent_streams(base, client):
    def one(i: int) -> tuple[str, str]:
        stream = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": f"Name a colour, please ({i})."}], max_tokens=6,
            temperature=0.7, seed=i, stream=True)
        text, finish = "", None
        for c in stream:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        return text, finish

    before = _metrics(base)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert all(finish in ("stop", "length") for _, finish in results), results
    assert sum(1 for text, _ in results if text) >= 15  # a first token may be an end-of-turn; the rest speak
    after = _metrics(base)
    spread = [_sample(after, "infr_requests_total", model="smol", replica=str(i))
              - _sample(before, "infr_requests_total", model="smol", replica=str(i)) for i in (0, 1)]
    assert sum(spread) == 16 and min(spread) >= 3, spread  # both replicas took a share


def test_models_routed_by_name(base, client):
    before = _metrics(base)
    for model in ("smol-b", "smol", "smol-b"):
        r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
        assert r.model == model
    after = _metrics(base)
    grew = {m: _sample(after, "infr_requests_total", model=m) - _sample(before, "infr_requests_total", model=m)
            for m in ("smol", "smol-b")}
    assert grew == {"smol": 1, "smol-b": 2}


def test_follow_up_turn_hits_the_replica_that_cached_it(base, client):
    firsts = []
    for n in range(4):  # with no affinity, the least-loaded choice alternates replicas
        msgs = [{"role": "user", "content": STORY.format(n=n) + "Summarise it in one line."}]
        r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=4, temperature=0)
        firsts.append((msgs + [{"role": "assistant", "content": r.choices[0].message.content}], r.usage.prompt_tokens))
    before = _metrics(base)
    for msgs, first_len in reversed(firsts):  # by load alone the follow-ups would land on the other replica
        r = client.chat.completions.create(model="smol", messages=msgs + [{"role": "user", "content": "Shorter."}],
                                           max_tokens=4, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert cached >= first_len - 32, (cached, first_len)  # the whole first turn, to the block
    after = _metrics(base)
    assert _sample(after, "infr_cluster_routed_total", model="smol", by="prefix") - \
        _sample(before, "infr_cluster_routed_total", model="smol", by="prefix") == 4


def test_client_that_leaves_frees_its_replica(base, client):
    before = _metrics(base)
    stream = client.chat.completions.create(model="smol-b", messages=[{"role": "user", "content": "Go on."}],
                                            max_tokens=300, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()

    def freed():
        m = _metrics(base)
        return (_sample(m, "infr_cluster_requests_in_flight", model="smol-b") == 0
                and _sample(m, "infr_requests_running", model="smol-b") == 0
                and _sample(m, "infr_requests_cancelled_total", model="smol-b")
                == _sample(before, "infr_requests_cancelled_total", model="smol-b") + 1)

    wait_for(freed, 30, "the replica to cancel the abandoned answer")


def _serving_slot(base: str, model: str, n: int) -> int:
    m = _metrics(base)
    for i in (0, 1):
        if _sample(m, "infr_cluster_requests_in_flight", model=model, replica=str(i)) >= n:
            return i
    return -1


def test_killed_replica_fails_in_flight_cleanly_and_is_restarted(base, client):
    long = {"max_tokens": 300, "temperature": 0, "extra_body": {"ignore_eos": True}}
    prefix = STORY.format(n="K")
    outcome: dict = {}
    first_token = threading.Event()

    def streamed():
        t0 = time.monotonic()
        try:
            for c in client.chat.completions.create(model="smol", stream=True, **long,
                                                    messages=[{"role": "user", "content": prefix + "One."}]):
                if c.choices and c.choices[0].delta.content:
                    first_token.set()
            outcome["stream"] = "completed"
        except openai.APIError as e:
            outcome["stream"] = e
        outcome["stream_s"] = time.monotonic() - t0
        first_token.set()

    def plain():
        try:
            client.chat.completions.create(model="smol", messages=[{"role": "user", "content": prefix + "Two."}],
                                           **long)
            outcome["plain"] = "completed"
        except openai.APIStatusError as e:
            outcome["plain"] = e

    threads = [threading.Thread(target=streamed)]
    threads[0].start()
    assert first_token.wait(60)
    threads.append(threading.Thread(target=plain))
    threads[1].start()
    slot = wait_for(lambda: _serving_slot(base, "smol", 2) + 1, 30, "both requests on one replica (same prefix)") - 1
    handle = serve.get_deployment_handle(f"engine-0-{slot}", app_name=cluster_app_name())
    pid = handle.info.remote().result(timeout_s=30)["pid"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=30)
    assert time.monotonic() - killed < 30 and not any(t.is_alive() for t in threads), "a request hung"
    err = outcome["stream"]
    assert isinstance(err, openai.APIError) and "failed mid-answer" in str(err), err
    assert isinstance(outcome["plain"], openai.APIStatusError) and outcome["plain"].status_code == 503
    assert outcome["plain"].body["code"] == "replica_failed"
    for i in range(4):  # new requests go to the live replica while the other restarts
        r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": f"Hi {i}"}],
                                           max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length")
    # /health is 200 while any replica of each model is live: wait for the ingress's probe to take the
    # restarted one back, not only for Ray to start it
    wait_for(lambda: httpx.get(f"{base}/health").json()["models"]["smol"]["live"] == 2, 120,
             "the killed replica's restart", every=0.5)
    assert handle.info.remote().result(timeout_s=30)["pid"] != pid  # Ray started a new process
    m = _metrics(base)
    assert _sample(m, "infr_cluster_replica_failures_total", model="smol") >= 2
    assert re.search(r"infr_cluster_replicas\{model=\"smol\",state=\"live\"\} 2", httpx.get(
        f"{base}/metrics", headers=AUTH).text)


def cluster_app_name() -> str:
    return ClusterConfig().app_name


def test_shutdown_drains_requests_in_flight(cluster, client):
    """Last: deleting the application lets the answer in flight finish."""
    result: dict = {}

    def streamed():
        chunks = list(client.chat.completions.create(
            model="smol-b", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=40,
            temperature=0, stream=True, extra_body={"ignore_eos": True}))
        result["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        result["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    t = threading.Thread(target=streamed)
    t.start()
    wait_for(lambda: "text" in result or _serving_slot(f"http://127.0.0.1:{cluster.port}", "smol-b", 1) >= 0, 30,
          "the request in flight")
    cluster_app.stop(cluster)  # blocks until the application is gone
    t.join(timeout=60)
    assert result.get("finish") == "length" and result["text"], result

"""`infr serve` on the GPU backend (lavapipe in CI): a chat completion and two concurrent
requests give the CPU reference's greedy text. `--parallel 2` runs both in shared steps of the
engine over one GPU backend and its KV pool (docs/serve.md)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from litestar.testing import AsyncTestClient, TestClient

from infr.serve.app import create_app
from infr.serve.service import Config
from tests.gpu.conftest import gpu  # noqa: F401  the GPU fixture: skips without an adapter, fails under CI
from tests.serve.conftest import wait_ready

PROMPTS = ["The capital of France is", "One, two, three,"]  # short: lavapipe is slow


@pytest.fixture(scope="module")
def gpu_client(gpu, smollm2_path):  # noqa: F811
    app = create_app(Config(model=str(smollm2_path), ctx=256, parallel=2, backend="gpu", model_alias="smol"))
    with TestClient(app, timeout=600) as tc:
        wait_ready(tc.get, timeout=600)
        yield tc


def test_gpu_server_chat_and_two_concurrent_requests(gpu_client, smol_openai):
    svc = gpu_client.app.state.service
    assert svc.model.backend_name == "gpu" and svc.model.engine.parallel == 2
    client = openai.OpenAI(base_url=f"{gpu_client.base_url}/v1", api_key="x", http_client=gpu_client, max_retries=0)
    chat = dict(model="smol", messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=5, temperature=0)
    got = client.chat.completions.create(**chat)
    assert got.choices[0].message.content
    assert got.choices[0].message.content == smol_openai.chat.completions.create(**chat).choices[0].message.content

    kw = dict(model="smol", max_tokens=5, temperature=0, extra_body={"cache_prompt": False})
    expected = [smol_openai.completions.create(prompt=p, **kw).choices[0].text for p in PROMPTS]

    async def main():
        async with AsyncTestClient(gpu_client.app, timeout=600) as tc:
            a = openai.AsyncOpenAI(base_url=f"{tc.base_url}/v1", api_key="x", http_client=tc, max_retries=0)

            async def stream(prompt):
                s = await a.completions.create(prompt=prompt, stream=True, **kw)
                return "".join([c.choices[0].text async for c in s if c.choices])

            return await asyncio.gather(*(stream(p) for p in PROMPTS))

    assert asyncio.run(main()) == expected
    metrics = gpu_client.get("/metrics").text
    assert "infr_requests_running 0" in metrics and "infr_requests_waiting 0" in metrics
    assert "infr_batch_rows_max 1\n" not in metrics  # the two streams shared steps

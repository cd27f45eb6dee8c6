"""qwen35 through the server: a completion that shares a prefix with an earlier one restores a
recurrent state checkpoint (usage.prompt_tokens_details.cached_tokens), gives the text a cold
run gives, and /metrics reports the checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from litestar.testing import TestClient

from infr import synth
from infr.serve.app import create_app
from infr.serve.service import Config

from tests.serve.conftest import wait_ready


@pytest.fixture(scope="module")
def q35_client(tmp_path_factory):
    path = synth.write_gguf(synth.PRESETS["tiny-qwen35"], tmp_path_factory.mktemp("q35serve") / "tiny-qwen35.gguf")
    app = create_app(Config(model=str(path), ctx=256, parallel=2, backend="cpu", model_alias="q35"))
    with TestClient(app, timeout=120) as tc:
        wait_ready(tc.get)
        yield tc


def _complete(client, prompt, cache_prompt=True):
    r = client.post("/v1/completions", json={"model": "q35", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                             "cache_prompt": cache_prompt, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_shared_prefix_restores_a_checkpoint_through_the_server(q35_client):
    rng = np.random.default_rng(3)
    shared = rng.integers(2, 512, 70).tolist()
    first = shared + rng.integers(2, 512, 5).tolist()
    second = shared + rng.integers(2, 512, 9).tolist()
    cold_text, cached = _complete(q35_client, second, cache_prompt=False)
    assert cached == 0
    _, cached = _complete(q35_client, first)
    assert cached == 64  # the cold run above left a snapshot at its last block boundary, 64
    text, cached = _complete(q35_client, second)
    assert cached == 64 and text == cold_text
    m = q35_client.get("/metrics").text
    assert "infr_recurrent_checkpoints 1" in m  # the one at 64 of the shared prefix, used twice
    assert 'infr_recurrent_checkpoints_total{event="restored"} 2' in m
    assert "infr_recurrent_state_bytes_per_sequence 11264" in m  # 2 DeltaNet layers, f32: 3 conv rows of 128, 4 heads of 16 x 16

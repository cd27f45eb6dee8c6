"""`infr cluster --backend gpu --num-gpus 1` on a local Ray cluster: one SmolLM2 replica that owns a
GPU engine (lavapipe in CI: Ray sees no CUDA GPU there, so the local cluster must advertise the
WebGPU adapter itself). Its greedy answer equals `infr serve`'s on the GPU backend in-process."""

from __future__ import annotations

import os
import time

import httpx
import pytest
import ray
from litestar.testing import TestClient
from ray import serve

from cluster_kit import free_port, running  # tests/cluster is on sys.path
from infr.cluster.config import ClusterConfig, ModelEntry
from infr.gpu.device import gpu_adapters
from infr.serve.app import create_app
from infr.serve.service import Config

CHAT = {"model": "smol", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12,
        "temperature": 0}


@pytest.fixture(scope="module")
def adapters() -> list[int]:
    found = gpu_adapters()
    if not found:
        if os.environ.get("CI"):  # CI has lavapipe: a missing adapter is a broken image, not a skip
            raise AssertionError("no WebGPU adapter")
        pytest.skip("no WebGPU adapter (install mesa-vulkan-drivers for lavapipe)")
    return found



@pytest.fixture(scope="module")
def gpu_cluster(adapters, smollm2_path):
    cfg = ClusterConfig(models=[ModelEntry(str(smollm2_path), "smol")], replicas=1, num_cpus=1, num_gpus=1,
                        ctx=256, parallel=2, backend="gpu", port=free_port(), local_cpus=4, object_store_mb=100,
                        replica_logs=False, drain_s=5)
    with running(cfg):
        yield cfg


def test_gpu_replica_answers_as_infr_serve_on_the_gpu(gpu_cluster, adapters, smollm2_path):
    base = f"http://127.0.0.1:{gpu_cluster.port}"
    assert ray.cluster_resources().get("GPU", 0) >= 1  # advertised although Ray finds no CUDA GPU here
    card = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]
    assert card["id"] == "smol" and card["meta"]["backend"] == "gpu"
    info = serve.get_deployment_handle("engine-0-0", app_name=gpu_cluster.app_name).info.remote().result(
        timeout_s=60)
    # Ray's GPU id 0 is the first distinct adapter; the engine runs on it
    assert info["backend"] == "gpu" and info["infr_device"] == str(adapters[0]) and info["device"]
    got = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=300).json()
    ref = create_app(Config(model=str(smollm2_path), ctx=256, parallel=2, backend="gpu", model_alias="smol"))
    with TestClient(ref, timeout=300) as tc:
        deadline = time.monotonic() + 120
        while tc.get("/health").status_code != 200:  # the model loads in the background
            assert time.monotonic() < deadline, "the reference server did not load"
            time.sleep(0.2)
        want = tc.post("/v1/chat/completions", json=CHAT).json()
    assert got["choices"][0]["message"]["content"], got
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]

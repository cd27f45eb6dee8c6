"""`infr cluster --replicas 1:2` end to end: one CPU replica of SmolLM2 at rest; under concurrent load
Ray Serve starts the second (autoscaling delays shortened from Ray's 30 s to about a second), and
both answer requests."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from ray import serve

from cluster_kit import free_port, running, wait_for  # tests/cluster is on sys.path
from infr.cluster.config import ClusterConfig, ModelEntry

# How often handles and replicas report their load to Ray's autoscaler (10 s by default); read by
# the Ray processes the local cluster starts, which inherit this environment.
PUSH_ENV = {"RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
            "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5"}




@pytest.fixture(scope="module")
def autoscaled(smollm2_path):
    saved = {k: os.environ.get(k) for k in PUSH_ENV}
    os.environ.update(PUSH_ENV)
    cfg = ClusterConfig(models=[ModelEntry(str(smollm2_path), "smol")], replicas=1, max_replicas=2, num_cpus=1,
                        ctx=256, parallel=2, backend="cpu", port=free_port(), local_cpus=4, object_store_mb=100,
                        replica_logs=False, drain_s=5, upscale_delay_s=1, downscale_delay_s=600, look_back_s=2)
    try:
        with running(cfg):
            yield cfg
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _running(cfg: ClusterConfig) -> int:
    return serve.status().applications[cfg.app_name].deployments["engine-0"].replica_states.get("RUNNING", 0)


def test_load_starts_the_second_replica_and_both_serve(autoscaled):
    cfg = autoscaled
    assert _running(cfg) == 1  # at rest: the minimum
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cfg.port}/v1", api_key="x", max_retries=0, timeout=120)
    handle = serve.get_deployment_handle("engine-0", app_name=cfg.app_name)
    done, errors, finishes = threading.Event(), [], []

    def load(i: int) -> None:  # one client sending request after request until told to stop
        while not done.is_set():
            try:
                r = client.completions.create(model="smol", prompt=f"Once upon a time, {i}", max_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})
                finishes.append(r.choices[0].finish_reason)
            except openai.APIError as e:
                errors.append(e)
                return

    def served() -> dict[int, int]:
        """pid -> requests of each replica the router hands these calls to (both, once both run)."""
        out: dict[int, int] = {}
        for _ in range(12):
            s = handle.served.remote().result(timeout_s=30)
            out[s["pid"]] = max(out.get(s["pid"], 0), s["requests"])
        return out

    with ThreadPoolExecutor(6) as pool:  # 6 requests in flight, 2 per replica the target: 2 replicas wanted
        for i in range(6):
            pool.submit(load, i)
        try:
            wait_for(lambda: _running(cfg) == 2 or errors, 90, "the second replica")
            both = wait_for(lambda: (lambda s: s if len(s) == 2 and min(s.values()) > 0 else None)(served()) or errors,
                         60, "requests on both replicas")
        finally:
            done.set()
    assert not errors, errors
    assert isinstance(both, dict) and len(both) == 2, both
    assert finishes and set(finishes) == {"length"}

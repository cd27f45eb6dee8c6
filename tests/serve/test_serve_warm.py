"""The server's idle engine builds decode steps ahead (Scheduler.warm_next): every shape once, and
a backend whose warming fails logs it once and still serves."""

from __future__ import annotations

import time

import pytest
from litestar.testing import TestClient

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.serve.app import create_app
from infr.serve.service import Config

from tests.serve.conftest import wait_ready


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return synth.write_gguf(synth.preset("tiny-llama", tokenizer="gpt2"), tmp_path_factory.mktemp("warm") / "tiny.gguf")


def _complete(client) -> str:
    r = client.post("/v1/completions", json={"model": "t", "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0,
                                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_idle_server_warms_every_shape_once(tiny_path, monkeypatch):
    shapes = []
    monkeypatch.setattr(CPUBackend, "warm", lambda self, rows, far=False: shapes.append((rows, far)))
    with TestClient(create_app(Config(model=str(tiny_path), ctx=128, parallel=3, backend="cpu",
                                      model_alias="t")), timeout=60) as tc:
        wait_ready(tc.get)
        _until(lambda: len(shapes) >= 6)
        _complete(tc)
        time.sleep(0.2)  # idle again: nothing is built twice
    assert shapes == [(1, False), (2, False), (3, False), (1, True), (2, True), (3, True)]


def test_failed_warming_is_logged_once_and_requests_are_served(tiny_path, monkeypatch):
    from infr.serve import service

    calls, warnings = [], []

    def broken(self, rows, far=False):
        calls.append(rows)
        raise RuntimeError("no graph for you")

    monkeypatch.setattr(CPUBackend, "warm", broken)
    monkeypatch.setattr(service.log, "warning", lambda msg, *args: warnings.append(msg % args))
    with TestClient(create_app(Config(model=str(tiny_path), ctx=128, parallel=2, backend="cpu",
                                      model_alias="t")), timeout=60) as tc:
        wait_ready(tc.get)
        _until(lambda: calls)
        time.sleep(0.2)
        assert len(_complete(tc)) > 0
    assert calls == [1]  # warming stopped at the first failure
    assert len(warnings) == 1 and "building decode steps ahead failed" in warnings[0]
    assert "no graph for you" in warnings[0]

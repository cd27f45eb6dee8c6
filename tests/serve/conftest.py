"""Fixtures for the server tests: an in-process app (Litestar's TestClient, which is an
httpx client the openai package accepts) and a real `python -m infr serve` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from litestar.testing import TestClient

from infr.serve.app import create_app
from infr.serve.service import Config

API_KEY = "sk-infr-test"


def wait_ready(get, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not become ready")


@pytest.fixture(scope="session")
def smol_client(smollm2_path):
    app = create_app(Config(model=str(smollm2_path), ctx=1024, parallel=2, backend="cpu", model_alias="smol"))
    with TestClient(app, timeout=120) as tc:
        wait_ready(tc.get)
        yield tc


@pytest.fixture(scope="session")
def smol_openai(smol_client):
    return openai.OpenAI(base_url=f"{smol_client.base_url}/v1", api_key="unused", http_client=smol_client,
                         max_retries=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(smollm2_path, tmp_path_factory):
    """A real server process on 127.0.0.1 with an API key and 4 slots."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    env = dict(os.environ, INFR_API_KEY=API_KEY, INFR_PARALLEL="4")
    root = Path(__file__).resolve().parents[2]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infr", "serve", str(smollm2_path), "--port", str(port), "--ctx", "1024",
             "--backend", "cpu", "--alias", "smol"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            try:
                wait_ready(c.get)
            except AssertionError:
                raise AssertionError("server failed to start:\n" + log.read_text()[-3000:]) from None
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -15), log.read_text()[-3000:]

"""What the cluster tests share: a free port, polling, and one application up for a block."""

from __future__ import annotations

import socket
import time
from contextlib import contextmanager

import ray
from ray import serve

from infr.cluster import app as cluster_app
from infr.cluster.config import ClusterConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str, every: float = 0.2):
    """pred()'s first truthy value within timeout seconds, else an AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def running(cfg: ClusterConfig):
    """cfg's application on its (local) Ray cluster for the block; stopped and Ray shut down after,
    whatever a test left (a test may stop the application itself)."""
    cluster_app.connect(cfg)
    try:
        cluster_app.start(cfg)
        yield cfg
    finally:
        if ray.is_initialized():
            if serve.status().applications:
                cluster_app.stop(cfg)
            ray.shutdown()

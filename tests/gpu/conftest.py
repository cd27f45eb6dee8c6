"""GPU tests run on whatever adapter wgpu finds (lavapipe in CI); they skip
cleanly where none exists, except under CI, where a missing adapter fails.
INFR_TEST_FLAVOR=dawn runs the kernel tests (those taking the `gpu` fixture) on
Dawn instead (the Dawn tier, where Dawn finds an adapter: not lavapipe)."""

from __future__ import annotations

import os

import pytest

from infr.errors import InfrError


@pytest.fixture(scope="session")
def gpu():
    from infr.gpu.device import get_device

    try:
        return get_device(flavor=os.environ.get("INFR_TEST_FLAVOR", "wgpu"))
    except InfrError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no WebGPU adapter: {e}")


@pytest.fixture(scope="session")
def kernels(gpu):
    from infr.gpu.runtime import Kernels

    return Kernels(gpu)


@pytest.fixture
def tune(monkeypatch):
    """tune(INFR_X="v", ...): tuning variables for one test. The kernels read them once
    (infr.gpu.tuning), so the tuning is read again now and once more after the test."""
    from infr.gpu import tuning

    def set_(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        tuning.reload()

    yield set_
    monkeypatch.undo()
    tuning.reload()

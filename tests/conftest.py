"""Shared fixtures: the three real models, fetched once into infr's cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infr import offline
from infr.errors import InfrError


def _model_path(name: str) -> Path:
    model = offline.MODELS[name]
    local = os.environ.get("INFR_TEST_MODELS")
    if local and (Path(local) / model.filename).exists():
        return Path(local) / model.filename
    try:
        return offline.ensure(name, quiet=True)
    except InfrError as e:
        if os.environ.get("CI"):  # CI must run every model test, never skip one
            raise
        pytest.skip(f"model {name} unavailable: {e}")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model_path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model_path("gemma3-270m")


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    return _model_path("qwen2.5-coder-0.5b")

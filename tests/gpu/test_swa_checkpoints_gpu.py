"""Sliding-window checkpoints on the GPU backend (infr/checkpoints.py WindowCheckpoints): the pinned
window blocks are read through the window table like any cached block, so a prefix longer than the
window, whose window blocks the pool's cache lost, is restored and gives the CPU reference's tokens."""

from __future__ import annotations

import numpy as np
import pytest

from infr import synth
from infr.engine import Model
from infr.sampling import SamplingParams
from infr.scheduler import Request
from tests.gpu.conftest import gpu  # noqa: F401  the GPU fixture: skips without an adapter, fails under CI

GREEDY = SamplingParams(temperature=0.0)
CTX = 256


@pytest.fixture(scope="module")
def tiny_gemma3_path(tmp_path_factory):
    return synth.write_gguf(synth.preset("tiny-gemma3", tokenizer="gpt2"),
                            tmp_path_factory.mktemp("swackgpu") / "tiny-gemma3.gguf")


def _run(model, prompts, max_new=6, **kw):
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=max_new, ignore_eos=True, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
    return reqs


def test_a_shared_prefix_past_the_window_restores_on_the_gpu(gpu, tiny_gemma3_path):  # noqa: F811
    ids = lambda seed, n: np.random.default_rng(seed).integers(2, 500, n).tolist()  # noqa: E731
    a = ids(1, 150)
    b = a[:135] + ids(3, 12)
    model = Model(tiny_gemma3_path, n_ctx=CTX, backend="gpu", kv_tokens=4 * CTX, batch_tokens=64)
    _run(model, [a])
    for seed in (2, 12):  # unrelated requests push a's cached window blocks out
        _run(model, [ids(seed, 200)], max_new=4)
    (rb,) = _run(model, [b])
    assert rb.cached_tokens == 128 and model.window_checkpoints.restored == 1
    cpu = Model(tiny_gemma3_path, n_ctx=CTX, backend="cpu", checkpoints=0)
    (cold,) = _run(cpu, [b], cache_prompt=False)
    assert rb.output == cold.output
    assert model.pool.used == 0 and model.window_pool.used == 0

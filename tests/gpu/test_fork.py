"""GPUBackend.fork(): a second sequence over the same uploaded weights (serve's slots)."""

from __future__ import annotations

import numpy as np


def _greedy_steps(be, prompt: list[int], n: int):
    """A generator: one greedy token per next(), decoding on `be`."""
    token = int(np.argmax(be.forward(prompt, 0)[-1]))
    yield token
    for i in range(n - 1):
        token = int(np.argmax(be.forward([token], len(prompt) + i)[-1]))
        yield token


def test_forks_keep_their_own_caches(tmp_path, gpu):
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = synth.preset("tiny-llama", n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, weight_type="Q4_K")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    plan = build_plan(build_spec(gf))
    be = GPUBackend(gf, plan, 64, dev=gpu)
    twin = be.fork()
    assert twin.weights is be.weights and twin.k_cache[0] is not be.k_cache[0]
    assert 0 < twin.vram < be.vram  # the weights were not uploaded again
    prompts = ([1, 17, 42, 99, 3, 250], [5, 6, 7, 8])
    cpu = CPUBackend(gf, plan, 64)
    want = [list(_greedy_steps(cpu, p, 10)) for p in prompts]
    assert want[0] != want[1]
    # The two sequences step in turn, each on its own backend: neither disturbs the other.
    a, b = _greedy_steps(be, prompts[0], 10), _greedy_steps(twin, prompts[1], 10)
    got = [[], []]
    for _ in range(10):
        got[0].append(next(a))
        got[1].append(next(b))
    assert got == want

"""Fused epilogues: the residual add inside the weight matmul (x = x + W·h)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import read, run, storage

from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q5_0])  # the coalesced Q4_K kernel and the generic one
@pytest.mark.parametrize("T", [1, 3])
def test_matmul_adds_residual(gpu, kernels, qtype, T):
    rng = np.random.default_rng(7)
    N, K = 67, 512
    w = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    resid = rng.standard_normal((T, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    chunks = KM.upload_weight(gpu, w)
    xb, rb, bb = storage(gpu, x), storage(gpu, resid), storage(gpu, bias)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    run(gpu, KM.matmul_dispatches(kernels, w, chunks, xb, y, bb, T, resid=rb))
    ref = x @ dequantize(np.array(w.raw), w.qtype).reshape(N, K).T + bias + resid
    out = read(gpu, y, count=T * N).reshape(T, N)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out, ref, atol=1e-5 * scale, rtol=0)


def test_plan_residual_adds_are_fused(smollm2_path, gemma3_path, gpu):
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend, _is_residual
    from infr.models import build_spec
    from infr.plan import build_plan

    for path, expected in ((smollm2_path, 2), (gemma3_path, 0)):  # Gemma norms the output first
        plan = build_plan(build_spec(open_gguf(path)))
        ops = list(plan.layers)
        fused = sum(_is_residual(a, b) for a, b in zip(ops, ops[1:]))
        assert fused == expected * plan.spec.n_layers
    gf = open_gguf(smollm2_path)
    plan = build_plan(build_spec(gf))
    be = GPUBackend(gf, plan, 32, dev=gpu)
    unfused = len(plan.embed + plan.layers + plan.head)  # one dispatch per op, chunks aside
    assert be.dispatches_per_token == unfused - 2 * plan.spec.n_layers

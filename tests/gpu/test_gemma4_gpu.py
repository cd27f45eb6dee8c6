"""gemma4 on the GPU against the CPU reference: its new kernels one by one (the fp16-table GELU, also
as the per-layer-input gate over a strided slice; the scaled values; the experts' output scales),
then the tiny synthetic models end to end: tiny-gemma4 (31B-style: sliding-window and full layers of
two head dims, V from the raw K, proportional RoPE, output scales, softcap), tiny-gemma4-e2b
(per-layer inputs, KV-shared layers reading another layer's cache, double-wide FFN) and
tiny-gemma4-moe (the dense FFN beside routed experts with per-expert scales). Logits close, greedy
tokens the reference follows, and through the engine batched rows equal to each sequence alone and
to the CPU reference. The llama.cpp fixtures on the GPU: tests/gpu/test_gemma4_exact_gpu.py."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from infr import synth
from infr.cpu import ops as F
from infr.cpu.backend import CPUBackend
from infr.errors import UnsupportedError
from infr.gguf_file import open_gguf
from infr.gpu import kernels_gemma4 as KG4
from infr.gpu import kernels_misc as KS
from infr.gpu.backend import GPUBackend
from infr.gpu.runtime import read, run, storage
from infr.models import build_spec
from infr.models.spec import Activation
from infr.plan import build_plan
from tests.closeness import assert_follows_greedy, assert_logits_close
from tests.engine_runs import greedy_outputs


def _buf(gpu, a):
    return storage(gpu, np.ascontiguousarray(a))


def _read(gpu, buf, shape):
    return read(gpu, buf, count=int(np.prod(shape))).reshape(shape)


# --- kernels


def test_table_gelu_equals_the_cpu_reference_bit_for_bit(gpu, kernels):
    rng = np.random.default_rng(0)
    # around the table's ends (+-10), f16 ties, subnormals, zeros, large values
    edges = np.array([-10.0, -9.999, 10.0, 9.999, -10.5, 11.0, 0.0, -0.0, 1e-7, -3e-6, 6e-5, 70000.0, -70000.0,
                      1.00048828125, 2.0009765625, -0.5002441], np.float32)
    g = np.concatenate([edges, (rng.standard_normal(3000) * 4).astype(np.float32)])
    u = rng.standard_normal(g.size).astype(np.float32)
    y = storage(gpu, g.nbytes)
    run(gpu, [KS.gated_dispatch(kernels, _buf(gpu, g), _buf(gpu, u), y, g.size, Activation.GELU_F16)])
    with np.errstate(over="ignore"):  # +-70000 past float16's range: the table's ends take them
        want = F.gated_act(g, u, Activation.GELU_F16)
    np.testing.assert_array_equal(_read(gpu, y, g.shape), want)


def test_table_gelu_over_a_layers_slice_of_the_per_layer_inputs(gpu, kernels):
    T, W, n_layers, layer = 5, 24, 4, 2
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((T, W)) * 3).astype(np.float32)
    ple = rng.standard_normal((T, n_layers * W)).astype(np.float32)
    y = storage(gpu, g.nbytes)
    run(gpu, [KG4.gated_gelu_f16_dispatch(kernels, _buf(gpu, g), _buf(gpu, ple), y, T * W, W, n_layers * W,
                                          layer * W)])
    want = F.gated_act(g, ple[:, layer * W:(layer + 1) * W], Activation.GELU_F16)
    np.testing.assert_array_equal(_read(gpu, y, g.shape), want)


@pytest.mark.parametrize("width,scale", [(1, 1.0), (40, 0.125), (40, 1.0)])
def test_mul_scales_in_place(gpu, kernels, width, scale):
    T, D = 3, 40
    rng = np.random.default_rng(width)
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.standard_normal(width).astype(np.float32)
    xb = _buf(gpu, x)
    run(gpu, [KG4.mul_dispatch(kernels, xb, _buf(gpu, w), T * D, width, scale)])
    np.testing.assert_array_equal(_read(gpu, xb, x.shape), (x * np.float32(scale)) * w)


def test_add_scaled(gpu, kernels):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 7, 33)).astype(np.float32)
    half = np.float32(1.0) / np.sqrt(np.float32(2.0))
    y = storage(gpu, a.nbytes)
    run(gpu, [KG4.add_scaled_dispatch(kernels, _buf(gpu, a), _buf(gpu, b), y, a.size, float(half))])
    np.testing.assert_array_equal(_read(gpu, y, a.shape), (a + b) * half)


def test_the_combine_scales_each_pair_by_its_experts_factor(gpu, kernels):
    """gemma4's per-expert output scales, applied in moe_combine: y[t] = sum over s of
    (ys[a] * scales[ids[a]]) * wts[a], a = t * K + s, in selection order (the CPU reference's)."""
    from infr.gpu import kernels_moe as KMoE

    T, K, D, E = 3, 2, 20, 5
    A = T * K
    rng = np.random.default_rng(2)
    ys = rng.standard_normal((A, D)).astype(np.float32)
    scales = rng.standard_normal(E).astype(np.float32)
    wts = rng.uniform(0.1, 1.0, A).astype(np.float32)
    ids = np.array([4, 0, 2, 2, 1, 4], np.uint32)
    y = storage(gpu, 4 * T * D)
    run(gpu, [KMoE.combine_dispatch(kernels, _buf(gpu, ys), _buf(gpu, wts), y, D, K, T, weighted=True,
                                    scales=(_buf(gpu, scales), _buf(gpu, ids)))])
    pairs = (ys * scales[ids][:, None]) * wts[:, None]
    want = np.zeros((T, D), np.float32)
    for s in range(K):
        want += pairs[s::K]
    np.testing.assert_array_equal(_read(gpu, y, (T, D)), want)


@pytest.mark.parametrize("T,D", [(1, 64), (3, 2816)])  # tiny-gemma4-moe's row; the 26B's, three workgroups
def test_the_combine_norms_both_rows_and_adds(gpu, kernels, T, D):
    """moe_combine_norms (fusion.py's moe_post_norms): rmsnorm(f) * gf + rmsnorm(combine(ys)) * gm into a
    new buffer, the combine with the experts' scales and router weights; against float64 numpy."""
    from infr.gpu import kernels_moe as KMoE

    K, E, eps = 4, 7, 1e-6
    rng = np.random.default_rng(D)
    ys = rng.standard_normal((T * K, D)).astype(np.float32)
    f = (rng.standard_normal((T, D)) * 3).astype(np.float32)
    scales = rng.uniform(0.5, 2, E).astype(np.float32)
    ids = rng.integers(0, E, T * K).astype(np.uint32)
    wts = rng.uniform(0.1, 1.0, T * K).astype(np.float32)
    gm, gf = (rng.uniform(0.5, 1.5, D).astype(np.float32) for _ in range(2))
    y = storage(gpu, 4 * T * D)
    post = KMoE.PostNorms(_buf(gpu, gm), eps, "f", _buf(gpu, gf), eps)
    run(gpu, [KMoE.combine_norms_dispatch(kernels, _buf(gpu, ys), _buf(gpu, wts), y, _buf(gpu, f), D, K, T, True,
                                          post, scales=(_buf(gpu, scales), _buf(gpu, ids)))])
    m = ((ys.astype(np.float64) * scales[ids][:, None]) * wts[:, None]).reshape(T, K, D).sum(axis=1)

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    want = norm(f.astype(np.float64), gf) + norm(m, gm)
    np.testing.assert_allclose(_read(gpu, y, (T, D)), want, rtol=2e-5, atol=2e-5)


# --- end to end


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("g4gpu")
    made: dict[str, object] = {}

    def get(preset: str, weight_type: str = "F32"):
        key = f"{preset}-{weight_type}"
        if key not in made:
            made[key] = synth.write_gguf(replace(synth.PRESETS[preset], weight_type=weight_type), root / f"{key}.gguf")
        return made[key]

    return get


CASES = [("tiny-gemma4", "F32"), ("tiny-gemma4", "Q8_0"), ("tiny-gemma4-e2b", "F32"), ("tiny-gemma4-e2b", "Q8_0"),
         ("tiny-gemma4-moe", "F32")]


@pytest.mark.parametrize("preset,weights", CASES)
def test_tiny_gemma4_follows_the_cpu_reference(gpu, files, preset, weights):
    gf = open_gguf(files(preset, weights))
    plan = build_plan(build_spec(gf))
    assert plan.cpu_only == ()
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    body = {d.label for d in g._graph(1, 1)[0].dispatches}
    # the post-norms with their residual adds and the layer_output_scale Mul: one rmsnorm_add each
    assert "rmsnorm_add" in body and "add" not in body
    # the table GELU: in the GEMV's gate||up pair where gate and up take it (Q8_0 of 64-value rows),
    # else alone (F32); alone too as the E2B's per-layer-input gate (tests/gpu/test_gelu_pair.py)
    paired = any(lb.startswith("gemv_q8_0_gate_up") for lb in body)
    assert paired == (weights == "Q8_0")
    assert ("gated_gelu_f16" in body) == (not paired or preset == "tiny-gemma4-e2b")
    assert ("add_scaled" in body) == (preset == "tiny-gemma4-e2b")  # the per-layer inputs
    routed = any(lb.startswith("moe_combine") for lb in body)
    assert routed == (preset == "tiny-gemma4-moe") and "expert_scale" not in body  # the scales: in the combine
    # past the 8-token window; seed 22: in tiny-gemma4-moe its router picks (prompt and decode) win by
    # >= 0.57% (CPU reference), where seed 0's smallest margin, 0.006%, is within reach of float
    # differences between devices (this test failed on an H100 with it, not diagnosed there)
    prompt = np.random.default_rng(22).integers(0, plan.spec.n_vocab, 20).tolist()
    assert_logits_close(g.forward(prompt, 0, n_logits=20), c.forward(prompt, 0, n_logits=20), weights != "F32")
    first = int(np.argmax(g.forward(prompt[:6], 0)[-1]))
    got = [first] + g.decode_greedy(first, 6, 16)  # one-token steps past the window
    assert_follows_greedy(c, prompt[:6], got)
    assert len(set(got)) > 2


def test_q8_experts_of_less_than_64_values_are_refused(gpu, files):
    gf = open_gguf(files("tiny-gemma4-moe", "Q8_0"))  # expert FFN 32: the int8 expert GEMV takes 64-value rows
    with pytest.raises(UnsupportedError, match="64-value groups"):
        GPUBackend(gf, build_plan(build_spec(gf)), 64)


@pytest.mark.parametrize("preset", ["tiny-gemma4-e2b", "tiny-gemma4-moe"])
def test_tiny_gemma4_batched_equals_alone_and_the_cpu_reference(gpu, files, preset):
    """Through the engine: sequences of several lengths share steps, paged, past the sliding window
    (KV-shared layers reading their source's blocks), and give the tokens each gives alone and the
    CPU reference gives."""
    from infr.engine import Model

    prompts = [list(range(1, 10)), list(range(5, 45)), [1, 2, 3], list(range(100, 130))]

    go = partial(greedy_outputs, max_new=12)

    path = files(preset)
    on_gpu = Model(path, n_ctx=64, backend="gpu", parallel=len(prompts))
    together = go(on_gpu, prompts)
    assert on_gpu.engine.stats.max_rows >= len(prompts)
    alone = [go(on_gpu, [p], cache_prompt=False)[0] for p in prompts]
    on_cpu = Model(path, n_ctx=64, backend="cpu", parallel=len(prompts))
    assert together == alone == go(on_cpu, prompts)


def test_host_experts_take_the_expert_scales(gpu, files):
    """--cpu-moe: the first MoE layer's experts on the host (infr/gpu/host_moe.py), scales included."""
    gf = open_gguf(files("tiny-gemma4-moe"))
    plan = build_plan(build_spec(gf))
    g, c = GPUBackend(gf, plan, 64, cpu_moe=1), CPUBackend(gf, plan, 64)
    assert g.host_moe == {0}
    prompt = list(range(3, 15))
    assert_logits_close(g.forward(prompt, 0, n_logits=12), c.forward(prompt, 0, n_logits=12), False)

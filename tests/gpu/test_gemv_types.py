"""The int8 GEMV (wgsl/gemv.wgsl) for every type with a reader, against the
CPU reference: matmul_input(x, qtype) @ dequantize(W).T, gguf's dequantizer,
float64 sums.

Shapes are odd: N not a multiple of the 8 rows per workgroup, T = 1..19, K of
one partial chunk (64 values: 32-value types), of chunks and a partial one
(640), of several 256-value blocks; with bias, the fused residual add, the
stacked q|k|v split (one type, and mixed as a Q4_K_M layer's Q4_K q, k with
Q6_K v), the gate||up pair with its activation (one type, and mixed). End to
end: synthetic Q4_K_M models decode greedily on the GPU as on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr.cpu import ops as F
from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import read, run, storage
from infr.models.spec import Activation
from infr.numerics import Q8_ACTIVATIONS, matmul_input

from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)

TYPES = sorted(KM.GEMV_FAMILY, key=int)
TOL = 1e-5  # of |W[r]| * |x[t]|: f32 sums in another order


def _ids(types):
    return [t.name.lower() for t in types]


def _k(q: Q, k32: int, k256: int) -> int:
    """k32 for the 32-value block types, k256 for the 256-value ones."""
    return k32 if KM.block_shape(q)[0] == 32 else k256


def _dense(t) -> np.ndarray:
    return np.asarray(dequantize(np.array(t.raw), t.qtype), np.float64).reshape(t.shape)


def _check(got: np.ndarray, x: np.ndarray, t, extra=0.0) -> None:
    W = _dense(t)
    xi = matmul_input(x, t.qtype).astype(np.float64)
    want = xi @ W.T + extra
    scale = np.linalg.norm(xi, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :] + np.abs(extra)
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    assert err < TOL, f"{t.qtype.name}: error {err:.3g}"


def test_rounded_types_are_the_gemv_types():
    """The reference rounds a matmul's input for exactly the types the GEMV multiplies in int8."""
    assert set(KM.GEMV_FAMILY) == set(Q8_ACTIVATIONS)


# (N, k32, k256, T, bias, resid)
# T past 1: a workgroup takes up to GemvTuning.NT tokens (T = 3, 5: one workgroup with idle token
# slots; T = 19: three, the last one part full)
SHAPES = [(67, 640, 768, 1, True, False), (13, 64, 256, 3, False, True), (9, 512, 512, 5, True, True),
          (11, 64, 256, 19, True, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"N{s[0]}-T{s[3]}")
@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_gemv(gpu, kernels, qtype, shape):
    N, k32, k256, T, has_bias, has_resid = shape
    K = _k(qtype, k32, k256)
    rng = np.random.default_rng([int(qtype), N, K, T])
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    resid = rng.standard_normal((T, N)).astype(np.float32) if has_resid else None
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, t, KM.upload_weight(gpu, t), storage(gpu, x), y,
                              None if bias is None else storage(gpu, bias), T,
                              resid=None if resid is None else storage(gpu, resid))
    assert [d.label.split()[0] for d in ds] == ["quantize_q8", f"gemv_{qtype.name.lower()}"]
    run(gpu, ds)
    extra = (bias if bias is not None else 0.0) + (resid if resid is not None else 0.0)
    _check(read(gpu, y, count=T * N).reshape(T, N), x, t, extra)


@pytest.mark.parametrize("ub", ["2", "4"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_batched_gemv_at_every_unroll(gpu, kernels, tune, qtype, ub):
    """Workgroups of several tokens unroll GemvTuning.UB block steps (1 by default, which test_gemv
    covers); the other unrolls the tuning takes give the same products (27 tokens: 4 token groups
    of 3 row blocks, 7 of 8 blocks)."""
    tune(INFR_GEMV_UB=ub)
    rng = np.random.default_rng([int(qtype), int(ub)])
    N, K, T = 21, 7 * 256, 27
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, t, KM.upload_weight(gpu, t), storage(gpu, x), y, None, T)
    assert [d.label.split()[0] for d in ds] == ["quantize_q8", f"gemv_{qtype.name.lower()}"]
    run(gpu, ds)
    _check(read(gpu, y, count=T * N).reshape(T, N), x, t, 0.0)


def test_gemv_chunked(gpu, kernels):
    """A Q6_K weight in row chunks (binding limit ~40 rows): one dispatch per chunk, rows from row0."""
    rng = np.random.default_rng(4)
    N, K, T = 131, 512, 2
    t = make_weight(Q.Q6_K, N, K, rng)
    rb = KM.row_bytes(Q.Q6_K, K)
    chunks = KM.upload_weight(gpu, t, max_binding=40 * rb + rb // 2)
    assert len(chunks) == 4
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    run(gpu, KM.matmul_dispatches(kernels, t, chunks, storage(gpu, x), y, storage(gpu, bias), T))
    _check(read(gpu, y, count=T * N).reshape(T, N), x, t, bias)


def test_rounding_types_off_the_layout_take_the_gemm(gpu, kernels):
    """K % 64 != 0 (Q8_0, K = 96): no GEMV layout; the f32 GEMM rounds the activations itself."""
    if Q.Q8_0 not in TYPES:
        pytest.skip("Q8_0 has no GEMV reader yet")
    rng = np.random.default_rng(5)
    t = make_weight(Q.Q8_0, 19, 96, rng)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    y = storage(gpu, np.full((2, 19), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, t, KM.upload_weight(gpu, t), storage(gpu, x), y, None, 2)
    assert [d.label.split()[0] for d in ds] == ["gemm_q8_0"]
    run(gpu, ds)
    _check(read(gpu, y, count=2 * 19).reshape(2, 19), x, t)


def _pair(gpu, kernels, qg: Q, qu: Q, N: int, K: int, T: int, act: str, seed: int):
    rng = np.random.default_rng(seed)
    wg, wu = make_weight(qg, N, K, rng), make_weight(qu, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.gate_up_dispatches(kernels, wg, wu, cg, cu, storage(gpu, x), y, act, T)
    assert ds is not None and ds[-1].label.split()[0].endswith("_gate_up")
    run(gpu, ds)
    g = matmul_input(x, qg).astype(np.float64) @ _dense(wg).T
    u = matmul_input(x, qu).astype(np.float64) @ _dense(wu).T
    want = F.gated_act(g, u, Activation(act))
    got = read(gpu, y, count=T * N).reshape(T, N)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_gate_up_pair(gpu, kernels, qtype):
    _pair(gpu, kernels, qtype, qtype, 75, _k(qtype, 640, 768), 3, "silu" if int(qtype) % 2 else "gelu", int(qtype))


@pytest.mark.parametrize("qg,qu", [(Q.Q4_K, Q.Q6_K), (Q.Q5_0, Q.Q8_0)], ids=["q4_k-q6_k", "q5_0-q8_0"])
def test_gate_up_pair_of_two_types(gpu, kernels, qg, qu):
    """Gate and up of different types still fuse (each slot takes its reader); the tiled kernels' rule does not."""
    if not {qg, qu} <= set(TYPES):
        pytest.skip("no GEMV reader for one of the types yet")
    _pair(gpu, kernels, qg, qu, 21, 256, 2, "silu", 3)
    rng = np.random.default_rng(0)
    wg, wu = make_weight(qg, 8, 256, rng), make_weight(qu, 8, 256, rng)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    assert KM.can_pair(wg, wu, cg, cu) and not KM.can_fuse_gate_up(wg, wu, cg, cu)


def _stack(gpu, kernels, types, sizes, K: int, T: int, seed: int, gemm: bool = False):
    rng = np.random.default_rng(seed)
    ts = [make_weight(q, n, K, rng) for q, n in zip(types, sizes)]
    assert KM.can_stack(ts, gpu.max_binding)
    chunks = KM.upload_stacked(gpu, ts, label="qkv")
    bias = rng.standard_normal(sum(sizes)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    ys = [storage(gpu, np.full((T, n), np.nan, np.float32)) for n in sizes]
    if gemm:
        ds = KG.stacked_gemm_dispatches(kernels, ts, chunks, storage(gpu, x), ys, storage(gpu, bias), T)
    else:
        ds = KM.stacked_dispatches(kernels, ts, chunks, storage(gpu, x), ys, storage(gpu, bias), T)
        assert len(ds) == 2 and "_stacked" in ds[1].label  # quantize, then one dispatch for every matrix
    run(gpu, ds)
    first = 0
    for t, yb, n in zip(ts, ys, sizes):
        _check(read(gpu, yb, count=T * n).reshape(T, n), x, t, bias[first : first + n])
        first += n


@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_stacked_qkv(gpu, kernels, qtype):
    _stack(gpu, kernels, [qtype] * 3, (40, 13, 13), _k(qtype, 640, 512), 2, int(qtype))


MIXED = [
    ((Q.Q4_K, Q.Q4_K, Q.Q6_K), (40, 13, 13), 512),  # a Q4_K_M layer's q, k, v
    ((Q.Q6_K, Q.Q4_K, Q.Q6_K), (13, 40, 9), 256),  # a 210-byte-block segment first
    ((Q.Q5_0, Q.Q8_0), (21, 11), 64),  # Q4_K_M's fallbacks at K % 256 != 0; one partial chunk
]


@pytest.mark.parametrize("types,sizes,K", MIXED, ids=["q4_k-q6_k", "q6_k-first", "q5_0-q8_0"])
@pytest.mark.parametrize("gemm", [False, True], ids=["gemv", "gemm"])
def test_stacked_mixed_types(gpu, kernels, types, sizes, K, gemm):
    """One GEMV dispatch over segments of different types (each workgroup team
    takes its rows' reader); the batches' GEMM runs each through a view."""
    if not set(types) <= set(TYPES):
        pytest.skip("no GEMV reader for one of the types yet")
    _stack(gpu, kernels, types, sizes, K, 3, 7, gemm=gemm)


@pytest.mark.parametrize("weight_type,n_embd,n_ff", [("Q4_K_M", 256, 512), ("Q4_K_M", 64, 128)],
                         ids=["q4_k-q6_k", "q5_0-q8_0"])
def test_q4_k_m_mix_greedy_equals_cpu(tmp_path, gpu, weight_type, n_embd, n_ff):
    """A synthetic Q4_K_M model (at n_embd 64 its fallbacks Q5_0 / Q8_0): the
    mixed q|k|v stack of the 6-bit layers runs as one GEMV, greedy decode on
    the GPU gives the CPU reference's tokens, and a 40-token prefill (the
    batched kernels, each matrix of the mixed stack on its own) its logits."""
    from closeness import assert_gpu_follows_cpu

    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = synth.preset("tiny-llama", n_layers=4, n_embd=n_embd, n_ff=n_ff, n_heads=4, n_kv_heads=2,
                        head_dim=n_embd // 4, weight_type=weight_type)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "mix.gguf"))
    types = {gf.tensor(f"blk.{i}.attn_{m}.weight").qtype for i in range(4) for m in "qv"}
    if not types <= set(TYPES):
        pytest.skip("no GEMV reader for one of the mix's types yet")
    plan = build_plan(build_spec(gf))
    gpu_be, cpu_be = GPUBackend(gf, plan, 96, dev=gpu), CPUBackend(gf, plan, 96)
    mixed = [names for names in gpu_be.stacks if KM.is_mixed([gf.tensor(n) for n in names])]
    assert mixed and len(gpu_be.stacks) == plan.spec.n_layers  # every q|k|v stacked, some of two types
    labels = [d.label for d in gpu_be._multi_step(1, False).dispatches]
    assert sum("_stacked" in lb for lb in labels) == plan.spec.n_layers
    assert not any(lb.startswith("matmul_") for lb in labels), labels  # every matrix in the int8 GEMV

    # The reference follows the GPU's tokens (this random model has near-ties: 0.013 between its
    # top two at step 9, which one reduction order of the GEMV picks one way and another the other).
    prompt = np.random.default_rng(1).integers(0, spec.n_vocab, 40).tolist()
    assert_gpu_follows_cpu(gpu_be, cpu_be, prompt, 9)

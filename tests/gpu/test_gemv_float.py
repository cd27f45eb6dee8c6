"""The float GEMV (wgsl/gemv_float.wgsl): F32, F16 and BF16 weights times f32 activations at
decode-size batches, against the CPU reference (the weights widened to float64, float64 sums).

Shapes: the Qwen3-30B-A3B router (128 x 2048 F32: teams of 256 lanes, two loads each), an odd
6 x 64 (one workgroup, rows past N and lanes past the row idle), a row longer than a team's
loads in flight (K = 2600); T = 1..4 (a workgroup takes all of them), 11 (two, the second part
full), 19 over several blocks of rows (the grid numbered token groups first); bias and the fused residual; both reductions (subgroups, shared memory); Tint compiles
every variant; a tiny MoE model's decode routes through it.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from infr.gpu import kernels_gemv_float as KGF
from infr.gpu import kernels_matmul as KM
from infr.gpu import runtime as R
from infr.gpu.runtime import read, run, storage

from test_quant_kernels import make_weight, reference  # tests/gpu is on sys.path (pytest's prepend import mode)
from test_tint import tint  # noqa: F401  the Dawn Null device (Tint)

TYPES = [Q.F32, Q.F16, Q.BF16]
TOL = 1e-5  # of |W[r]| * |x[t]|: f32 sums in another order (matmul.wgsl's bound)


def _ids(types):
    return [t.name.lower() for t in types]


def _run(gpu, kernels, q: Q, N: int, K: int, T: int, has_bias: bool, has_resid: bool, seed: int):
    rng = np.random.default_rng(seed)
    t = make_weight(q, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10, (T, 1)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    resid = rng.standard_normal((T, N)).astype(np.float32) if has_resid else None
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, t, KM.upload_weight(gpu, t), storage(gpu, x), y,
                              None if bias is None else storage(gpu, bias), T,
                              resid=None if resid is None else storage(gpu, resid))
    assert [d.label for d in ds] == [f"gemv_{q.name.lower()} {N}x{K}"]
    run(gpu, ds)
    got = read(gpu, y, count=T * N).reshape(T, N)
    W = reference(t).astype(np.float64)
    extra = (bias if bias is not None else 0.0) + (resid if resid is not None else 0.0)
    want = x.astype(np.float64) @ W.T + extra
    scale = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :] + np.abs(extra)
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    assert err < TOL, f"{q.name} {N}x{K} T={T}: error {err:.3g}"
    return ds


# (N, K, T, bias, resid)
SHAPES = [(128, 2048, 1, False, False), (128, 2048, 4, True, False), (6, 64, 1, False, False),
          (6, 64, 2, True, True), (6, 64, 3, False, True), (6, 64, 4, False, False), (9, 2600, 11, True, True),
          (37, 512, 19, False, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}-T{s[2]}")
@pytest.mark.parametrize("q", TYPES, ids=_ids(TYPES))
def test_float_gemv(gpu, kernels, q, shape):
    N, K, T, has_bias, has_resid = shape
    _run(gpu, kernels, q, N, K, T, has_bias, has_resid, int(q) * 1000 + N + T)


@pytest.mark.parametrize("q", TYPES, ids=_ids(TYPES))
def test_float_gemv_shared_memory_reduction(gpu, kernels, tune, q):
    """SG = 0 (an adapter without subgroups): the team sums by a shared-memory tree."""
    tune(INFR_GEMV_SG="0")
    for N, K, T in ((128, 2048, 1), (6, 64, 3)):
        _run(gpu, kernels, q, N, K, T, True, False, int(q) + N)


def test_router_shape_fills_the_device():
    """The 128 x 2048 F32 router: teams widen to the whole workgroup (128 workgroups, two 16-byte
    loads a lane) where 16 lanes a row and 4 rows a workgroup made 32; a large matrix keeps teams of 32."""
    rb = KM.row_bytes(Q.F32, 2048)
    assert KGF.float_gemv_team(128, rb, 1, 65535) == 256
    assert KGF.float_gemv_team(6, KM.row_bytes(Q.F32, 64), 1, 65535) == 32  # 16 loads a row: no wider
    assert KGF.float_gemv_team(4096, KM.row_bytes(Q.F16, 4096), 1, 65535) == 32
    assert KGF.float_gemv_team(128, rb, 1, 64) == 128  # never more workgroups than a dimension holds


def test_chunked_float_gemv(gpu, kernels):
    """A weight in row chunks (binding limit ~40 rows): one dispatch per chunk, each its own team."""
    rng = np.random.default_rng(9)
    N, K, T = 131, 256, 2
    t = make_weight(Q.F16, N, K, rng)
    rb = KM.row_bytes(Q.F16, K)
    chunks = KM.upload_weight(gpu, t, max_binding=40 * rb + rb // 2)
    assert len(chunks) == 4
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, t, chunks, storage(gpu, x), y, storage(gpu, bias), T)
    assert [d.label.split()[0] for d in ds] == ["gemv_f16"] * 4
    run(gpu, ds)
    want = x.astype(np.float64) @ reference(t).astype(np.float64).T + bias
    np.testing.assert_allclose(read(gpu, y, count=T * N).reshape(T, N), want, atol=1e-5 * np.abs(want).max(), rtol=0)


def test_unaligned_x_stride_keeps_the_generic_kernel(gpu, kernels):
    """x rows 66 floats apart are not 16-byte aligned: the vec4 reads of the float GEMV cannot take them."""
    rng = np.random.default_rng(3)
    N, K, T, xs = 6, 64, 2, 66
    t = make_weight(Q.F32, N, K, rng)
    x = rng.standard_normal((T, xs)).astype(np.float32)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    ds = KM.matmul_dispatches(kernels, Q.F32, KM.upload_weight(gpu, t), storage(gpu, x), y, None, K, N, T, x_stride=xs)
    assert [d.label.split()[0] for d in ds] == ["matmul_f32"]
    run(gpu, ds)
    want = x[:, :K].astype(np.float64) @ reference(t).astype(np.float64).T
    np.testing.assert_allclose(read(gpu, y, count=T * N).reshape(T, N), want, atol=1e-5 * np.abs(want).max(), rtol=0)


def test_float_gemv_passes_tint(gpu, tint):  # noqa: F811
    """Every variant the host can ask for: each type, team, token count, reduction, dense and expert."""
    errors = []
    for q in TYPES:
        for team in (32, 64, 128, 256):
            for nt, expert in ((1, False), (2, False), (8, False), (1, True)):
                for sg in (0, 8, 32):
                    code = R.dawn_source(R.load_source("gemv_float", KGF.float_gemv_consts(q, team, nt, sg, expert)))
                    try:
                        tint.create_shader_module(label="gemv_float", code=code)
                    except Exception as e:
                        errors.append(f"{q.name} team={team} nt={nt} sg={sg} expert={expert}: {e}")
    assert not errors, "\n\n".join(errors)


def test_moe_decode_routes_through_the_float_gemv(gpu, tmp_path):
    """A tiny Qwen3-MoE of Q4_K_M experts: its F32 router runs the float GEMV at decode (and no
    matrix falls back to matmul.wgsl), and the greedy tokens follow the CPU reference."""
    from closeness import assert_gpu_follows_cpu

    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    path = synth.write_gguf(synth.preset("tiny-qwen3moe", weight_type="Q4_K_M"), tmp_path / "moe.gguf")
    gf = open_gguf(path)
    assert gf.tensor("blk.0.ffn_gate_inp.weight").qtype == Q.F32
    plan = build_plan(build_spec(gf))
    gpu_be, cpu_be = GPUBackend(gf, plan, 64, dev=gpu), CPUBackend(gf, plan, 64)
    labels = [d.label for d in gpu_be._multi_step(1, False).dispatches]
    assert sum(lb.startswith("gemv_f32 ") for lb in labels) == plan.spec.n_layers, labels
    assert not any(lb.startswith("matmul_") for lb in labels), labels
    # test_moe_gpu's prompt for this model: its greedy chain moves, no row sits at a router near-tie
    assert_gpu_follows_cpu(gpu_be, cpu_be, np.random.default_rng(0).integers(0, 512, 14).tolist(), 8)

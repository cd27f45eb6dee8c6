"""The tiled GEMM (wgsl/gemm.wgsl, infr/gpu/kernels_gemm.py) against the CPU reference.

Weights come from test_quant_kernels.make_weight (valid random blocks of every
type), the oracle is gguf's dequantizer with float64 matmuls, and the
activations are the ones the reference multiplies (infr.cpu.ops.matmul_input:
Q4_K rounds them to 8 bits per 32 values, in the GEMM as in the GEMV).

Shapes are odd on purpose: N = 67 / 131 and T = 9 / 70 are not multiples of
the 64 x 64 tile (so edge tiles are partly empty), K is one or a few blocks
(for F32 / F16 / BF16 also not a multiple of the 32-value step), with bias
and the fused residual add; weights split into row chunks and the stacked
q|k|v upload; and a synthetic model whose prompt, prefilled in one batch
through the GEMM, gives the logits and greedy continuation of token-by-token
decode and of the CPU reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from closeness import assert_logits_close, assert_same_top1, rounds_activations
from gguf import GGMLQuantizationType as Q
from test_quant_kernels import TYPES, make_weight, reference  # tests/gpu is on sys.path (prepend import mode)

from infr.numerics import matmul_input
from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import read, run, storage

GEMM_TOL = 1e-5  # of |W[r]| * |x[t]|: f32 sums in another order (~1.5e-7 seen)


def _K(qtype: Q, target: int) -> int:
    """The smallest whole number of the reader's blocks holding `target` values."""
    qk = KM.block_shape(qtype)[0]
    return -(-target // qk) * qk


def _want(t, x, bias=None, resid=None) -> tuple[np.ndarray, np.ndarray]:
    """Reference output and the per-entry error scale |x[t]| * |W[n]|."""
    W = reference(t)
    xi = matmul_input(x, t.qtype).astype(np.float64)
    want = xi @ W.T
    if bias is not None:
        want = want + bias
    if resid is not None:
        want = want + resid
    return want, np.linalg.norm(xi, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]


def _check(name: str, got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> None:
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    print(f"\n[max error] {name}: {err:.3g} (tolerance {GEMM_TOL:.3g})")
    assert err < GEMM_TOL


# (K target, N, T, bias, resid). K 100 / 600: one to three blocks (K-quants one / three,
# 32-value types 4 / 19, F32 25 / 150 four-value "blocks"; F32 600 and F16 104 end mid-step).
SHAPES = [(100, 67, 9, True, False), (600, 131, 70, True, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"K{s[0]}-N{s[1]}-T{s[2]}")
@pytest.mark.parametrize("qtype", TYPES, ids=[t.name.lower() for t in TYPES])
def test_gemm_every_type(gpu, kernels, qtype, shape):
    target, N, T, has_bias, has_resid = shape
    rng = np.random.default_rng([int(qtype), target, N, T])
    K = _K(qtype, target)
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    resid = rng.standard_normal((T, N)).astype(np.float32) if has_resid else None
    y = storage(gpu, np.full((T, N), np.nan, np.float32))  # NaN: an output never written shows up
    ds = KG.gemm_dispatches(kernels, t, KM.upload_weight(gpu, t), storage(gpu, x), y,
                            storage(gpu, bias) if has_bias else None, T,
                            resid=storage(gpu, resid) if has_resid else None)
    assert [d.groups for d in ds] == [(-(-N // KG.BN), -(-T // KG.BM), 1)]
    run(gpu, ds)
    want, scale = _want(t, x, bias, resid)
    _check(f"gemm {qtype.name} K={K} N={N} T={T}", read(gpu, y, count=T * N).reshape(T, N), want, scale)


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q6_K, Q.F16])  # 22- and 210-byte blocks start off a word boundary
def test_gemm_chunked_weight_and_strides(gpu, kernels, qtype):
    """A weight split in row chunks (a forced small binding limit): one
    dispatch per chunk, each writing its own columns; x and y rows wider than
    K and N (a slice of a wider buffer), nothing written past N."""
    rng = np.random.default_rng(int(qtype))
    N, T = 150, 11
    K = _K(qtype, 512)
    t = make_weight(qtype, N, K, rng)
    chunks = KM.upload_weight(gpu, t, max_binding=KM.binding_for_rows(45, KM.row_bytes(qtype, K)))
    assert [(r0, n) for _, r0, n in chunks] == [(0, 45), (45, 45), (90, 45), (135, 15)]
    xs, ys = K + 40, N + 13
    x = rng.standard_normal((T, xs)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    resid = rng.standard_normal((T, ys)).astype(np.float32)
    y = storage(gpu, np.full((T, ys), -7.0, np.float32))
    ds = KG.gemm_dispatches(kernels, qtype, chunks, storage(gpu, x), y, storage(gpu, bias), K, N, T,
                            x_stride=xs, y_stride=ys, resid=storage(gpu, resid))
    assert len(ds) == len(chunks)
    run(gpu, ds)
    got = read(gpu, y, count=T * ys).reshape(T, ys)
    assert np.all(got[:, N:] == -7.0), "wrote past N in a row of y"
    want, scale = _want(t, x[:, :K], bias, resid[:, :N])
    _check(f"gemm chunked {qtype.name} K={K}", got[:, :N], want, scale)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0])
def test_gemm_stacked_qkv(gpu, kernels, qtype):
    """q, k, v uploaded as one stacked buffer (the decode GEMV's layout): one
    GEMM per matrix reads its rows of it, with its slice of the stacked bias."""
    rng = np.random.default_rng(3)
    K, T = 256, 19
    ts = [make_weight(qtype, n, K, rng) for n in (96, 40, 40)]
    chunks = KM.upload_stacked(gpu, ts, label="qkv")
    bias = rng.standard_normal(176).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    ys = [storage(gpu, np.full((T, int(t.shape[0])), np.nan, np.float32)) for t in ts]
    run(gpu, KG.stacked_gemm_dispatches(kernels, ts, chunks, storage(gpu, x), ys, storage(gpu, bias), T))
    first = 0
    for t, yb in zip(ts, ys):
        n = int(t.shape[0])
        want, scale = _want(t, x, bias[first : first + n])
        _check(f"gemm stacked {qtype.name} rows {first}..{first + n}", read(gpu, yb, count=T * n).reshape(T, n),
               want, scale)
        first += n


def test_gemm_threshold(tune):
    assert not KG.use_gemm(1) and KG.use_gemm(KG.GEMM_MIN_T) and not KG.use_gemm(KG.GEMM_MIN_T - 1)
    tune(INFR_GEMM_MIN_T="0")
    assert not KG.use_gemm(128)


@pytest.mark.parametrize("family,wt", [("tiny-llama", "Q4_K_M"), ("tiny-qwen2", "Q8_0")])
def test_prefill_gemm_equals_token_by_token(tmp_path, gpu, family, wt):
    """A prompt prefilled in one batch (every weight matmul through the GEMM:
    stacked q|k|v, gate and up, residual epilogues, the head) gives the
    logits of token-by-token decode (the GEMV) and of the CPU reference, and
    the CPU reference's greedy continuation. Q4_K_M mixes Q4_K and Q6_K;
    qwen2 carries q|k|v biases."""
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = synth.preset(family, n_embd=256, n_ff=512, n_heads=4, n_kv_heads=2, head_dim=64, weight_type=wt)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / f"{family}.gguf"))
    plan = build_plan(build_spec(gf))
    gpu_be, cpu_be = GPUBackend(gf, plan, 64, dev=gpu), CPUBackend(gf, plan, 64)
    prompt = [1, 17, 42, 99, 3, 250, 7, 7, 180, 64, 5, 33, 201]  # 13 >= GEMM_MIN_T, not a multiple of 8
    T = len(prompt)
    body, head, _ = gpu_be._graph(T, T)
    labels = [d.label for d in body.dispatches + head.dispatches]
    weight_ops = [lb for lb in labels if lb.startswith(("gemm_", "gemv_", "matmul_"))]
    assert weight_ops and all(lb.startswith("gemm_") for lb in weight_ops), weight_ops
    assert not any(lb.startswith("gemm_") for lb in (d.label for d in gpu_be._multi_step(1, False).dispatches))

    batch = gpu_be.forward(prompt, 0, n_logits=T)
    steps = np.stack([gpu_be.forward([tok], i)[-1] for i, tok in enumerate(prompt)])
    q8 = rounds_activations(gf, plan)
    assert_logits_close(steps, batch, q8)
    assert_same_top1(steps, batch, q8)
    assert_logits_close(batch, cpu_be.forward(prompt, 0, n_logits=T), q8)

    want, logits = [], cpu_be.forward(prompt, 0)[-1]
    for i in range(8):
        want.append(int(np.argmax(logits)))
        logits = cpu_be.forward([want[-1]], T + i)[-1]
    first = int(np.argmax(gpu_be.forward(prompt, 0)[-1]))
    assert [first] + gpu_be.decode_greedy(first, T, 7) == want

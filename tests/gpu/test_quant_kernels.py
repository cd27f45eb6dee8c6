"""The WGSL quant readers, matmul and embed kernels against gguf's own dequantizer.

Weights are random but valid: `gguf.quants.quantize` of random floats where
gguf can quantize the type, else random bytes whose f16 scale fields are
overwritten with sane values (random bits would make NaN/inf scales). Every
bit pattern of the quants then occurs. The oracle is `gguf.quants.dequantize`
(via infr.cpu.weights for the embedding), with float64 matmuls.

Shapes are odd on purpose: row counts that are not multiples of the rows per
workgroup or of the workgroup, one block and several blocks per row, Q8_0 /
Q5_0 rows that are not 4-byte aligned, T = 1 and 3, with and without bias,
and weights split into row chunks. Each test prints the max error it saw
(`pytest -s`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from infr.numerics import matmul_input
from infr.cpu.weights import dequantize_rows
from infr.gguf_file import Tensor
from infr.gpu import kernels_embed as KE
from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import Dispatch, read, render_source, run, storage

TYPES = [
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
]
QUANTIZABLE = {Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
# Byte offsets of the f16 scale fields inside one block (ggml's block structs).
F16_FIELDS = {
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
}
MATMUL_TOL = 1e-5  # of |W[r]| * |x[t]|: f32 sums in another order (~1e-7 seen), far below any decode error


def _ids(types):
    return [t.name.lower() for t in types]


def make_weight(qtype: Q, N: int, K: int, rng: np.random.Generator) -> Tensor:
    """A random [N, K] tensor of `qtype` in GGUF byte layout."""
    values = rng.standard_normal((N, K)).astype(np.float32)
    if qtype == Q.F32:
        raw = values
    elif qtype == Q.F16:
        raw = values.astype(np.float16)
    elif qtype in QUANTIZABLE:
        raw = quantize(values, qtype)
    else:
        qk, nbytes = KM.block_shape(qtype)
        blocks = rng.integers(0, 256, (N * K // qk, nbytes), dtype=np.uint8)
        for off in F16_FIELDS[qtype]:
            # Magnitudes 1e-3..1e-1 with either sign: normal f16, never NaN or inf.
            d = (rng.uniform(1e-3, 1e-1, len(blocks)) * rng.choice([-1, 1], len(blocks))).astype(np.float16)
            blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
        raw = blocks.reshape(N, -1)
    return Tensor(name=f"w_{qtype.name.lower()}", qtype=qtype, shape=(N, K), raw=raw)


def reference(t: Tensor) -> np.ndarray:
    return np.asarray(dequantize(t.raw, t.qtype), np.float64).reshape(t.shape)


def _report(name: str, err: float, tol: float) -> None:
    print(f"\n[max error] {name}: {err:.3g} (tolerance {tol:.3g})")


# --- block_value -----------------------------------------------------------------------------

_BLOCK_VALUE_KERNEL = """
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
var<private> x: array<f32, 4>;  // block_dot's input; unused here

// #include quant_common
// #include quant_{{QTYPE}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < {{COUNT}}u) {
        out[i] = block_value((i / QK) * BLOCK_BYTES, i % QK);
    }
}
"""


@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_block_value(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    qk, _ = KM.block_shape(qtype)
    # An odd number of blocks, back to back: for 18/22/34/110/210-byte blocks
    # every other block starts off a 4-byte boundary.
    t = make_weight(qtype, 1, qk * 7, rng)
    count = t.shape[1]
    src = render_source(_BLOCK_VALUE_KERNEL, {"QTYPE": KM.wgsl_name(qtype), "COUNT": count})
    module = gpu.device.create_shader_module(code=src)
    pipe = gpu.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    w = storage(gpu, np.ascontiguousarray(t.raw).view(np.uint8).reshape(-1))
    out = storage(gpu, count * 4)
    bind = gpu.device.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[{"binding": 0, "resource": {"buffer": w}}, {"binding": 1, "resource": {"buffer": out}}],
    )
    run(gpu, [Dispatch(pipe, bind, (-(-count // 64), 1, 1))])
    got = read(gpu, out, count=count)
    want = reference(t).reshape(-1)
    # Each value is a product of two or three f32 factors (minus a min): a few ulps.
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    _report(f"block_value {qtype.name}", err, 1e-6)
    assert err < 1e-6


# --- matmul ----------------------------------------------------------------------------------


def _blocks_for(qtype: Q) -> int:
    return KM.block_shape(qtype)[0]


# (blocks per row, N, T, bias). 37 blocks is more than a row's team of threads
# (WG / ROWS_PER_WG = 16), so threads loop over several blocks.
MATMUL_SHAPES = [(1, 67, 1, False), (3, 131, 3, True), (5, 67, 3, False), (2, 131, 1, True), (37, 67, 3, True)]


def _matmul(kernels, t: Tensor, chunks, x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    gpu = kernels.dev
    N = t.shape[0]
    T = x.shape[0]
    y = storage(gpu, np.full((T, N), np.nan, np.float32))  # NaN: a row never written shows up
    b = storage(gpu, bias) if bias is not None else None
    ds = KM.matmul_dispatches(kernels, t, chunks, storage(gpu, x), y, b, T)
    assert len([d for d in ds if not d.label.startswith("quantize")]) == len(chunks)
    run(gpu, ds)
    return read(gpu, y, count=T * N).reshape(T, N)


def _check_matmul(name: str, got: np.ndarray, t: Tensor, x: np.ndarray, bias) -> None:
    W = reference(t)
    x = matmul_input(x, t.qtype)  # Q4_K: the 8-bit activations the kernel multiplies
    want = x.astype(np.float64) @ W.T + (bias if bias is not None else 0.0)
    scale = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want) / scale))
    _report(name, err, MATMUL_TOL)
    assert err < MATMUL_TOL


@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=lambda s: f"b{s[0]}-N{s[1]}-T{s[2]}{'-bias' if s[3] else ''}")
@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_matmul(gpu, kernels, qtype, shape):
    nblocks, N, T, has_bias = shape
    rng = np.random.default_rng([int(qtype), nblocks, N, T])
    K = nblocks * _blocks_for(qtype)
    t = make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    chunks = KM.upload_weight(gpu, t)
    assert [(r0, n) for _, r0, n in chunks] == [(0, N)]
    got = _matmul(kernels, t, chunks, x, bias)
    _check_matmul(f"matmul {qtype.name} K={K} N={N} T={T} bias={has_bias}", got, t, x, bias)


def test_matmul_unaligned_rows(gpu, kernels):
    """Q8_0 rows of 3 blocks are 102 bytes, Q5_0 rows 66: most rows start off a word boundary."""
    rng = np.random.default_rng(7)
    for qtype in (Q.Q8_0, Q.Q5_0):
        t = make_weight(qtype, 67, 96, rng)
        assert KM.row_bytes(qtype, 96) % 4 != 0
        x = rng.standard_normal((3, 96)).astype(np.float32)
        got = _matmul(kernels, t, KM.upload_weight(gpu, t), x, None)
        _check_matmul(f"matmul unaligned {qtype.name} K=96", got, t, x, None)


def test_matmul_strides(gpu, kernels):
    """x and y rows wider than K and N (a slice of a wider activation buffer)."""
    rng = np.random.default_rng(11)
    t = make_weight(Q.Q4_K, 67, 512, rng)
    T, xs, ys = 3, 600, 80
    x = rng.standard_normal((T, xs)).astype(np.float32)
    y = storage(gpu, np.full((T, ys), -7.0, np.float32))
    ds = KM.matmul_dispatches(kernels, Q.Q4_K, KM.upload_weight(gpu, t), storage(gpu, x), y, None, 512, 67, T,
                              x_stride=xs, y_stride=ys)
    run(gpu, ds)
    got = read(gpu, y, count=T * ys).reshape(T, ys)
    assert np.all(got[:, 67:] == -7.0), "wrote past N in a row of y"
    _check_matmul("matmul strided Q4_K", got[:, :67], t, x[:, :512], None)


# --- embed -----------------------------------------------------------------------------------


def _embed(kernels, t: Tensor, chunks, ids: np.ndarray, scale: float, reverse: bool = False) -> np.ndarray:
    gpu = kernels.dev
    K = t.shape[1]
    T = len(ids)
    y = storage(gpu, np.full((T, K), np.nan, np.float32))
    ds = KE.embed_dispatches(kernels, t, chunks, storage(gpu, ids.astype(np.uint32)), y, scale, T)
    assert len(ds) == len(chunks)
    run(gpu, ds[::-1] if reverse else ds)
    return read(gpu, y, count=T * K).reshape(T, K)


def _check_embed(name: str, got: np.ndarray, t: Tensor, ids: np.ndarray, scale: float) -> None:
    want = dequantize_rows(t, ids).astype(np.float64) * scale
    assert not np.isnan(got).any(), "some outputs were never written"
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    _report(name, err, 1e-6)
    assert err < 1e-6


@pytest.mark.parametrize("qtype", TYPES, ids=_ids(TYPES))
def test_embed(gpu, kernels, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    N, K = 67, 3 * _blocks_for(qtype)
    t = make_weight(qtype, N, K, rng)
    ids = np.concatenate([[0, N - 1], rng.integers(0, N, 4), [N - 1]])
    got = _embed(kernels, t, KM.upload_weight(gpu, t), ids, 1.75)
    _check_embed(f"embed {qtype.name} K={K}", got, t, ids, 1.75)


# --- chunked weights -------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.F16], ids=_ids([Q.Q8_0, Q.Q4_K, Q.F16]))
def test_chunked(gpu, kernels, qtype):
    """A binding limit of ~40 rows splits a 131-row weight into 4 chunks."""
    rng = np.random.default_rng(200 + int(qtype))
    N, K, T = 131, 3 * _blocks_for(qtype), 3
    t = make_weight(qtype, N, K, rng)
    rb = KM.row_bytes(qtype, K)
    chunks = KM.upload_weight(gpu, t, max_binding=40 * rb + rb // 2)
    assert [(r0, n) for _, r0, n in chunks] == [(0, 40), (40, 40), (80, 40), (120, 11)]
    x = rng.standard_normal((T, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    _check_matmul(f"matmul chunked {qtype.name}", _matmul(kernels, t, chunks, x, bias), t, x, bias)
    ids = np.array([0, 39, 40, 79, 80, 119, 120, N - 1, 57])
    # Both orders: a chunk must write exactly its own ids, so no order can let
    # a later dispatch overwrite (or an earlier one hide) a neighbour's rows.
    for reverse in (False, True):
        got = _embed(kernels, t, chunks, ids, 0.5, reverse)
        _check_embed(f"embed chunked {qtype.name} reverse={reverse}", got, t, ids, 0.5)


def test_chunk_rows_fit_one_dispatch(gpu, kernels):
    """A chunk never needs more workgroups than one dispatch dimension allows."""
    limits = dict(gpu.limits, **{"max-compute-workgroups-per-dimension": 8})
    small = dataclasses.replace(gpu, limits=limits)
    rng = np.random.default_rng(5)
    t = make_weight(Q.Q4_0, 75, 64, rng)
    chunks = KM.upload_weight(small, t)
    per = 8 * KM.rows_per_workgroup(Q.Q4_0)
    assert [(r0, n) for _, r0, n in chunks] == [(r, min(per, 75 - r)) for r in range(0, 75, per)]
    x = rng.standard_normal((1, 64)).astype(np.float32)
    _check_matmul("matmul row-capped chunks Q4_0", _matmul(kernels, t, chunks, x, None), t, x, None)


def test_upload_rejects_partial_blocks(gpu):
    from infr.errors import UnsupportedError

    t = Tensor(name="odd", qtype=Q.F16, shape=(4, 12), raw=np.zeros((4, 12), np.float16))
    with pytest.raises(UnsupportedError):
        KM.upload_weight(gpu, t)


# --- real weights ----------------------------------------------------------------------------


def test_real_model_weights(gpu, kernels, gemma3_path):
    """Every quant type of a real model, and its 262k-row Q8_0 embedding table
    (178 MB: more than lavapipe's 128 MiB binding, so it comes in chunks)."""
    from infr.gguf_file import open_gguf

    gf = open_gguf(gemma3_path)
    rng = np.random.default_rng(3)
    picked: dict[Q, str] = {}
    for name, t in gf.tensors.items():
        if len(t.shape) == 2 and t.qtype not in picked:
            picked[t.qtype] = name
    names = sorted(set(picked.values()) | {"token_embd.weight"})
    for name in names:
        t = gf.tensor(name)
        N, K = t.shape
        chunks = KM.upload_weight(gpu, t)
        # Whole rows, in order, each chunk within one binding.
        assert [r0 for _, r0, _ in chunks] == list(np.cumsum([0] + [n for _, _, n in chunks[:-1]]))
        assert sum(n for _, _, n in chunks) == N
        assert all(buf.size <= gpu.max_binding for buf, _, _ in chunks)
        bounds = {0, N - 1} | {r0 for _, r0, _ in chunks} | {r0 - 1 for _, r0, _ in chunks if r0}
        rows = np.array(sorted(bounds | set(rng.integers(0, N, 200).tolist())))
        W = dequantize_rows(t, rows).astype(np.float64)

        T = 2
        x = rng.standard_normal((T, K)).astype(np.float32)
        y = storage(gpu, T * N * 4)
        run(gpu, KM.matmul_dispatches(kernels, t, chunks, storage(gpu, x), y, None, T))
        got = read(gpu, y, count=T * N).reshape(T, N)[:, rows]
        scale = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]
        err = float(np.max(np.abs(got - matmul_input(x, t.qtype) @ W.T) / scale))
        _report(f"real matmul {name} {t.qtype.name} [{N}x{K}] in {len(chunks)} chunk(s)", err, MATMUL_TOL)
        assert err < MATMUL_TOL

        ids = rows[rng.permutation(len(rows))[:16]]
        emb = _embed(kernels, t, chunks, ids, 1.0)
        want = dequantize_rows(t, ids).astype(np.float64)
        err = float(np.max(np.abs(emb - want)) / np.max(np.abs(want)))
        _report(f"real embed {name} {t.qtype.name}", err, 1e-6)
        assert err < 1e-6

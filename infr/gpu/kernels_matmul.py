"""Weights on the GPU and the prebuilt dispatches of the GEMV/GEMM and embedding kernels.

Weights are uploaded once, in their GGUF block layout (never expanded), as a
list of row chunks: a chunk holds whole rows, fits one storage binding and has
few enough rows that `ceil(rows / ROWS_PER_WG)` workgroups fit one dispatch
dimension. The matmul of a chunked weight is one dispatch per chunk, each
writing its own column range of `y`; the embedding lookup is one dispatch per
chunk, each writing the tokens whose id falls inside it. See docs/gpu_kernels.md.

Params packers return the exact bytes of the WGSL `Params` struct: fields in
declaration order, u32 / f32 little-endian, zero-padded to a multiple of 16.
"""

from __future__ import annotations

import weakref

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from infr.errors import UnsupportedError
from infr.gpu.device import Device
from infr.gpu.runtime import Dispatch, Kernels, storage

# Types with a wgsl/quant_TYPE.wgsl reader.
GPU_TYPES = frozenset(
    {
        Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
        Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
    }
)
# The float readers decode a few values per call (one 16-byte load), not one;
# their QK differs from ggml's block size of 1. Must match the WGSL constants.
_FLOAT_BLOCKS = {Q.F32: (4, 16), Q.F16: (8, 16), Q.BF16: (8, 16)}

MATMUL_WG = 64
EMBED_WG = 64  # embed.wgsl's @workgroup_size
# Rows per matmul workgroup. With 64 threads that is a team of 16 per row: a
# 1024-wide Q4_K row is 4 blocks, a 4096-wide one 16, so teams stay busy on
# the short rows of small models without idling on long ones.
_ROWS_PER_WG = 4


def as_qtype(qtype) -> Q:
    """GGMLQuantizationType from the enum, its name ("q4_k", "Q4_K") or its number."""
    if isinstance(qtype, Q):
        q = qtype
    elif isinstance(qtype, str):
        try:
            q = Q[qtype.upper()]
        except KeyError:
            raise UnsupportedError(f"unknown quantization type {qtype!r}") from None
    else:
        q = Q(int(qtype))
    if q not in GPU_TYPES:
        names = ", ".join(sorted(t.name for t in GPU_TYPES))
        raise UnsupportedError(f"no GPU kernel for {q.name} weights; supported: {names}")
    return q


def wgsl_name(qtype) -> str:
    return as_qtype(qtype).name.lower()


def block_shape(qtype) -> tuple[int, int]:
    """(values per block, bytes per block) as the WGSL reader defines QK and BLOCK_BYTES."""
    q = as_qtype(qtype)
    return _FLOAT_BLOCKS.get(q) or tuple(GGML_QUANT_SIZES[q])


def row_bytes(qtype, K: int) -> int:
    qk, nbytes = block_shape(qtype)
    if K % qk:
        raise UnsupportedError(f"{as_qtype(qtype).name} rows of {K} values are not whole blocks of {qk}")
    return K // qk * nbytes


# Types with a coalesced kernel (wgsl/gemv_TYPE.wgsl) -> the K multiple it needs.
_COALESCED = {Q.Q4_K: 256}
COALESCED_THREADS = 256  # per workgroup; two rows per 32-lane team measured slower on the H200


def coalesced_lanes() -> int:
    """Invocations per row (INFR_GEMV_LANES, 32 or 64): more lanes, more loads in flight."""
    import os

    lanes = int(os.environ.get("INFR_GEMV_LANES", "32"))
    if lanes not in (32, 64):
        raise ValueError(f"INFR_GEMV_LANES must be 32 or 64, got {lanes}")
    return lanes


def rows_per_workgroup(qtype) -> int:
    as_qtype(qtype)
    return _ROWS_PER_WG


def _pack(fields: list[tuple[str, str, object]]) -> np.ndarray:
    dt = np.dtype([(name, "<u4" if kind == "u32" else "<f4") for name, kind, _ in fields])
    rec = np.zeros(1, dt)
    for name, _, value in fields:
        rec[name] = value
    raw = rec.tobytes()
    return np.frombuffer(raw + b"\0" * (-len(raw) % 16), np.uint8)


def params_matmul(
    K: int, N: int, row0: int, row_bytes: int, x_stride: int, y_stride: int, has_bias: bool, T: int,
    has_resid: bool = False,
) -> np.ndarray:
    """matmul.wgsl Params; N is the chunk's row count, row0 its first global row."""
    return _pack([
        ("K", "u32", K), ("N", "u32", N), ("row0", "u32", row0), ("row_bytes", "u32", row_bytes),
        ("x_stride", "u32", x_stride), ("y_stride", "u32", y_stride), ("has_bias", "u32", int(has_bias)),
        ("T", "u32", T), ("has_resid", "u32", int(has_resid)),
    ])


def params_embed(K: int, rows: int, row0: int, row_bytes: int, scale: float, T: int) -> np.ndarray:
    return _pack([
        ("K", "u32", K), ("rows", "u32", rows), ("row0", "u32", row0), ("row_bytes", "u32", row_bytes),
        ("scale", "f32", scale), ("T", "u32", T),
    ])


def _max_groups(dev: Device) -> int:
    return int(dev.limits.get("max-compute-workgroups-per-dimension", 65535))


def upload_weight(dev: Device, tensor, max_binding: int | None = None, label: str | None = None) -> list[tuple]:
    """Upload a [N, K] matrix's raw GGUF bytes as row chunks: [(buffer, row0, rows)].

    A chunk is at most `max_binding` bytes (default: the device's storage
    binding limit) and at most max-workgroups × ROWS_PER_WG rows; each buffer
    is zero-padded to a multiple of 4 bytes (storage() pads to 16).
    """
    q = as_qtype(tensor.qtype)
    N, K = int(tensor.shape[0]), int(tensor.shape[-1])
    rb = row_bytes(q, K)
    raw = np.ascontiguousarray(tensor.raw).view(np.uint8).reshape(N, -1)
    if raw.shape[1] != rb:
        raise UnsupportedError(f"{tensor.name}: rows of {raw.shape[1]} bytes, expected {rb} for {q.name}")
    limit = dev.max_binding if max_binding is None else int(max_binding)
    per_chunk = min(limit // rb, _max_groups(dev) * rows_per_workgroup(q))
    if per_chunk < 1:
        raise UnsupportedError(f"{tensor.name}: one row ({rb} bytes) exceeds the storage binding limit {limit}")
    chunks = []
    name = label or getattr(tensor, "name", "weight")
    for row0 in range(0, N, per_chunk):
        rows = min(per_chunk, N - row0)
        buf = storage(dev, raw[row0 : row0 + rows].reshape(-1), label=f"{name}[{row0}:{row0 + rows}]")
        chunks.append((buf, row0, rows))
    return chunks


_dummies: weakref.WeakKeyDictionary[Kernels, object] = weakref.WeakKeyDictionary()


def _no_bias(kernels: Kernels):
    """Bound in place of a missing bias (layout="auto" needs every binding; has_bias=0 skips reads)."""
    buf = _dummies.get(kernels)
    if buf is None:
        buf = _dummies[kernels] = storage(kernels.dev, np.zeros(4, np.float32), label="no_bias")
    return buf


def _weight_shape(w, dims: tuple) -> tuple[Q, tuple]:
    """Accept a Tensor (its qtype and shape) or a bare qtype whose shape comes in `dims`."""
    if hasattr(w, "qtype") and hasattr(w, "shape"):
        return as_qtype(w.qtype), (int(w.shape[-1]), int(w.shape[0])) + tuple(dims)
    return as_qtype(w), tuple(dims)


def matmul_dispatches(
    kernels: Kernels, w, chunks, x, y, bias, *dims: int,
    x_stride: int | None = None, y_stride: int | None = None, wg: int = MATMUL_WG, resid=None,
) -> list[Dispatch]:
    """Dispatches for y[t] = W @ x[t] (+ bias), one per weight chunk.

    `matmul_dispatches(kernels, tensor, chunks, x, y, bias, T)` or
    `matmul_dispatches(kernels, qtype, chunks, x, y, bias, K, N, T)`; `chunks`
    is upload_weight's list, `bias` a buffer of N floats or None, `resid` a
    buffer laid out like y added in the epilogue (a fused residual add; it
    must not be y itself). Strides are in floats and default to K (x) and N (y).
    """
    q, shape = _weight_shape(w, dims)
    if len(shape) != 3:
        raise TypeError("matmul_dispatches needs T (with a tensor) or K, N, T (with a qtype)")
    K, N, T = shape
    rows_wg = rows_per_workgroup(q)
    team = wg // rows_wg
    if wg % rows_wg or team & (team - 1):
        raise ValueError(f"matmul WG={wg} must be {rows_wg} x a power of two")
    if sum(rows for _, _, rows in chunks) != N:
        raise ValueError(f"weight chunks hold {sum(r for _, _, r in chunks)} rows, expected {N}")
    rb = row_bytes(q, K)
    if q in _COALESCED and K % _COALESCED[q] == 0:  # a team of lanes reads each block together
        lanes = coalesced_lanes()
        rows_wg = COALESCED_THREADS // lanes
        pipe = kernels.pipeline(f"gemv_{wgsl_name(q)}", "main", ROWS=rows_wg, LANES=lanes)
        label = f"gemv_{wgsl_name(q)}"
    else:
        pipe = kernels.pipeline("matmul", "main", QTYPE=wgsl_name(q), WG=wg, ROWS=rows_wg)
        label = f"matmul_{wgsl_name(q)}"
    b = bias if bias is not None else _no_bias(kernels)
    out = []
    for buf, row0, rows in chunks:
        data = params_matmul(K, rows, row0, rb, x_stride or K, y_stride or N, bias is not None, T, resid is not None)
        p = storage(kernels.dev, data, label="matmul.params", uniform=True)
        groups = (-(-rows // rows_wg), T, 1)
        r = resid if resid is not None else _no_bias(kernels)
        out.append(Dispatch(pipe, kernels.bind(pipe, [p, buf, x, y, b, r]), groups, label))
    return out


def embed_dispatches(kernels: Kernels, w, chunks, ids, y, scale: float, T: int, K: int | None = None) -> list[Dispatch]:
    """Dispatches for y[t] = W[ids[t]] * scale, one per table chunk.

    `w` is the table's Tensor, or its qtype with the row width given as K.
    """
    if hasattr(w, "qtype") and hasattr(w, "shape"):
        q, K = as_qtype(w.qtype), int(w.shape[-1])
    else:
        q = as_qtype(w)
        if K is None:
            raise TypeError("embed_dispatches needs K with a bare qtype")
    rb = row_bytes(q, K)
    pipe = kernels.pipeline("embed", "main", QTYPE=wgsl_name(q))
    out = []
    for buf, row0, rows in chunks:
        p = storage(kernels.dev, params_embed(K, rows, row0, rb, scale, T), label="embed.params", uniform=True)
        groups = (-(-K // EMBED_WG), T, 1)
        out.append(Dispatch(pipe, kernels.bind(pipe, [p, buf, ids, y]), groups, f"embed_{wgsl_name(q)}"))
    return out

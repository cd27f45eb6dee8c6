"""The tiled GEMM (wgsl/gemm.wgsl) for batches of tokens: pipelines and dispatches.

The GEMV kernels (kernels_matmul) read every weight once per token: a batch
of T tokens re-reads the whole model T times. The GEMM stages 64 weight rows
× 32 values in workgroup memory and reuses them for 64 tokens, so a prefill
reads the weights ceil(T / 64) times. Weights are the same uploads the GEMV
uses (row chunks of upload_weight, or the stacked q|k|v buffer), read in
their GGUF blocks.

When the backend takes the GEMM: batches of T >= GEMM_MIN_T tokens. Below
that the GEMV is the better kernel: its re-reads of a 4- or 8-token batch
mostly hit the cache, while the GEMM's 64-token tile would be at most 1/8
busy and its shared-memory staging costs a barrier per 32 values of K. At 8
tokens the GEMM already reads the weights 8x less often than the GEMV's
worst case, and decode (T = 1) and short speculative batches keep the GEMV.
INFR_GEMM_MIN_T overrides it (for measuring; 0 disables the GEMM).
"""

from __future__ import annotations

from infr.numerics import Q8_ACTIVATIONS
from infr.gpu import kernels_matmul as KM
from infr.gpu import tuning as TU
from infr.gpu.runtime import Dispatch, Kernels, storage

GEMM_MIN_T = 8
BM = 64  # tokens per workgroup tile (gemm.wgsl)
BN = 64  # weight rows per workgroup tile


def min_tokens() -> int:
    """The smallest batch the backend runs through the GEMM (INFR_GEMM_MIN_T, 0 there: never)."""
    v = TU.current().gemm_min_t
    return GEMM_MIN_T if v is None else v


def use_gemm(T: int, dev=None) -> bool:
    """Whether a batch of T tokens runs the GEMM on device `dev`. On GPUs the
    batched GEMV stays the default until the GEMM is tuned: on the H200 this
    f32 GEMM gave pp512 115 t/s on the Llama-3.1-8B shape against the GEMV's
    247 (perf/h200/compare-2026-12-01.json), while on lavapipe it wins (Q4_K
    1024x1024, T = 64: 154 vs 260 ms). INFR_GEMM_MIN_T set: that rule everywhere."""
    if dev is not None and not getattr(dev, "is_cpu", False) and TU.current().gemm_min_t is None:
        return False
    return T >= min_tokens()


def gemm_pipeline(kernels: Kernels, qtype):
    q = KM.as_qtype(qtype)
    return kernels.pipeline("gemm", "main", QTYPE=KM.wgsl_name(q), Q8X=str(q in Q8_ACTIVATIONS).lower())


def params_gemm(
    K: int, N: int, wrow0: int, ycol0: int, row_bytes: int, x_stride: int, y_stride: int,
    has_bias: bool, T: int, has_resid: bool, bias0: int,
):
    """gemm.wgsl Params (field order of the WGSL struct)."""
    return KM.pack_params([
        ("K", "u32", K), ("N", "u32", N), ("wrow0", "u32", wrow0), ("ycol0", "u32", ycol0),
        ("row_bytes", "u32", row_bytes), ("x_stride", "u32", x_stride), ("y_stride", "u32", y_stride),
        ("has_bias", "u32", int(has_bias)), ("T", "u32", T), ("has_resid", "u32", int(has_resid)),
        ("bias0", "u32", bias0),
    ])


def _one(kernels: Kernels, q, buf, K: int, rows: int, wrow0: int, ycol0: int, x, y, bias, bias0: int,
         T: int, x_stride: int, y_stride: int, resid, label: str) -> Dispatch:
    pipe = gemm_pipeline(kernels, q)
    rb = KM.row_bytes(q, K)
    none = KM._no_bias(kernels)
    data = params_gemm(K, rows, wrow0, ycol0, rb, x_stride, y_stride, bias is not None, T, resid is not None, bias0)
    p = storage(kernels.dev, data, label="gemm.params", uniform=True)
    bind = kernels.bind(pipe, [p, buf, x, y, bias if bias is not None else none, resid if resid is not None else none])
    groups = (-(-rows // BN), -(-T // BM), 1)
    return Dispatch(pipe, bind, groups, label, -(-T // BM) * rows * rb)


def gemm_dispatches(
    kernels: Kernels, w, chunks, x, y, bias, *dims: int,
    x_stride: int | None = None, y_stride: int | None = None, resid=None,
) -> list[Dispatch]:
    """y[t] = W @ x[t] (+ bias) (+ resid[t]) for t < T, one dispatch per weight chunk.

    Called like kernels_matmul.matmul_dispatches: `(kernels, tensor, chunks,
    x, y, bias, T)` or `(kernels, qtype, chunks, x, y, bias, K, N, T)`.
    `resid` is laid out like y and must not be y itself.
    """
    q, shape = KM._weight_shape(w, dims)
    if len(shape) != 3:
        raise TypeError("gemm_dispatches needs T (with a tensor) or K, N, T (with a qtype)")
    K, N, T = shape
    if sum(rows for _, _, rows in chunks) != N:
        raise ValueError(f"weight chunks hold {sum(r for _, _, r in chunks)} rows, expected {N}")
    label = f"gemm_{KM.wgsl_name(q)} {N}x{K}"
    return [
        _one(kernels, q, buf, K, rows, 0, row0, x, y, bias, row0, T, x_stride or K, y_stride or N, resid, label)
        for buf, row0, rows in chunks
    ]


def stacked_gemm_dispatches(kernels: Kernels, tensors, chunks, x, ys, bias, T: int) -> list[Dispatch]:
    """ys[i][t] = W_i @ x[t] (+ bias) for matrices uploaded stacked
    (kernels_matmul.upload_stacked): one GEMM per matrix, each reading its rows
    of the one buffer (a mixed stack's through a view of its own); `bias`
    holds every matrix's rows (or is None)."""
    K = int(tensors[0].shape[-1])
    mixed = KM.is_mixed(tensors)
    parts = KM.stack_parts(tensors, chunks) if mixed else [chunks] * len(tensors)
    out, first = [], 0
    for t, y, part in zip(tensors, ys, parts):
        q, n = KM.as_qtype(t.qtype), int(t.shape[0])
        (buf, _, _), = part
        wrow0 = 0 if mixed else first
        out.append(_one(kernels, q, buf, K, n, wrow0, 0, x, y, bias, first, T, K, n, None,
                        f"gemm_{KM.wgsl_name(q)}_stacked {n}x{K}"))
        first += n
    return out

"""Quantized weights times 8-bit activations by integer sums: a row's result alone or in any batch.

A matmul whose input is rounded to 8 bits (MatMul.q8) multiplies, per 32-value sub-block, the
activation's integer q with the weight block's integer lanes, as the GPU's int8 kernels do
(wgsl/gemm_mmq.wgsl's header has the per-type terms):

    y[t, n] = sum over groups g of  d[t, g] * (a[g, n] * isum[g, t, n])  +  sum over blocks b of  s[t, b] * m[b, n]

isum: the exact sum of a group's integer products; a: the weight group's scale (d, or d * sc of a
K-quant); m: the weight's min term (Q4_1, Q5_1, Q4_K, Q5_K: value = a q + m); d, s: the activation
block's scale and d * sum(q) (infr.numerics.quantize_q8). Groups are the 32-value sub-blocks, or
Q6_K's 16 values (d then is the 32-value block's).

Why it is independent of the batch: the lanes and activation q are small integers held in float32,
and a group's 32 products and every partial sum stay below 2^24, so BLAS's sums of them are exact
whatever its blocking, for any number of rows (one batched sgemm over the groups computes isum of
every row at once and reads each weight once). The floating-point steps after it are elementwise
(a * isum), or per-row products of fixed shapes, [1, groups] @ [groups, span of N] (BLAS calls per
row, the same call whatever the batch), so a row's float sums run in one order alone or batched.

The lanes are cached at load as float32 [groups, G, N] (as large as the dequantized float32 matrix)
with a and m as float32 [groups, N].
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from infr.cpu import dequant as D
from infr.numerics import INFR, q8_parts

F32 = np.float32


@dataclass(frozen=True)
class Lanes:
    q: np.ndarray  # float32 [groups, G, N]: the weight's integer lanes, group by group (B of X_g @ q[g])
    a: np.ndarray  # float32 [groups, N]: each group's scale
    m: np.ndarray | None  # float32 [K / 32, N]: the min term per 32-value block (value = a q + m), or None
    group: int  # values per group: 32, or 16 (Q6_K)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.a.nbytes + (0 if self.m is None else self.m.nbytes)


# --- per type: a chunk of blocks -> (lanes [C, block] uint8/int8, a [C, block / G], m [C, block / 32] | None)


def _q4_0(blocks):
    s = blocks.reshape(-1).view(D._Q4_0)
    q = D._nibbles32(s)
    q -= np.uint8(8)
    return q.view(np.int8), D._scale(s), None


def _q4_1(blocks):
    s = blocks.reshape(-1).view(D._Q4_1)
    return D._nibbles32(s), D._scale(s), D._scale(s, "m")


def _q5_0(blocks):
    s = blocks.reshape(-1).view(D._Q5_0)
    q = D._nibbles32(s)
    q.view(np.uint64)[...] |= D._high_bits(blocks[:, 2:6])
    q -= np.uint8(16)
    return q.view(np.int8), D._scale(s), None


def _q5_1(blocks):
    s = blocks.reshape(-1).view(D._Q5_1)
    q = D._nibbles32(s)
    q.view(np.uint64)[...] |= D._high_bits(blocks[:, 4:8])
    return q, D._scale(s), D._scale(s, "m")


def _q8_0(blocks):
    s = blocks.reshape(-1).view(D._Q8_0)
    return blocks[:, 2:].view(np.int8), D._scale(s), None


def _q4_k(blocks):
    s = blocks.reshape(-1).view(D._Q4_K)
    dl, ml = D._k_scales(blocks, s)
    n = len(blocks)
    q = D._k_nibbles(s["q"]).view(np.uint8).reshape(n, 256)
    return q, dl.reshape(n, 8), -ml.reshape(n, 8)


def _q5_k(blocks):
    s = blocks.reshape(-1).view(D._Q5_K)
    dl, ml = D._k_scales(blocks, s)
    n = len(blocks)
    q = D._k_nibbles(s["q"]).reshape(n, 8, 4)
    h = s["qh"][:, None, :] >> D._BIT_SHIFTS[None, :, None]
    h &= D._LOW_BITS
    h <<= D._FOUR
    q |= h
    return q.view(np.uint8).reshape(n, 256), dl.reshape(n, 8), -ml.reshape(n, 8)


def _q6_k(blocks):
    n = len(blocks)
    s = blocks.reshape(-1).view(D._Q6_K)
    ql = s["ql"].reshape(n, 2, 1, 8)
    q = np.empty((n, 2, 2, 8), np.uint64)
    np.bitwise_and(ql[:, :, 0], D._NIBBLES, out=q[:, :, 0])
    np.right_shift(ql[:, :, 0], D._FOUR, out=q[:, :, 1])
    q[:, :, 1] &= D._NIBBLES
    h = s["qh"].reshape(n, 2, 1, 4) >> D._PAIR_SHIFTS[None, None, :, None]
    h &= D._LOW_2BITS
    h <<= D._FOUR
    q |= h.reshape(q.shape)
    qb = q.view(np.uint8)
    qb -= np.uint8(32)
    dl = D._scale(s) * blocks[:, 192:208].view(np.int8).astype(F32)
    return qb.view(np.int8).reshape(n, 256), dl, None


_KERNELS = {
    Q.Q4_0: (_q4_0, 32), Q.Q4_1: (_q4_1, 32), Q.Q5_0: (_q5_0, 32), Q.Q5_1: (_q5_1, 32), Q.Q8_0: (_q8_0, 32),
    Q.Q4_K: (_q4_k, 32), Q.Q5_K: (_q5_k, 32), Q.Q6_K: (_q6_k, 16),
} if sys.byteorder == "little" else {}  # fmt: skip  (dequant's word tricks assume little-endian)


def supports(qtype) -> bool:
    """Whether `lanes` can split this type (the other q8 types keep the float path)."""
    return Q(int(qtype)) in _KERNELS


_MIN_TERM = {Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K}


def layout(qtype) -> tuple[int, bool]:
    """(values per group, whether it has a min term) of a supported type's lanes, without making them."""
    qtype = Q(int(qtype))
    return _KERNELS[qtype][1], qtype in _MIN_TERM


class Lazy:
    """Lanes made on first use (thread-safe), so a load pays nothing for matrices no generated
    row reaches: a one-token answer, or a prompt's rows, which take the float path."""

    def __init__(self, make):
        self._make, self._lanes = make, None
        self._lock = threading.Lock()

    def get(self) -> Lanes:
        if self._lanes is None:
            with self._lock:
                if self._lanes is None:
                    self._lanes = self._make()
                    self._make = None
        return self._lanes


def lanes(raw: np.ndarray, qtype, shape: tuple[int, ...]) -> Lanes:
    """The integer lanes and scales of a [N, K] matrix of GGUF blocks (K % 32 == 0)."""
    qtype = Q(int(qtype))
    kernel, g = _KERNELS[qtype]
    n, k = int(shape[0]), int(np.prod(shape[1:]))
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1).view(np.uint8).reshape(-1, size)
    q = np.empty((k // g, g, n), F32)
    a = np.empty((k // g, n), F32)
    m = None
    per_row = k // block
    step = max(1, (D.CHUNK_VALUES // block) // per_row) * per_row  # whole rows per chunk
    for i in range(0, len(blocks), step):
        lq, la, lm = kernel(blocks[i : i + step])
        rows = slice(i // per_row, (i + len(lq)) // per_row)
        r = rows.stop - rows.start
        q[:, :, rows] = lq.reshape(r, k // g, g).transpose(1, 2, 0)
        a[:, rows] = la.reshape(r, k // g).T
        if lm is not None:
            if m is None:
                m = np.empty((k // 32, n), F32)
            m[:, rows] = lm.reshape(r, k // 32).T
    return Lanes(q, a, m, g)


_ONES = np.ones(32, F32)


def quantize(x: np.ndarray, rounding: str = INFR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [T, K] rounded to 8 bits per 32 values as infr.numerics.quantize_q8 does: (q [T, K] float32
    integers, d [T, K / 32], s = d * sum(q) [T, K / 32]); q * d is quantize_q8(x, rounding) bit for bit.

    The same values by cheaper calls (2-3x at 8 rows; it runs once per matmul input a step): numpy
    reduces a 32-value last axis slowly, so the block maxima reduce over a transposed copy (a max
    is exact in any order), and sum(q), integers below 2^24, is a product with ones."""
    t, k = x.shape
    if rounding != INFR:  # the oracle's rounding (tests): numerics' own, no shortcuts
        q, d = q8_parts(x, rounding)
        d = d.reshape(t, k // 32)
        return q.reshape(t, k), d, d * (q @ _ONES).reshape(t, k // 32)
    blocks = np.asarray(x, F32).reshape(t, k // 32, 32)
    a = np.abs(blocks)
    d = np.maximum.reduce(np.ascontiguousarray(a.reshape(-1, 32).T), axis=0).reshape(t, k // 32)
    d /= F32(127)
    if ((d > 0) & (d < F32(np.inf))).all():  # no 0 / 0 or inf / inf: divide and round in place
        q = np.divide(blocks, d[..., None], out=a)
        np.rint(q, out=q)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(d[..., None] > 0, np.rint(blocks / d[..., None]), F32(0))
    s = d * (q @ _ONES)  # exact in any order
    return q.reshape(t, k), d, s


def dequantized(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """quantize_q8's value, q * d, from quantize's parts."""
    t, k = q.shape
    return (q.reshape(t, k // 32, 32) * d[..., None]).reshape(t, k)


_COLS = 2048  # columns of one integer product (OpenBLAS packs a whole [G, N] block per product otherwise)
_SPAN = 24576  # columns of one per-row product: a fixed split of N, whatever the batch (see matmul)

_pool = None  # one helper thread, made on first use: numpy releases the GIL in its products
_pool_lock = threading.Lock()


def _helper():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None and _cpus() > 1:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(1, thread_name_prefix="mmq")
    return _pool


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def matmul(q: np.ndarray, d: np.ndarray, s: np.ndarray, w: Lanes) -> np.ndarray:
    """Rows (q, d, s of `quantize`) times the weight: [T, N] float32, each row as it is alone.

    A wide weight (a head's 49152 columns) goes by chunks of _COLS, each chunk's integer sums scaled
    by a at once, while in cache (a separate pass over the [T, groups, N] array cost ~3 ms of the
    8-row step). The float steps keep the shapes they have alone: a * isum is elementwise, and the
    per-row products take fixed spans of N (_SPAN: all of N up to _SPAN, a head in two), the same
    calls for every batch. (OpenBLAS sums such a product in one order from ~24576 columns up and
    in another below: spans of 24576 give the head the very bits of one 49152-column call.)
    Which thread runs a span changes no sum: with more than one row a wide weight's spans split
    between two threads (SmolLM2's 8-row head in the engine: median 20.6 -> 15.3 ms; a lone row is
    bound by memory and stays on one)."""
    t = q.shape[0]
    ng, g, n = w.q.shape
    isum = np.empty((t, ng, n), F32)  # one row's groups contiguous: its slice is the same array at any T
    xg, out = q.reshape(t, ng, g).transpose(1, 0, 2), isum.transpose(1, 0, 2)
    c = d if g == 32 else np.repeat(d, 32 // g, axis=1)  # the activation scale of each group
    y = np.empty((t, n), F32)

    step = n if n <= 2 * _COLS else _COLS

    def rows(lo: int, hi: int) -> None:  # y[:, lo:hi] from isum, lo and hi on span bounds
        for s0 in range(lo, hi, _SPAN):  # per row [1, groups] @ [groups, span]
            s1 = min(hi, s0 + _SPAN)
            y[:, s0:s1] = np.matmul(c[:, None, :], isum[:, :, s0:s1])[:, 0]
            if w.m is not None:
                y[:, s0:s1] += np.matmul(s[:, None, :], w.m[:, s0:s1])[:, 0]

    def part(lo: int, hi: int) -> None:  # y[:, lo:hi]
        for c0 in range(lo, hi, step):  # a * the exact integer sums, a chunk at a time
            c1 = min(hi, c0 + step)
            np.matmul(xg, w.q[:, :, c0:c1], out=out[:, :, c0:c1])
            out[:, :, c0:c1] *= w.a[:, None, c0:c1]
        rows(lo, hi)

    pool = _helper() if t > 1 and n > _SPAN else None  # a layer's columns split too: slower
    if pool is None:  # one pass after another, as ever: no slower for a lone row (the same bits)
        if n <= 2 * _COLS:
            np.matmul(xg, w.q, out=out)
        else:
            for c0 in range(0, n, _COLS):
                np.matmul(xg, w.q[:, :, c0 : c0 + _COLS], out=out[:, :, c0 : c0 + _COLS])
        isum *= w.a
        rows(0, n)  # by the same spans as below: a row's sums alike alone or batched, on any BLAS
    else:  # whole spans to each thread
        mid = (n // _SPAN + 1) // 2 * _SPAN
        job = pool.submit(part, mid, n)
        part(0, mid)
        job.result()
    return y

"""8-bit activations for the int8 GEMV (infr/gpu/kernels_q8.py): the quantize
and rmsnorm_q8 kernels against the numpy reference (infr.cpu.ops)."""

from __future__ import annotations

import numpy as np
import pytest

from infr.cpu import ops as F
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import read, run, storage


def decode(words: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token's rounded row back in value order: (q int8 [K], d [K/32], s [K/32])."""
    raw = words[: K // 4].view(np.int8)
    q = np.empty(K, np.int8)
    for g in range(K // 64):  # 64 values at a time: a last partial 256-value block keeps its first K % 256 bytes
        blk, c = divmod(g, 4)
        for hh in range(2):
            src = raw[blk * 256 + 32 * (2 * c + hh) :][:32]
            lo = blk * 256 + 64 * c + 16 * hh
            q[lo : lo + 16], q[lo + 32 : lo + 48] = src[:16], src[16:]
    scales = words[K // 4 : K // 4 + K // 16].view(np.float32).reshape(K // 64, 2, 2)  # pair, a|b, (d, s)
    return q, scales[..., 0].reshape(-1), scales[..., 1].reshape(-1)


def _check(words: np.ndarray, x: np.ndarray, K: int) -> None:
    """A row's q, d and s against the reference rounding of x (ties may round either way)."""
    q, d, s = decode(words, K)
    blocks = x.reshape(-1, 32)
    want_d = np.abs(blocks).max(-1) / np.float32(127)
    np.testing.assert_allclose(d, want_d, rtol=1e-6)
    want = F.quantize_q8(x)
    got = (q.reshape(-1, 32).astype(np.float32) * d[:, None]).reshape(-1)
    off = np.abs(got - want) > 1e-6 * np.abs(x).max()
    assert off.sum() <= 2, f"{off.sum()} values rounded differently"  # at most a tie or two
    np.testing.assert_allclose(s, d * q.reshape(-1, 32).sum(-1, dtype=np.int64), rtol=1e-6, atol=1e-30)


# K not a multiple of 1024; several tokens; 640 and 64: not whole 256-value blocks (the 32-value types' GEMV)
@pytest.mark.parametrize("K,T", [(256, 1), (1280, 3), (2048, 2), (640, 2), (64, 3)])
def test_quantize_rows(gpu, kernels, K, T):
    rng = np.random.default_rng(K + T)
    stride = K + 64  # rows of a wider buffer
    x = rng.standard_normal((T, stride)).astype(np.float32) * rng.uniform(0.01, 100, (T, 1)).astype(np.float32)
    x[0, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    d, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, x_stride=stride)
    run(gpu, [d])
    words = read(gpu, xq, np.uint32, count=T * KQ.words(K)).reshape(T, -1)
    for t in range(T):
        _check(words[t], x[t, :K], K)
    q, dd, _ = decode(words[0], K)
    assert dd[1] == 0 and not q[32:64].any()


@pytest.mark.parametrize("width", [256, 1280, 2048])
def test_rmsnorm_q8(gpu, kernels, width):
    rng = np.random.default_rng(width)
    T = 3
    x = rng.standard_normal((T, width)).astype(np.float32) * 3
    g = rng.uniform(0.5, 1.5, width).astype(np.float32)
    y = storage(gpu, np.full((T, width), np.nan, np.float32))
    d, xq = KQ.rmsnorm_q8_dispatch(kernels, storage(gpu, x), storage(gpu, g), y, width, 1e-5, T)
    run(gpu, [d])
    want = F.rms_norm(x, g, 1e-5)
    got = read(gpu, y, count=T * width).reshape(T, width)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the same values as the plain norm kernel, then rounded like the quantize kernel
    y2 = storage(gpu, T * width * 4)
    run(gpu, [KS.rmsnorm_dispatch(kernels, storage(gpu, x), storage(gpu, g), y2, width, None, 1e-5, T)])
    np.testing.assert_allclose(read(gpu, y2, count=T * width).reshape(T, width), got, rtol=1e-6, atol=1e-7)
    words = read(gpu, xq, np.uint32, count=T * KQ.words(width)).reshape(T, -1)
    for t in range(T):
        _check(words[t], got[t], width)

"""8-bit activations for the int8 GEMV (infr/gpu/kernels_q8.py): the quantize
and rmsnorm_q8 kernels against the numpy reference (infr.cpu.ops); and in each
rounding mode (infr.numerics.ROUNDINGS: infr's, llama.cpp's) the quantize,
rmsnorm_q8 and f32 GEMM kernels against numerics' rounding, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from gguf import GGMLQuantizationType as Q

from infr.cpu import ops as F
from infr.gguf_file import Tensor
from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import read, run, storage
from infr.numerics import INFR, LLAMACPP, ROUNDINGS, q8_parts, quantize_q8


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


# --- the rounding modes (infr.numerics.ROUNDINGS): each kernel that rounds equals numerics' rounding bit for bit


def _split(m: float, rng: np.random.Generator) -> tuple[np.ndarray, np.float32]:
    """31 values and a max |x| = m of a block whose q differs between the modes: x / d and x * (127
    / m) fall on either side of a half step (found among the few ulps around each (k + 0.5) d)."""
    m = np.float32(m)
    d, inv = m / np.float32(127), np.float32(127) / m
    out: list = []
    for k in rng.permutation(126):
        c = (np.float32((k + 0.5) * d).view(np.int32) + np.arange(-40, 41, dtype=np.int32)).view(np.float32)
        out += list(c[np.rint(c / d) != np.rint(c * inv)][:1])
        if len(out) == 31:
            return np.array(out, np.float32), m
    return _split(m * 1.1, rng)  # too few at this m


def _rows(T: int, K: int, seed: int) -> np.ndarray:
    """Random rows of several magnitudes; block 1 all zeros; block 2 exact ties in both modes (max
    |x| = 127 * 2^e makes d = 2^e and 127 / max = 2^-e exact, so (j + 0.5) 2^e is a half step
    either way: round half to even, in both); block 3 values the two modes round apart."""
    rng = np.random.default_rng([T, K, seed])
    x = (rng.standard_normal((T, K)) * rng.uniform(0.01, 100, (T, 1))).astype(np.float32)
    x[:, 32:64] = 0.0
    for t in range(T):
        e = float(2.0 ** rng.integers(-6, 4))
        x[t, 64:96] = (rng.integers(-127, 127, 32) + 0.5) * e
        x[t, 64 + t % 32] = 127.0 * e * (-1.0) ** t  # the block's max |x|, either sign
        split, m = _split(rng.uniform(0.5, 3), rng)
        x[t, 96:127] = split * rng.choice([-1, 1], 31)
        x[t, 127] = m
    return x


@pytest.mark.parametrize("mode", ROUNDINGS)
@pytest.mark.parametrize("K,T", [(256, 2), (640, 3)])
def test_quantize_rounds_as_numerics_bit_for_bit(gpu, kernels, mode, K, T):
    x = _rows(T, K, 1)
    d_, xq = KQ.quantize_dispatch(kernels.rounding(mode), storage(gpu, x), K, T)
    run(gpu, [d_])
    words = read(gpu, xq, np.uint32, count=T * KQ.words(K)).reshape(T, -1)
    want_q, want_d = q8_parts(x, mode)
    assert (np.abs(x[:, 64:96] / want_d[:, 2]) % 1 == 0.5).sum() >= T * 31  # block 2: exact halves
    assert (q8_parts(x, INFR)[0][:, 3, :31] != q8_parts(x, LLAMACPP)[0][:, 3, :31]).all()  # block 3: modes differ
    for t in range(T):
        q, d, s = decode(words[t], K)
        np.testing.assert_array_equal(q.astype(np.int32), want_q[t].reshape(-1).astype(np.int32))
        np.testing.assert_array_equal(d.view(np.uint32), want_d[t].reshape(-1).view(np.uint32))
        np.testing.assert_array_equal(s, want_d[t].reshape(-1) * want_q[t].sum(-1))
    q, d, _ = decode(words[0], K)
    assert d[1] == 0 and not q[32:64].any()  # the all-zero block
    if mode == INFR:  # the default is what it was: quantize_q8 itself
        got = (q.reshape(-1, 32).astype(np.float32) * d[:, None]).reshape(-1)
        np.testing.assert_array_equal(got, quantize_q8(x[0]))  # (equal values: q 0 has no sign here)


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_rmsnorm_q8_rounds_as_numerics_bit_for_bit(gpu, kernels, mode):
    T, width = 2, 512
    x = _rows(T, width, 3)
    g = np.random.default_rng(4).uniform(0.5, 1.5, width).astype(np.float32)
    y = storage(gpu, T * width * 4)
    d_, xq = KQ.rmsnorm_q8_dispatch(kernels.rounding(mode), storage(gpu, x), storage(gpu, g), y, width, 1e-5, T)
    run(gpu, [d_])
    got = read(gpu, y, count=T * width).reshape(T, width)
    words = read(gpu, xq, np.uint32, count=T * KQ.words(width)).reshape(T, -1)
    want_q, want_d = q8_parts(got, mode)  # the norm's own output, rounded
    for t in range(T):
        q, d, _ = decode(words[t], width)
        np.testing.assert_array_equal(q.astype(np.int32), want_q[t].reshape(-1).astype(np.int32))
        np.testing.assert_array_equal(d.view(np.uint32), want_d[t].reshape(-1).view(np.uint32))


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_gemm_rounds_as_numerics_bit_for_bit(gpu, kernels, mode):
    """The f32 GEMM's own rounding (its Q8X step): through a Q8_0 identity (d = 1, one q of 1 per
    row), whose products are the rounded activations themselves, exactly."""
    K = N = 128
    T = 9
    blocks = np.zeros((N, K // 32, 34), np.uint8)
    blocks[:, :, :2] = np.array([1.0], np.float16).view(np.uint8)
    for n in range(N):
        blocks[n, n // 32, 2 + n % 32] = 1
    w = Tensor(name="eye", qtype=Q.Q8_0, shape=(N, K), raw=blocks.reshape(N, -1))
    x = _rows(T, K, 5)
    y = storage(gpu, np.full((T, N), np.nan, np.float32))
    run(gpu, KG.gemm_dispatches(kernels.rounding(mode), w, KM.upload_weight(gpu, w), storage(gpu, x), y, None, T))
    got = read(gpu, y, count=T * N).reshape(T, N)
    want = quantize_q8(x, mode)
    assert np.array_equal(got, want), f"{int((got != want).sum())} values differ"


def test_unknown_rounding_is_refused(kernels):
    with pytest.raises(ValueError, match="infr, llamacpp"):
        kernels.rounding("nearest")

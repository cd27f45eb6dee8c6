"""One numpy function per op: plain formulas, float32."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from infr.numerics import Q8_ACTIVATIONS, matmul_input, quantize_q8  # noqa: F401 (the rules live there)
from infr.models.spec import Activation, RopeSpec, RopeStyle

GELU_C = np.float32(np.sqrt(2.0 / np.pi))

# OpenBLAS (0.3.31, Haswell kernels) runs an sgemm of M·N·K up to about 1e6 through its small-matrix
# kernels, whose sums differ from the regular gemm's (SmolLM2's k and v, 192 x 576, at up to 6 rows);
# past that a row's sums do not depend on how many rows the gemm has.
SMALL_GEMM = 1_000_000


def padded_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b (a [..., M, K], b [..., K, N]) with a's rows padded with zeros past the small-matrix
    size (two at least), so each row's sums are those of any larger gemm: the same whether the row
    came in a chunk of 5 or of 37 (with 8-bit activations one ulp can cross a rounding step)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    rows = max(2, SMALL_GEMM // max(k * n, 1) + 1)
    if rows <= m:
        return np.matmul(a, b)
    return np.matmul(_pads.get(a, rows), b)[..., :m, :]


class _PadBuffers(threading.local):
    """The zero-padded inputs of padded_matmul, kept per shape: a step's layers multiply the same
    shapes (every layer's k and v; attention over one context length), so the buffer is reused and
    only a's rows and the rows the last call wrote past them are written (instead of a new zeroed
    array and a concatenated copy on every call). Per thread, a few shapes, small buffers only."""

    KEEP = 8  # shapes
    MAX_BYTES = 8 << 20  # larger ones are made on each call, as before

    def __init__(self):
        self.bufs: OrderedDict[tuple, list] = OrderedDict()

    def get(self, a: np.ndarray, rows: int) -> np.ndarray:
        """a's rows followed by zeros, to `rows` rows."""
        m = a.shape[-2]
        shape = a.shape[:-2] + (rows, a.shape[-1])
        key = (shape, a.dtype.str)
        got = self.bufs.get(key)
        if got is None:
            buf = np.zeros(shape, a.dtype)
            if buf.nbytes > self.MAX_BYTES:
                buf[..., :m, :] = a
                return buf
            got = self.bufs[key] = [buf, 0]  # [buffer, rows that may be nonzero]
            if len(self.bufs) > self.KEEP:
                self.bufs.popitem(last=False)
        else:
            self.bufs.move_to_end(key)
        buf, dirty = got
        buf[..., :m, :] = a
        if dirty > m:
            buf[..., m:dirty, :] = 0
        got[1] = m
        return buf


_pads = _PadBuffers()


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, group: int | None = None) -> np.ndarray:
    shape = x.shape
    if group:
        x = x.reshape(shape[0], -1, group)
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    y = x * (1.0 / np.sqrt(ms + np.float32(eps)))
    return (y * w).reshape(shape).astype(np.float32, copy=False)


def rope_angles(positions: np.ndarray, rope: RopeSpec, freq_factors: np.ndarray | None) -> np.ndarray:
    """[T, n_rot/2] rotation angles."""
    i = np.arange(rope.n_rot // 2, dtype=np.float64)
    inv = rope.theta ** (-2.0 * i / rope.n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors[: len(i)]
    return positions[:, None].astype(np.float64) * rope.freq_scale * inv[None, :]


def rope_table(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of angles [T, n_rot/2] as rope_rotate takes them: float32 [T, 1, n_rot/2]. A step's
    q and k rotate by one table."""
    return np.cos(angles).astype(np.float32)[:, None, :], np.sin(angles).astype(np.float32)[:, None, :]


def rope(x: np.ndarray, n_heads: int, head_dim: int, angles: np.ndarray, style: RopeStyle) -> np.ndarray:
    return rope_rotate(x, n_heads, head_dim, rope_table(angles), style)


def rope_rotate(x: np.ndarray, n_heads: int, head_dim: int, table: tuple[np.ndarray, np.ndarray],
                style: RopeStyle) -> np.ndarray:
    t = x.shape[0]
    x = x.reshape(t, n_heads, head_dim).copy()
    cos, sin = table
    half = cos.shape[-1]
    if style is RopeStyle.NORM:
        a, b = x[..., 0 : 2 * half : 2].copy(), x[..., 1 : 2 * half : 2].copy()
        x[..., 0 : 2 * half : 2] = a * cos - b * sin
        x[..., 1 : 2 * half : 2] = a * sin + b * cos
    else:
        a, b = x[..., :half].copy(), x[..., half : 2 * half].copy()
        x[..., :half] = a * cos - b * sin
        x[..., half : 2 * half] = a * sin + b * cos
    return x.reshape(t, n_heads * head_dim)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + np.float32(0.044715) * x * x * x)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gated_act(gate: np.ndarray, up: np.ndarray, act: Activation) -> np.ndarray:
    f = silu if act is Activation.SILU else gelu_tanh
    return (f(gate) * up).astype(np.float32, copy=False)


def attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    q_pos: np.ndarray,
    n_kv: int,
    n_heads: int,
    scale: float,
    window: int | None,
    softcap: float | None,
    padded: bool = False,
) -> np.ndarray:
    """q [T, H*D]; caches [ctx, Hkv, D] (float16, as llama.cpp stores them). padded: the
    products through padded_matmul (a row's result the same in a chunk of any length)."""
    mm = padded_matmul if padded else np.matmul
    t = q.shape[0]
    n_kv_heads, d = k_cache.shape[1], k_cache.shape[2]
    dv = v_cache.shape[2]
    group = n_heads // n_kv_heads
    k = k_cache[:n_kv].astype(np.float32).transpose(1, 2, 0)  # [Hkv, D, n_kv]
    v = v_cache[:n_kv].astype(np.float32).transpose(1, 0, 2)  # [Hkv, n_kv, Dv]
    # llama.cpp multiplies f16 K and V by f16-rounded q and probabilities.
    q = q.astype(np.float16).astype(np.float32)
    qh = q.reshape(t, n_kv_heads, group, d).transpose(1, 0, 2, 3).reshape(n_kv_heads, t * group, d)
    scores = mm(qh, k) * np.float32(scale)  # [Hkv, T*group, n_kv]
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    k_pos = np.arange(n_kv)
    masked = k_pos[None, :] > q_pos[:, None]
    if window:
        masked |= (q_pos[:, None] - k_pos[None, :]) >= window
    masked = np.repeat(masked, group, axis=0)  # rows ordered (t, group)
    scores = np.where(masked[None], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = mm(p.astype(np.float16).astype(np.float32), v)  # [Hkv, T*group, Dv]
    return out.reshape(n_kv_heads, t, group, dv).transpose(1, 0, 2, 3).reshape(t, n_heads * dv)


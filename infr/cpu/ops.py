"""One numpy function per op: plain formulas, float32."""

from __future__ import annotations

import threading

import numpy as np

from infr.numerics import Q8_ACTIVATIONS, gelu_f16_table, matmul_input, quantize_q8  # noqa: F401 (the rules live there)
from infr.models.spec import Activation, RopeSpec, RopeStyle

GELU_C = np.float32(np.sqrt(2.0 / np.pi))

class _BlockBuffers(threading.local):
    """Zeroed [rows, k] inputs of the CPU backend's block products, one per shape and thread: a
    step's matmuls write a block's rows in, multiply, and zero them again."""

    def __init__(self):
        self.bufs: dict[tuple[int, int], np.ndarray] = {}

    def get(self, rows: int, k: int) -> np.ndarray:
        buf = self.bufs.get((rows, k))
        if buf is None:
            buf = self.bufs[(rows, k)] = np.zeros((rows, k), np.float32)
        return buf


_blocks = _BlockBuffers()


def block_buffer(rows: int, k: int) -> np.ndarray:
    return _blocks.get(rows, k)


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


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """GELU as llama.cpp's CPU backend computes it (GGML_GELU_FP16): the table at f16(x) for
    -10 < x < 10, 0 at or below -10, x at or above 10."""
    x = np.asarray(x, np.float32)
    y = gelu_f16_table()[x.astype(np.float16).view(np.uint16)]
    y = np.where(x <= -10.0, np.float32(0.0), y)
    return np.where(x >= 10.0, x, y).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gated_act(gate: np.ndarray, up: np.ndarray, act: Activation) -> np.ndarray:
    f = {Activation.SILU: silu, Activation.GELU: gelu_tanh, Activation.GELU_F16: gelu_f16}[act]
    return (f(gate) * up).astype(np.float32, copy=False)


_U32 = np.uint32
_ABS, _SIGN, _EXP = _U32(0x7FFFFFFF), _U32(0x80000000), _U32(0x7F800000)
_F16_MIN_EXP = _U32(0x38800000)  # 2**-14: below it float16 is subnormal, a fixed grid of 2**-24
_F16_MAGIC = _U32((13 << 23) | 0x00400000)  # 1.5 * 2**13 times a power of two: its ulp is float16's
_F16_LIMIT = _U32(0x477FE000)  # 65504, float16's largest finite
_BIG = 4096  # values from which the calls below beat numpy's plain ones


def round_f16(x: np.ndarray) -> np.ndarray:
    """x.astype(float16).astype(float32), bit for bit, ~3x faster on a prompt block's arrays (numpy
    casts to float16 one value at a time): |x| + c - c with c = 1.5 * 2**13 * 2**max(exponent, -14)
    rounds to float16's grid, half to even, subnormals included. Beyond 65504 (or NaN): the casts."""
    x = np.ascontiguousarray(x, np.float32)
    if x.size < _BIG:
        return x.astype(np.float16).astype(np.float32)
    u = x.view(_U32)
    a = u & _ABS
    if a.max() >= _F16_LIMIT:
        return x.astype(np.float16).astype(np.float32)
    c = a & _EXP
    np.maximum(c, _F16_MIN_EXP, out=c)
    c += _F16_MAGIC
    y = a.view(np.float32) + c.view(np.float32)
    y -= c.view(np.float32)
    y.view(_U32)[...] |= u & _SIGN
    return y


def _max_last(x: np.ndarray) -> np.ndarray:
    """x.max(axis=-1, keepdims=True): over a transposed copy when large (numpy reduces a short last
    axis slowly; a max is exact in any order)."""
    if x.size < _BIG:
        return x.max(axis=-1, keepdims=True)
    return np.maximum.reduce(np.ascontiguousarray(np.moveaxis(x, -1, 0)), axis=0)[..., None]


_masks: dict = {}  # a prompt block's mask per (positions, keys, window, chunk, group): the same every layer
_MASK_BYTES = 8 << 20  # the masks kept at most (then forgotten at once)


def _mask(q_pos: np.ndarray, n_kv: int, window, chunk, group: int) -> np.ndarray:
    key = (q_pos.tobytes(), n_kv, window, chunk, group)
    m = _masks.get(key)
    if m is None:
        k_pos = np.arange(n_kv)
        m = k_pos[None, :] > q_pos[:, None]
        if window:
            m |= (q_pos[:, None] - k_pos[None, :]) >= window
        if chunk:
            m |= k_pos[None, :] < (q_pos[:, None] // chunk) * chunk
        m = np.repeat(m, group, axis=0)  # rows ordered (t, group)
        if sum(v.nbytes for v in _masks.values()) + m.nbytes > _MASK_BYTES:
            _masks.clear()
        _masks[key] = m
    return m


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
    chunk: int | None = None,
) -> np.ndarray:
    """q [T, H*D]; caches [ctx, Hkv, D] (float16, as llama.cpp stores them). chunk: keys before the
    query's chunk (k_pos < floor(q_pos / chunk) * chunk) are masked (llama4)."""
    mm = np.matmul
    t = q.shape[0]
    n_kv_heads, d = k_cache.shape[1], k_cache.shape[2]
    dv = v_cache.shape[2]
    group = n_heads // n_kv_heads
    k = k_cache[:n_kv].astype(np.float32).transpose(1, 2, 0)  # [Hkv, D, n_kv]
    v = v_cache[:n_kv].astype(np.float32).transpose(1, 0, 2)  # [Hkv, n_kv, Dv]
    # llama.cpp multiplies f16 K and V by f16-rounded q and probabilities.
    q = round_f16(q)
    qh = q.reshape(t, n_kv_heads, group, d).transpose(1, 0, 2, 3).reshape(n_kv_heads, t * group, d)
    scores = mm(qh, k) * np.float32(scale)  # [Hkv, T*group, n_kv]
    if softcap:
        scores = np.tanh(scores / softcap) * softcap
    # A decode row over its own keys, with no window or chunk, has nothing masked.
    if window or chunk or t > 1 or int(q_pos[0]) + 1 < n_kv:
        np.copyto(scores, -np.inf, where=_mask(q_pos, n_kv, window, chunk, group)[None])
    scores -= _max_last(scores)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = mm(round_f16(p), v)  # [Hkv, T*group, Dv]
    return out.reshape(n_kv_heads, t, group, dv).transpose(1, 0, 2, 3).reshape(t, n_heads * dv)


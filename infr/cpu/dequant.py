"""Dequantization to float32 that gives gguf's values bit for bit, faster and in place.

`gguf.quants.dequantize` is the reference, and stays so (tests compare every
type here with it on real tensors and on random blocks, NaN scales included).
It runs 16 rows at a time with several full-size temporaries, which made the
CPU backend's load take 1.4 s (SmolLM2-135M), 8.5 s (Qwen2.5-Coder-0.5B) and
2.9 s (Gemma-3-270m) on the 2-core development machine. Here each value is
still the same float32 operations on the same operands (d * q, then + m or
- d_min * m), but on chunks of ~256k values whose temporaries stay in cache,
with the 4-bit unpacking done on 64-bit words, written straight into the
caller's array. Types without a kernel here go through gguf chunk by chunk.
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import Q4_K as _GGUF_Q4_K
from gguf.quants import dequantize as _gguf_dequantize

F32 = np.float32
CHUNK_VALUES = 1 << 18  # values per kernel call: temporaries of ~1 MB
_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW_BITS = np.uint64(0x0101010101010101)
_LOW_2BITS = np.uint64(0x0303030303030303)
_FOUR = np.uint64(4)
_BIT_SHIFTS = np.arange(8, dtype=np.uint64)  # Q5_K: sub-block j takes bit j
_PAIR_SHIFTS = np.arange(0, 8, 2, dtype=np.uint64)  # Q6_K: group t takes bits 2t, 2t+1


def _fields(size: int, **fields: tuple) -> np.dtype:
    """A record dtype over one block: name=(offset, format[, shape])."""
    names = list(fields)
    return np.dtype({
        "names": names, "formats": [(f[1], f[2]) if len(f) > 2 else f[1] for f in fields.values()],
        "offsets": [f[0] for f in fields.values()], "itemsize": size,
    })  # fmt: skip


# Block layouts (ggml-common.h); the 16 bytes of 4-bit quants as two 64-bit words.
_Q4_0 = _fields(18, d=(0, "<f2"), q0=(2, "<u8"), q1=(10, "<u8"))
_Q4_1 = _fields(20, d=(0, "<f2"), m=(2, "<f2"), q0=(4, "<u8"), q1=(12, "<u8"))
_Q5_0 = _fields(22, d=(0, "<f2"), q0=(6, "<u8"), q1=(14, "<u8"))
_Q5_1 = _fields(24, d=(0, "<f2"), m=(2, "<f2"), q0=(8, "<u8"), q1=(16, "<u8"))
_Q8_0 = _fields(34, d=(0, "<f2"))
_Q4_K = _fields(144, d=(0, "<f2"), dmin=(2, "<f2"), q=(16, "<u8", (16,)))
_Q5_K = _fields(176, d=(0, "<f2"), dmin=(2, "<f2"), qh=(16, "<u8", (4,)), q=(48, "<u8", (16,)))
_Q6_K = _fields(210, ql=(0, "<u8", (16,)), qh=(128, "<u8", (8,)), d=(208, "<f2"))


def _nibbles32(s: np.ndarray) -> np.ndarray:
    """32 quants per block, uint8 (C, 32): low nibbles of the 16 bytes, then high nibbles."""
    q = np.empty((len(s), 4), np.uint64)
    q[:, 0] = s["q0"]
    q[:, 1] = s["q1"]
    np.right_shift(q[:, 0], _FOUR, out=q[:, 2])
    np.right_shift(q[:, 1], _FOUR, out=q[:, 3])
    q &= _NIBBLES
    return q.view(np.uint8)


def _scale(s: np.ndarray, name: str = "d") -> np.ndarray:
    return s[name].astype(F32)[:, None]


# The float step of every kernel: the small integers are converted to float32 into `out`
# (exactly), then scaled there, float32 by float32. A mixed int8 x float32 multiply is the same
# product but goes through numpy's buffered casting: 1.3-1.5x slower for the whole kernel.


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q4_0)
    q = _nibbles32(s)
    q -= np.uint8(8)  # as int8: q - 8
    out[...] = q.view(np.int8)
    out *= _scale(s)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q4_1)
    out[...] = _nibbles32(s)
    out *= _scale(s)
    out += _scale(s, "m")


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: bit j of the 32-bit qh (C, 4 bytes) as 0 or 16 in byte j, (C, 4) uint64 words.

    Each qh byte is copied into all 8 bytes of a word (times 0x0101..01, no carries), byte i
    keeps bit i, + 0x7F per byte sets that byte's top bit iff the bit was set (no carry out of
    a byte), and that top bit moved down 3 places is 16. 3x faster than np.unpackbits here."""
    h = qh.astype(np.uint64)
    h *= _REPEAT_BYTE
    h &= _BIT_I_OF_BYTE_I
    h += _SEVEN_F
    h >>= np.uint64(3)
    h &= _SIXTEENS
    return h


_REPEAT_BYTE = np.uint64(0x0101010101010101)
_BIT_I_OF_BYTE_I = np.uint64(0x8040201008040201)
_SEVEN_F = np.uint64(0x7F7F7F7F7F7F7F7F)
_SIXTEENS = np.uint64(0x1010101010101010)


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q5_0)
    q = _nibbles32(s)
    q.view(np.uint64)[...] |= _high_bits(blocks[:, 2:6])
    q -= np.uint8(16)  # as int8: q - 16
    out[...] = q.view(np.int8)
    out *= _scale(s)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q5_1)
    q = _nibbles32(s)
    q.view(np.uint64)[...] |= _high_bits(blocks[:, 4:8])
    out[...] = q
    out *= _scale(s)
    out += _scale(s, "m")


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q8_0)
    out[...] = blocks[:, 2:].view(np.int8)
    out *= _scale(s)


def _k_nibbles(words: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K quants (C, 4, 2, 4) words: per 32 bytes, low nibbles then high nibbles."""
    w = words.reshape(len(words), 4, 1, 4)
    q = np.empty((len(words), 4, 2, 4), np.uint64)
    np.bitwise_and(w[:, :, 0], _NIBBLES, out=q[:, :, 0])
    np.right_shift(w[:, :, 0], _FOUR, out=q[:, :, 1])
    q[:, :, 1] &= _NIBBLES
    return q


def _k_scales(blocks: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc, mn = _GGUF_Q4_K.get_scale_min(blocks[:, 4:16])
    n = len(blocks)
    dl = (_scale(s) * sc.astype(F32)).reshape(n, 8, 1)
    ml = (_scale(s, "dmin") * mn.astype(F32)).reshape(n, 8, 1)
    return dl, ml


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q4_K)
    dl, ml = _k_scales(blocks, s)
    q = _k_nibbles(s["q"]).view(np.uint8).reshape(len(blocks), 8, 32)
    o = out.reshape(len(blocks), 8, 32)
    o[...] = q
    o *= dl
    o -= ml


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    s = blocks.reshape(-1).view(_Q5_K)
    dl, ml = _k_scales(blocks, s)
    q = _k_nibbles(s["q"]).reshape(len(blocks), 8, 4)
    h = s["qh"][:, None, :] >> _BIT_SHIFTS[None, :, None]  # sub-block j: bit j of each qh byte
    h &= _LOW_BITS
    h <<= _FOUR
    q |= h
    o = out.reshape(len(blocks), 8, 32)
    o[...] = q.view(np.uint8).reshape(len(blocks), 8, 32)
    o *= dl
    o -= ml


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    s = blocks.reshape(-1).view(_Q6_K)
    ql = s["ql"].reshape(n, 2, 1, 8)  # per half: 64 bytes of low 4 bits
    q = np.empty((n, 2, 2, 8), np.uint64)
    np.bitwise_and(ql[:, :, 0], _NIBBLES, out=q[:, :, 0])
    np.right_shift(ql[:, :, 0], _FOUR, out=q[:, :, 1])
    q[:, :, 1] &= _NIBBLES
    h = s["qh"].reshape(n, 2, 1, 4) >> _PAIR_SHIFTS[None, None, :, None]  # group t: bits 2t, 2t+1
    h &= _LOW_2BITS
    h <<= _FOUR
    q |= h.reshape(q.shape)
    qb = q.view(np.uint8)
    qb -= np.uint8(32)  # as int8: q - 32
    dl = (_scale(s) * blocks[:, 192:208].view(np.int8).astype(F32)).reshape(n, 16, 1)
    o = out.reshape(n, 16, 16)
    o[...] = qb.view(np.int8).reshape(n, 16, 16)
    o *= dl


KERNELS = {
    Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1, Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k,
} if sys.byteorder == "little" else {}  # fmt: skip  (the word tricks assume little-endian)


def dequantize_into(raw: np.ndarray, qtype: Q, out: np.ndarray) -> None:
    """Write the float32 values of `raw` (GGUF bytes of whole blocks) into `out`.

    `out` is C-contiguous float32 with as many values as `raw` holds.
    """
    flat = out.reshape(-1)  # a view: out is contiguous
    if qtype == Q.F32:
        flat[:] = raw.reshape(-1).view(F32)
        return
    if qtype == Q.F16:
        flat[:] = raw.reshape(-1).view(np.float16)
        return
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1).view(np.uint8).reshape(-1, size)
    step = max(1, CHUNK_VALUES // block)
    kernel = KERNELS.get(qtype)
    for i in range(0, len(blocks), step):
        chunk, dest = blocks[i : i + step], flat[i * block : (i + step) * block].reshape(-1, block)
        if kernel is not None:
            kernel(chunk, dest)
        else:
            dest[:] = _gguf_dequantize(chunk, qtype).reshape(dest.shape)


def dequantize(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=F32)
    dequantize_into(raw, qtype, out)
    return out

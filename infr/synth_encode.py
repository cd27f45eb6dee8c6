"""float32 rows -> GGUF quant blocks, for infr.synth's random-weight models.

gguf-py encodes Q4_0, Q8_0 and the other legacy types itself (about as fast as
the encoders here, so `encode` hands those to it) but only decodes the
K-quants and IQ4_NL / IQ4_XS; this module writes those. Plain rounding, not
llama.cpp's error-minimising search: the bytes are valid blocks that gguf and
llama.cpp decode identically; quality is moot for random weights.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

# --- K-quants ----------------------------------------------------------------------------------


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = x.astype(np.float16)
    return h, h.astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b > 0)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> the 12-byte field of Q4_K / Q5_K."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _affine_k(blocks: np.ndarray, levels: int):
    """Shared Q4_K / Q5_K step: per 32-value sub-block, q = round((x + min) / scale)."""
    x = blocks.reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=-1), 0.0)
    sub_scale = (x.max(axis=-1) - lo) / levels
    sub_min = -lo
    d16, d = _f16(sub_scale.max(axis=-1) / 63)
    m16, dm = _f16(sub_min.max(axis=-1) / 63)
    sc = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(sub_min, dm[:, None])), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    offset = dm[:, None] * mn
    q = np.clip(np.rint(_safe_div(x + offset[..., None], step[..., None])), 0, levels).astype(np.uint8)
    head = np.concatenate([d16.view(np.uint8).reshape(-1, 2), m16.view(np.uint8).reshape(-1, 2),
                           _pack_k_scales(sc, mn)], axis=1)
    return head, q  # q: [n, 8, 32]


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Sub-blocks 2c and 2c+1 share 32 bytes: low and high nibble."""
    return ((q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)).reshape(q.shape[0], -1)


def encode_q4_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _affine_k(blocks, 15)
    return np.concatenate([head, _nibbles(q)], axis=1)


def encode_q5_k(blocks: np.ndarray) -> np.ndarray:
    head, q = _affine_k(blocks, 31)
    bits = ((q >> 4) & 1).astype(np.uint8)  # [n, 8, 32]: bit j of byte i is sub-block j's value i
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= bits[:, j, :] << j
    return np.concatenate([head, qh, _nibbles(q)], axis=1)


def encode_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    sub_scale = np.abs(x).max(axis=-1) / 31
    d16, d = _f16(sub_scale.max(axis=-1) / 127)
    sc = np.clip(np.rint(_safe_div(sub_scale, d[:, None])), -128, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = (np.clip(np.rint(_safe_div(x, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    # Value e sits in ql byte (e//128)*64 + e%64 (nibble (e%128)//64) and in
    # qh byte (e//128)*32 + e%32 (bit pair (e%128)//32).
    lo = (q & 0x0F).reshape(n, 2, 2, 64)
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(n, 128)
    hi = (q >> 4).reshape(n, 2, 4, 32)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d16.view(np.uint8).reshape(-1, 2)], axis=1)


# --- IQ4_NL, IQ4_XS ----------------------------------------------------------------------------
# IQ4_NL and IQ4_XS store 4-bit indices into one fixed non-uniform grid of
# int8 levels. Each 32-value group is scaled so its largest magnitude lands on
# the grid's -127 end, then every value takes the nearest level: nearest to
# x/step rounded to an integer first, through a 256-entry table (the levels sit
# 11 or more apart, so the integer step moves a value to a neighbour only
# within half a unit of a midpoint).
_IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
_IQ4_NEAREST = np.abs(np.arange(-128, 128, dtype=np.float32)[:, None] - _IQ4_LEVELS).argmin(axis=1).astype(np.uint8)


def _iq4_signed_max(x: np.ndarray) -> np.ndarray:
    """Per group (last axis), the value of largest magnitude, sign kept."""
    idx = np.abs(x).argmax(axis=-1)
    return np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]


def _iq4_indices(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """x: [..., 32], step: [...] -> packed nibbles [..., 16]: byte j holds values j and j + 16."""
    s = step[..., None]
    ratio = np.divide(x, s, out=np.zeros(x.shape, np.float32), where=s != 0)  # steps may be negative
    r = np.clip(np.rint(ratio), -128, 127).astype(np.int16) + 128
    q = _IQ4_NEAREST[r]
    return q[..., :16] | (q[..., 16:] << 4)


def encode_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    x = blocks.reshape(-1, 32)
    d16, d = _f16(_iq4_signed_max(x) / np.float32(-127))
    qs = _iq4_indices(x, d)  # a negative step is fine: level -127 then decodes to +max
    return np.concatenate([d16.view(np.uint8).reshape(-1, 2), qs], axis=1)


def encode_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32)
    sub = _iq4_signed_max(x) / np.float32(-127)  # each group's own step
    d16, d = _f16(np.abs(sub).max(axis=-1) / 31)  # 6-bit signed group scales, -32..31
    ls = np.clip(np.rint(np.divide(sub, d[:, None], out=np.zeros_like(sub), where=d[:, None] > 0)), -32, 31)
    ls = ls.astype(np.int16)
    step = d[:, None] * ls.astype(np.float32)
    qs = _iq4_indices(x, step).reshape(n, 128)
    u = (ls + 32).astype(np.uint16)  # stored biased by 32: low 4 bits, then high 2 bits
    scales_l = ((u[:, 0::2] & 0x0F) | ((u[:, 1::2] & 0x0F) << 4)).astype(np.uint8)
    scales_h = np.zeros(n, np.uint16)
    for i in range(8):
        scales_h |= (u[:, i] >> 4) << (2 * i)
    return np.concatenate([d16.view(np.uint8).reshape(-1, 2), scales_h.view(np.uint8).reshape(-1, 2),
                           scales_l, qs], axis=1)


ENCODERS = {Q.Q4_K: encode_q4_k, Q.Q5_K: encode_q5_k, Q.Q6_K: encode_q6_k,
              Q.IQ4_NL: encode_iq4_nl, Q.IQ4_XS: encode_iq4_xs}


def encode(values: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 rows -> the tensor's GGUF payload (float array or uint8 blocks per row)."""
    if qtype in ENCODERS:
        block = GGML_QUANT_SIZES[qtype][0]
        rows = values.shape[0]
        return ENCODERS[qtype](values.reshape(-1, block).astype(np.float32)).reshape(rows, -1)
    return quantize(values, qtype)

"""What every backend must agree on, so the GPU can equal the CPU reference.

Neither backend owns these rules: `infr/cpu` and `infr/gpu` both import them
from here and never each other.
- the weight types a plan may use;
- which matmuls multiply activations rounded to 8 bits per 32 values, and
  that rounding itself (docs/numerics.md);
- the sampler's constants as the GPU kernel holds them (f32 where it computes
  in f32) and when penalties apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q

from infr.errors import UnsupportedError

SUPPORTED_TYPES = frozenset(
    {
        Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
        Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
    }
)

# Weight types whose matmuls multiply activations rounded to 8 bits per 32
# values (the GPU's integer kernels take them to dot4I8Packed, as llama.cpp's
# GPU backends do); the reference rounds the same way. A type joins when every
# GPU path rounds for it: the int8 GEMV (kernels_matmul.GEMV_FAMILY, the same
# set), the f32 GEMM (its Q8X flag) and the int8 GEMM where it takes the type.
Q8_ACTIVATIONS = frozenset(
    {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS}
)


def check_supported(t) -> None:
    """t: a tensor with .qtype, .name, .type_name (infr.gguf_file.Tensor)."""
    if t.qtype not in SUPPORTED_TYPES:
        names = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
        raise UnsupportedError(f"tensor {t.name!r} has unsupported type {t.type_name}; supported: {names}")


def takes_q8(qtype) -> bool:
    """Whether a matmul over weights of this type multiplies 8-bit activations."""
    return Q(int(qtype)) in Q8_ACTIVATIONS


# How activations are rounded to 8 bits (docs/numerics.md): "infr" (the default) keeps the f32 scale
# d = max|x| / 127 and q = round-half-even(x / d); "llamacpp" is llama.cpp's CPU on x86 (its AVX /
# AVX2 / AVX-512 quantize_row_q8_0, what made the oracle fixtures): q = round-half-even(x * (127 /
# max|x|)), and the value is q * f16(d), the scale as block_q8_0 stores it. A plan carries one
# (Plan.q8_rounding); both backends honour it in every path that rounds.
INFR = "infr"
LLAMACPP = "llamacpp"
ROUNDINGS = (INFR, LLAMACPP)


def check_rounding(rounding: str) -> str:
    if rounding not in ROUNDINGS:
        raise ValueError(f"activation rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    return rounding


def q8_parts(x: np.ndarray, rounding: str = INFR) -> tuple[np.ndarray, np.ndarray]:
    """x rounded to 8 bits per 32 values along its last axis, as (q [..., n, 32] float32 integers,
    d [..., n, 1] the scale each block's q multiplies); q * d is the rounded value."""
    blocks = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    m = np.max(np.abs(blocks), axis=-1, keepdims=True)
    d = m / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if check_rounding(rounding) == INFR:
            q = np.where(d > 0, np.rint(blocks / d), np.float32(0))
        else:  # inverse 127 / max (not 1 / d), then one product: llama.cpp's x86 order of operations
            q = np.rint(blocks * np.where(m > 0, np.float32(127) / m, np.float32(0)))
            d = d.astype(np.float16).astype(np.float32)
    return q.astype(np.float32, copy=False), d


def quantize_q8(x: np.ndarray, rounding: str = INFR) -> np.ndarray:
    """x rounded to 8 bits per 32 values along its last axis (q8_parts), as float32 values q * d.
    The default: d = max|x| / 127, q = round(x / d) (half to even)."""
    q, d = q8_parts(x, rounding)
    return (q * d).reshape(x.shape).astype(np.float32, copy=False)


def matmul_input(x: np.ndarray, qtype, rounding: str = INFR) -> np.ndarray:
    """The activations a matmul with `qtype` weights multiplies."""
    return quantize_q8(x, rounding) if takes_q8(qtype) else x


# --- the sampler (infr/cpu/sample.py is its numpy twin, wgsl/sample*.wgsl the kernel)


def has_penalties(p) -> bool:
    """p: infr.sampling.SamplingParams."""
    return p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)


@dataclass(frozen=True)
class SamplerConstants:
    use_k: bool
    top_k: int
    use_p: bool
    top_p: np.float32
    has_min_p: bool
    min_p_log: np.float32
    inv_temp: np.float32
    rep_inv: np.float32


def sampler_constants(p, n: int) -> SamplerConstants:
    """The values the kernel's uniform holds for settings p over n logits."""
    return SamplerConstants(
        use_k=0 < p.top_k < n, top_k=int(p.top_k) if 0 < p.top_k < n else 0,
        use_p=p.top_p < 1.0, top_p=np.float32(p.top_p),
        has_min_p=p.min_p > 0.0, min_p_log=np.float32(math.log(p.min_p)) if p.min_p > 0.0 else np.float32(0.0),
        inv_temp=np.float32(1.0 / p.temperature) if p.temperature > 0 else np.float32(0.0),
        rep_inv=np.float32(1.0 / p.repeat_penalty),
    )


_GELU_TABLE: list[np.ndarray] = []


def gelu_f16_table() -> np.ndarray:
    """llama.cpp's CPU GELU table (GGML_GELU_FP16), both backends' Activation.GELU_F16: for every
    float16 bit pattern h, f16(gelu(h)) with gelu computed in float32 as ggml_gelu_f32 arranges it,
    0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))). The GPU reads it from a buffer, so both agree
    bit for bit whatever the device's tanh."""
    if not _GELU_TABLE:
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        c = np.float32(np.sqrt(2.0 / np.pi))
        with np.errstate(invalid="ignore", over="ignore"):
            y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * x * (np.float32(1.0) + np.float32(0.044715) * x * x)))
        _GELU_TABLE.append(y.astype(np.float16).astype(np.float32))
    return _GELU_TABLE[0]

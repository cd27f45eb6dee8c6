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


def quantize_q8(x: np.ndarray) -> np.ndarray:
    """x rounded to 8 bits per 32 values along its last axis: d = max|x| / 127,
    q = round(x / d) (half to even); returns d * q as float32."""
    blocks = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.max(np.abs(blocks), axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.rint(blocks / d), np.float32(0))
    return (q * d).reshape(x.shape).astype(np.float32, copy=False)


def matmul_input(x: np.ndarray, qtype) -> np.ndarray:
    """The activations a matmul with `qtype` weights multiplies."""
    return quantize_q8(x) if takes_q8(qtype) else x


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

"""Activations rounded to 8 bits per 32 values, the input of the int8 GEMV.

The GEMV multiplies every Q8_ACTIVATIONS type's quants with int8 activations
by dot4I8Packed (see wgsl/gemv.wgsl for why); the reference rounds the same way
(infr.numerics.quantize_q8). The rounded rows go through one scratch buffer
per device: each quantization is followed by the GEMVs that read it, in the
same ordered pass. `rmsnorm_q8` writes a norm's output both as floats and
rounded, so the GEMV after a norm needs no quantize dispatch of its own;
`rmsnorm_add_q8` so a post-norm's residual add (and the next norm after it); the GEMV's gate||up
pair so its own output for down (kernels_matmul.pair_rounds, into `scratch_out`: it reads the first).
"""

from __future__ import annotations

import weakref

from gguf import GGMLQuantizationType as Q

from infr.numerics import Q8_ACTIVATIONS
from infr.gpu import kernels_misc as KS
from infr.gpu.runtime import Dispatch, Kernels, storage

_scratch: weakref.WeakKeyDictionary[Kernels, dict] = weakref.WeakKeyDictionary()


def words(K: int) -> int:
    """u32 words per token of the rounded rows: K bytes of q, then K/16 words of scales (K % 64 == 0)."""
    return K // 4 + K // 16


def takes_q8(tensor) -> bool:
    """Whether a matmul with this weight reads its activations rounded, from
    the q8 scratch: its type rounds them (Q8_ACTIVATIONS) and K is whole
    64-value groups of the layout (other K round inside the f32 GEMM)."""
    return Q(int(tensor.qtype)) in Q8_ACTIVATIONS and int(tensor.shape[-1]) % 64 == 0


def _buffer(kernels: Kernels, kind: str, nbytes: int):
    """The device's scratch of one kind, at least nbytes (a larger request makes
    a larger one; bind groups keep the old one alive)."""
    bufs = _scratch.setdefault(kernels, {})
    buf = bufs.get(kind)
    if buf is None or buf.size < nbytes:
        buf = bufs[kind] = storage(kernels.dev, max(nbytes, 1 << 16), label=f"x_{kind}")
    return buf


def scratch(kernels: Kernels, K: int, T: int):
    """The device's q8 scratch, large enough for T rounded rows of K values."""
    return _buffer(kernels, "q8", 4 * T * words(K))


def scratch_out(kernels: Kernels, K: int, T: int):
    """A second q8 scratch, for rounded rows a kernel writes while it reads the first: the GEMV's
    gate||up pair rounding its output (kernels_matmul.pair_rounds) for the down projection."""
    return _buffer(kernels, "q8_out", 4 * T * words(K))


def quantize_dispatch(kernels: Kernels, x, K: int, T: int, x_stride: int | None = None,
                      into=None) -> tuple[Dispatch, object]:
    """x [T, K] (rows x_stride floats apart) rounded (wgsl/quantize_q8.wgsl):
    (the dispatch, the buffer it writes, `words(K)` words per token): `into`,
    or the device's q8 scratch."""
    xq = into if into is not None else scratch(kernels, K, T)
    pipe = kernels.pipeline("quantize_q8", "main")
    p = KS._params(kernels, KS._pack([("K", "u32", K), ("T", "u32", T), ("x_stride", "u32", x_stride or K),
                                       ("q_stride", "u32", words(K))]), None, "quantize")
    return Dispatch(pipe, kernels.bind(pipe, [p, x, xq]), (-(-K // 1024), T, 1), f"quantize_q8 {K}"), xq


def rmsnorm_q8_dispatch(kernels: Kernels, x, g, y, width: int, eps: float, T: int,
                        twin=None) -> tuple[Dispatch, object]:
    """A plain RMSNorm (width % 256 == 0) writing y and y rounded (wgsl/rmsnorm_q8.wgsl). With twin =
    (g2, z, scale, w2, w2_width): the same row's second norm z = ((rmsnorm(x) * g2) * scale) * w2[k %
    w2_width] too, from the same sum (wgsl/rmsnorm_twin_on.wgsl; no Mul after it: scale 1, w2 one 1.0)."""
    if width % 256:
        raise ValueError(f"rmsnorm_q8 needs width % 256 == 0, got {width}")
    xq = _buffer(kernels, "q8", 4 * T * words(width))
    pipe = kernels.pipeline("rmsnorm_q8", "main", TWIN=f"// #include rmsnorm_twin_{'off' if twin is None else 'on'}")
    scale, w2_width = (twin[2], twin[4]) if twin is not None else (1.0, 1)
    p = KS._params(kernels, KS._pack([("width", "u32", width), ("group", "u32", width), ("eps", "f32", eps),
                                       ("T", "u32", T), ("q_stride", "u32", words(width)), ("scale", "f32", scale),
                                       ("w2_width", "u32", w2_width)]), None, "rmsnorm_q8")
    res = [p, x, g, y, xq]
    if twin is not None:
        g2, z, _, w2, _ = twin
        res += [g2, z, w2]
    label = "rmsnorm_q8_twin" if twin is not None else "rmsnorm_q8"
    return Dispatch(pipe, kernels.bind(pipe, res), (-(-width // 1024), T, 1), label), xq


def rmsnorm_add_q8_dispatch(kernels: Kernels, x, g, resid, y, width: int, eps: float, T: int, w=None,
                            w_width: int = 1, scale: float = 1.0, norm2=None) -> tuple[Dispatch, object]:
    """rmsnorm_add_dispatch's y (y = resid + rmsnorm(x) * g, then with w (y * scale) * w[i % w_width]),
    and rounded for the int8 GEMV after it (wgsl/rmsnorm_add_q8.wgsl): y itself, or with norm2 = (g2, z,
    eps2) the next norm's z = rmsnorm(y) * g2, written too. width % 256 == 0."""
    if width % 256:
        raise ValueError(f"rmsnorm_add_q8 needs width % 256 == 0, got {width}")
    xq = _buffer(kernels, "q8", 4 * T * words(width))
    # unread without NORM2; z a writable binding of its own (Dawn refuses two writable bindings of one range)
    g2, z, eps2 = norm2 if norm2 is not None else (g, _buffer(kernels, "unused_z", 16), 0.0)
    pipe = kernels.pipeline("rmsnorm_add_q8", "main", SCALE="true" if w is not None else "false",
                            NORM2="true" if norm2 is not None else "false")
    p = KS._params(kernels, KS._pack([("width", "u32", width), ("group", "u32", width), ("eps", "f32", eps),
                                       ("T", "u32", T), ("scale", "f32", scale), ("w_width", "u32", w_width),
                                       ("eps2", "f32", eps2), ("q_stride", "u32", words(width))]), None,
                   "rmsnorm_add_q8")
    res = [p, x, g, y, resid, w if w is not None else KS._dummy(kernels), g2, z, xq]
    label = "rmsnorm_add_rmsnorm_q8" if norm2 is not None else "rmsnorm_add_q8"
    return Dispatch(pipe, kernels.bind(pipe, res), (-(-width // 1024), T, 1), label), xq

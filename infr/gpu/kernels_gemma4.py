"""gemma4's ops on the GPU (wgsl/gemma4.wgsl; CPU reference infr/cpu/kinds.py): the fp16-table GELU
(Activation.GELU_F16), the scaled values (Mul), the per-layer inputs (PerLayerInputs) and their
gate (PLEGate), and the experts' output scales (MoE.scales, called from kernels_moe).

The table GELU reads the CPU reference's own table (numerics.gelu_f16_table, 256 KiB, one per
device) at the f16 bits of its input, so the GPU's values are the CPU's bit for bit. The
per-layer inputs run as llama.cpp orders them: the projection scaled, RMS-normed per layer's
width with its weight (the rmsnorm kernel), the table's rows of the batch's tokens gathered from
their blocks and scaled (the embed kernel, as token_embd's), then their sum times 1/sqrt(2).
"""

from __future__ import annotations

import weakref

import numpy as np

from infr.gpu import kernels_embed as KE
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.ops import Mul, PerLayerInputs, PLEGate

def _table(kernels: Kernels):
    return KM.gelu_table(kernels)  # one per device, shared with the GEMV's gate||up pair


def _pack(n: int, width: int = 1, stride: int = 0, off: int = 0, scale: float = 1.0) -> bytes:
    return KS._pack([("n", "u32", n), ("width", "u32", width), ("stride", "u32", stride), ("off", "u32", off),
                     ("scale", "f32", scale)])


def _dispatch(kernels: Kernels, entry: str, data: bytes, res: list, n: int, label: str) -> Dispatch:
    pipe = kernels.pipeline("gemma4", entry)
    p = KS._params(kernels, data, None, entry)
    return Dispatch(pipe, kernels.bind(pipe, [p] + res), KS._flat_groups(kernels, n), label)


def gated_gelu_f16_dispatch(kernels: Kernels, g, u, y, n: int, width: int | None = None, stride: int | None = None,
                            off: int = 0) -> Dispatch:
    """y[i] = gelu_f16(g[i]) * u[(i // width) * stride + off + i % width] (default: u[i])."""
    width = width or n
    stride = width if stride is None else stride
    return _dispatch(kernels, "gated_gelu_f16", _pack(n, width, stride, off), [g, u, y, _table(kernels)], n,
                     "gated_gelu_f16")


def mul_dispatch(kernels: Kernels, x, w, n: int, width: int, scale: float = 1.0) -> Dispatch:
    """x[i] = (x[i] * scale) * w[i % width] in place (width 1: w is one value)."""
    return _dispatch(kernels, "mul", _pack(n, width, scale=scale), [x, w], n, "mul")


def add_scaled_dispatch(kernels: Kernels, a, b, y, n: int, scale: float) -> Dispatch:
    """y = (a + b) * scale."""
    return _dispatch(kernels, "add_scaled", _pack(n, scale=scale), [a, b, y], n, "add_scaled")


_ones: "weakref.WeakKeyDictionary[Kernels, object]" = weakref.WeakKeyDictionary()


def _scratch(be, name: str, width: int):
    """A [MAX_BATCH, width] f32 buffer of the backend's, made once."""
    from infr.gpu.backend import MAX_BATCH

    bufs = be.__dict__.setdefault("_gemma4_scratch", {})
    if name not in bufs:
        bufs[name] = storage(be.dev, MAX_BATCH * width * 4, label=f"gemma4.{name}")
        be.vram += MAX_BATCH * width * 4
    return bufs[name]


def lower_mul(lower, op: Mul) -> list[Dispatch]:
    be = lower.be
    x = lower.current(op.buf)
    if lower.q8 is not None and lower.q8[0] is x:
        lower.q8 = None  # changed in place: its rounded rows are stale
    w = be.weights[op.weight][0]
    width = int(np.prod(be.gf.tensor(op.weight).shape))
    return [mul_dispatch(lower.k, x, w, lower.rows * be.widths[op.buf], width, op.scale)]


def lower_per_layer_inputs(lower, op: PerLayerInputs) -> list[Dispatch]:
    be, k, T = lower.be, lower.k, lower.rows
    n = op.n_layers * op.width
    one = _ones.get(k)
    if one is None:
        one = _ones[k] = KS.ones(k, 1)
    proj = lower.current(op.proj)  # read by this op alone: scaled in place
    normed, rows = _scratch(be, "ple_normed", n), _scratch(be, "ple_rows", n)
    proj_scale = float(np.float32(1.0) / np.sqrt(np.float32(op.n_embd)))
    row_scale = float(np.sqrt(np.float32(op.width)))
    half = float(np.float32(1.0) / np.sqrt(np.float32(2.0)))
    ds = [mul_dispatch(k, proj, one, T * n, 1, proj_scale),
          KS.rmsnorm_dispatch(k, proj, be.weights[op.norm][0], normed, n, op.width, op.eps, T)]
    ds += KE.embed_dispatches(k, be.gf.tensor(op.table), be.weights[op.table], be.ids, rows, row_scale, T)
    y = lower.target(op.dst)
    ds.append(add_scaled_dispatch(k, normed, rows, y, T * n, half))
    return ds


def lower_ple_gate(lower, op: PLEGate) -> list[Dispatch]:
    be = lower.be
    if getattr(op.act, "value", op.act) != "gelu_f16":
        raise NotImplementedError(f"the per-layer input gate with {op.act}")
    g, ple = lower.current(op.buf), lower.current(op.ple)
    y = lower.target(op.buf, op.buf, op.ple)
    stride = be.widths[op.ple]
    return [gated_gelu_f16_dispatch(lower.k, g, ple, y, lower.rows * op.width, op.width, stride, op.layer * op.width)]

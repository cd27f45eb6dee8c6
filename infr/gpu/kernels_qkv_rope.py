"""The q|k|v GEMV that also rotates q and k and stores k and v in the KV cache (wgsl/gemv_rope_on.wgsl):
fusion.py's qkv_rope_store group (a qkv stack, then its rope_store) in one dispatch where the stack runs
the int8 GEMV, instead of the GEMV and a rope_kv dispatch. Decode is bound by its dispatches
(perf/h200/decode-encode-vs-gpu-*): one fewer a llama layer.

Where it applies (takes): GemvTuning.ROPE, "norm" rope (pairs 2i, 2i + 1, so a pair's two rows are in
one GEMV workgroup; NEOX pairs lie half a head apart), even head dims and n_rot (so no pair of rows
crosses from q to k or k to v).
Elsewhere the two dispatches run as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu.runtime import Kernels, storage


@dataclass(frozen=True)
class StackRope:
    """What the epilogue needs: rope_kv_dispatch's arguments, less q, k and v (the GEMV's outputs)."""

    kcache: object
    vcache: object
    paging: KS.Paging
    n_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    n_rot: int
    theta: float
    freq_scale: float
    factors: object = None

    def consts(self) -> dict:
        return {"BS": self.paging.block_size}

    def bindings(self, kernels: Kernels) -> list:
        """Bindings 8 .. 14 of gemv.wgsl with ROPE_OUT."""
        data = KA.pack_rope_kv(self.n_heads, self.kv_heads, self.head_dim, self.v_head_dim, self.n_rot, self.theta,
                               self.freq_scale, self.factors is not None, self.paging.blocks_per_seq)
        p = storage(kernels.dev, np.frombuffer(data, np.uint8), label="qkv_rope.params", uniform=True)
        ff = self.factors if self.factors is not None else KS._dummy(kernels)
        pg = self.paging
        return [p, self.kcache, self.vcache, ff, pg.state, pg.rows, pg.table]


def takes(dev, style: str, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, n_rot: int) -> bool:
    """Whether the q|k|v GEMV takes the rope and the KV store of these heads on `dev` (the module's
    docstring; head dims up to rope_kv's 512): its 13 storage buffers fit the device's limit, and its
    workgroup memory (the GEMV's reduction, the kept rows of NT tokens, the IQ4 readers' table) too."""
    t = KM.GemvTuning.for_device(dev)
    limits = getattr(dev, "limits", None) or {}
    _, R, partial = KM.gemv_shape(t, False, t.NT, False)
    shared = 4 * (partial + KM.GEMV_TEAMS * R * t.NT + 16)
    return (
        bool(t.ROPE) and style == "norm" and head_dim % 2 == 0 and v_head_dim % 2 == 0 and n_rot % 2 == 0
        and n_rot <= head_dim and max(head_dim, v_head_dim) <= 512
        and int(limits.get("max-storage-buffers-per-shader-stage", 8)) >= 13
        and int(limits.get("max-compute-workgroup-storage-size", 16384)) >= shared
    )

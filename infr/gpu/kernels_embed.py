"""The embedding lookup over a table's row chunks (kernels_matmul.upload_weight): one dispatch per
chunk, each writing the tokens whose id falls inside it (wgsl/embed.wgsl)."""

from __future__ import annotations

import numpy as np

from infr.gpu import kernels_matmul as KM
from infr.gpu.runtime import Dispatch, Kernels, storage

EMBED_WG = 64  # embed.wgsl's @workgroup_size


def params_embed(K: int, rows: int, row0: int, row_bytes: int, scale: float, T: int) -> np.ndarray:
    return KM.pack_params([
        ("K", "u32", K), ("rows", "u32", rows), ("row0", "u32", row0), ("row_bytes", "u32", row_bytes),
        ("scale", "f32", scale), ("T", "u32", T),
    ])


def embed_dispatches(kernels: Kernels, w, chunks, ids, y, scale: float, T: int, K: int | None = None) -> list[Dispatch]:
    """Dispatches for y[t] = W[ids[t]] * scale, one per table chunk.

    `w` is the table's Tensor, or its qtype with the row width given as K.
    """
    if hasattr(w, "qtype") and hasattr(w, "shape"):
        q, K = KM.as_qtype(w.qtype), int(w.shape[-1])
    else:
        q = KM.as_qtype(w)
        if K is None:
            raise TypeError("embed_dispatches needs K with a bare qtype")
    rb = KM.row_bytes(q, K)
    pipe = kernels.pipeline("embed", "main", QTYPE=KM.wgsl_name(q))
    out = []
    for buf, row0, rows in chunks:
        p = storage(kernels.dev, params_embed(K, rows, row0, rb, scale, T), label="embed.params", uniform=True)
        groups = (-(-K // EMBED_WG), T, 1)
        out.append(Dispatch(pipe, kernels.bind(pipe, [p, buf, ids, y]), groups, f"embed_{KM.wgsl_name(q)}"))
    return out

"""Weights for the reference backend, dequantized with `gguf`'s own code.

Matrices are dequantized to float32 on first use and kept; embedding rows are
gathered from the raw blocks so a 262k-row table is never expanded for lookup.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from infr.numerics import SUPPORTED_TYPES, check_supported  # noqa: F401 (the rules live there)
from infr.gguf_file import GGUFFile, Tensor

def dequantize_tensor(t: Tensor) -> np.ndarray:
    check_supported(t)
    out = dequantize(t.raw, t.qtype)
    return np.ascontiguousarray(out, dtype=np.float32).reshape(t.shape)


def dequantize_rows(t: Tensor, rows: np.ndarray) -> np.ndarray:
    check_supported(t)
    raw = t.raw.reshape(t.shape[0], -1)[rows]
    return np.asarray(dequantize(raw, t.qtype), dtype=np.float32).reshape(len(rows), -1)


class WeightStore:
    def __init__(self, gf: GGUFFile):
        self.gf = gf
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        w = self._cache.get(name)
        if w is None:
            w = self._cache[name] = dequantize_tensor(self.gf.tensor(name))
        return w

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        if name in self._cache:
            return self._cache[name][ids]
        return dequantize_rows(self.gf.tensor(name), ids)

    def load_all(self, names: list[str], skip: frozenset[str] = frozenset()) -> None:
        for name in names:
            if name not in skip:
                self[name]

"""Weights for the reference backend, dequantized to float32 exactly as `gguf` does.

Matrices are dequantized to float32 on first use and kept; embedding rows are
gathered from the raw blocks so a 262k-row table is never expanded for lookup.
The values are gguf's bit for bit (infr/cpu/dequant.py says how, and is tested
against gguf); `load_all` writes every matrix into one block of memory whose
pages are allocated in one call per matrix and made huge pages afterwards
(see `_populate` and `_collapse_later`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from infr.cpu.dequant import dequantize, dequantize_into
from infr.gguf_file import GGUFFile, Tensor
from infr.numerics import SUPPORTED_TYPES, check_supported  # noqa: F401 (the rules live there)


def dequantize_tensor(t: Tensor) -> np.ndarray:
    check_supported(t)
    return dequantize(t.raw, t.qtype, t.shape)


def dequantize_rows(t: Tensor, rows: np.ndarray) -> np.ndarray:
    check_supported(t)
    raw = t.raw.reshape(t.shape[0], -1)[rows]
    return dequantize(raw, t.qtype, (len(rows), int(np.prod(t.shape[1:]))))


# Threads for load_all: numpy releases the GIL inside each kernel step, ctypes in madvise.
_WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
_MADV_POPULATE_WRITE, _MADV_COLLAPSE = 23, 25  # Linux >= 5.14 / 6.1; Python 3.11's mmap names neither
_ALIGN, _HUGE_PAGE = 4096, 2 << 20


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_MADVISE = _madvise()


def _arena(nbytes: int) -> np.ndarray:
    """`nbytes` of zeroed, page-aligned memory (Linux: its own mapping), else np.empty."""
    if _MADVISE is None:
        return np.empty(nbytes, np.uint8)
    try:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)
    except (OSError, ValueError):
        return np.empty(nbytes, np.uint8)


def _populate(a: np.ndarray) -> None:
    """Allocate the (small) pages under `a` in one call; a best effort, else they come on first touch.

    Measured on this 2-core VM, loading SmolLM2-135M's 0.54 GB of float32:
    touched page by page in huge pages (numpy's np.empty asks for them) 1.1-1.6 s
    of system time, the kernel compacting memory for each 2 MB; populated by one
    madvise in 4 KB pages 0.2 s. `_collapse_later` brings the huge pages back.
    """
    start = a.ctypes.data & ~(_ALIGN - 1)
    if _MADVISE is not None and a.nbytes:
        _MADVISE(start, a.ctypes.data + a.nbytes - start, _MADV_POPULATE_WRITE)


def _collapse_later(arena: np.ndarray) -> None:
    """Turn the loaded weights' pages into huge pages in a background thread (MADV_COLLAPSE,
    Linux >= 6.1): the matmuls stream every weight per token, as with huge pages before,
    and the compaction it costs is off the path to the first token."""
    if _MADVISE is None or arena.nbytes < _HUGE_PAGE:
        return

    def collapse() -> None:
        _MADVISE(arena.ctypes.data, arena.nbytes, _MADV_COLLAPSE)  # ctypes releases the GIL

    threading.Thread(target=collapse, name="infr-weights-collapse", daemon=True).start()


def _load(t: Tensor, out: np.ndarray) -> None:
    _populate(out)
    dequantize_into(t.raw, t.qtype, out)


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
        todo = list(dict.fromkeys(n for n in names if n not in skip and n not in self._cache))
        tensors = [self.gf.tensor(n) for n in todo]
        for t in tensors:
            check_supported(t)
        sizes = [int(np.prod(t.shape)) * 4 for t in tensors]
        slots = [-(-size // _ALIGN) * _ALIGN for size in sizes]
        arena = _arena(max(1, sum(slots)))
        outs, at = [], 0
        for t, size, slot in zip(tensors, sizes, slots):
            outs.append(arena[at : at + size].view(np.float32).reshape(t.shape))
            at += slot
        # largest first, so the threads finish together
        jobs = sorted(zip(tensors, outs), key=lambda job: -job[1].size)
        if _WORKERS > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(_WORKERS) as pool:
                list(pool.map(lambda job: _load(*job), jobs))
        else:
            for t, out in jobs:
                _load(t, out)
        self._cache.update(zip(todo, outs))
        _collapse_later(arena)

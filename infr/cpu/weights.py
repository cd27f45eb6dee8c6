"""Weights for the reference backend, dequantized to float32 exactly as `gguf` does.

Matrices are dequantized to float32 on first use and kept; embedding rows are
gathered from the raw blocks so a 262k-row table is never expanded for lookup.
The values are gguf's bit for bit (infr/cpu/dequant.py says how, and is tested
against gguf); `load_all` writes every matrix into one block of memory whose
pages are allocated in one call per matrix (see `_populate`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
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
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; Python 3.11's mmap does not name it
_ALIGN = 4096


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
    """`nbytes` of zeroed, page-aligned memory that asks for huge pages (Linux), else np.empty."""
    if _MADVISE is None:
        return np.empty(nbytes, np.uint8)
    try:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError, AttributeError):
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(mm, dtype=np.uint8)


def _populate(a: np.ndarray) -> None:
    """Allocate the pages under `a` in one call (a best effort: they come on first touch otherwise).

    Fresh memory touched page by page cost this 2-core VM 1-3 s a GB of system
    time, most of Qwen2.5-0.5B's 2 GB load (the host backs each page on first
    touch); populated by one madvise call, in huge pages, 0.1-0.4 s when the
    host has it at hand. Run in the loading threads, it overlaps dequantization.
    """
    start = a.ctypes.data & ~(_ALIGN - 1)
    if _MADVISE is not None and a.nbytes:
        _MADVISE(start, a.ctypes.data + a.nbytes - start, _MADV_POPULATE_WRITE)


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

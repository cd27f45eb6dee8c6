"""The mixture-of-experts FFN on the CPU: the router's choice, then each chosen expert's gated
FFN read from its bank ([n_expert, out, in] in its GGUF block type).

Only the chosen experts' blocks are read: an expert's slice of the bank is dequantized when a
token first picks it and kept in an LRU cache of dequantized experts (ExpertCache, bounded in
bytes; INFR_EXPERT_CACHE_MB, default 1024), so a Qwen3-30B-A3B whose banks would be ~120 GB as
float32 runs in the memory of its selected experts. F32 banks are read in place.

Numerics follow llama.cpp's build_moe_ffn (wave2-families.md section 0): softmax as ggml's
(exp in f32, the sum in double, times its reciprocal), weights renormalised with the sum clamped
to 6.103515625e-5, experts summed in selection order. Every (token, expert) product is one
vector-matrix product of that row alone, so a row's output does not depend on which other rows
share its step or its expert (the backend's batched-equals-alone rule).
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
from gguf import GGMLQuantizationType as Q

from infr.cpu import ops as F
from infr.cpu.dequant import dequantize
from infr.gguf_file import Tensor
from infr.models.spec import Gating, MoESpec
from infr.numerics import INFR, check_supported, quantize_q8

F32 = np.float32
RENORM_FLOOR = np.float32(6.103515625e-5)  # llama.cpp clamps the weights' sum to the smallest f16 normal


class ExpertCache:
    """Dequantized experts, least recently used dropped first, at most `budget` bytes."""

    def __init__(self, budget: int | None = None):
        if budget is None:
            budget = int(float(os.environ.get("INFR_EXPERT_CACHE_MB", "1024")) * 2**20)
        self.budget, self.used = budget, 0
        self._items: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self.misses = 0

    def get(self, bank: "ExpertBank", e: int) -> np.ndarray:
        key = (bank.name, e)
        w = self._items.get(key)
        if w is not None:
            self._items.move_to_end(key)
            return w
        self.misses += 1
        w = bank.dequantize(e)
        self._items[key] = w
        self.used += w.nbytes
        while self.used > self.budget and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.used -= old.nbytes
        return w


class ExpertBank:
    """One [n_expert, out, in] bank of a GGUF file; bank[e] is expert e's [out, in] float32
    matrix, its bytes read only then. `read` records which experts were ever read."""

    def __init__(self, t: Tensor, cache: ExpertCache):
        check_supported(t)
        if len(t.shape) != 3:
            raise ValueError(f"{t.name}: an expert bank has 3 dimensions, not {t.shape}")
        self.name, self.qtype = t.name, t.qtype
        self.n_expert, self.rows, self.cols = (int(d) for d in t.shape)
        self._raw = t.raw.reshape(self.n_expert, -1)  # a view of the mapped file: nothing read yet
        self._direct = t.raw.reshape(-1).view(F32).reshape(t.shape) if t.qtype == Q.F32 else None
        self.cache = cache
        self.read: set[int] = set()

    def dequantize(self, e: int) -> np.ndarray:
        return dequantize(self._raw[e], self.qtype, (self.rows, self.cols))

    def __getitem__(self, e: int) -> np.ndarray:
        e = int(e)
        self.read.add(e)
        if self._direct is not None:
            return self._direct[e]
        return self.cache.get(self, e)


def softmax(logits: np.ndarray) -> np.ndarray:
    """ggml's softmax of each row: exp(l - max) in f32, summed in double, times 1/sum as f32."""
    e = np.exp((logits - logits.max(axis=-1, keepdims=True)).astype(F32))
    inv = (1.0 / e.sum(axis=-1, dtype=np.float64, keepdims=True)).astype(F32)
    return (e * inv).astype(F32, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (F32(1.0) / (F32(1.0) + np.exp(-x.astype(F32)))).astype(F32, copy=False)


def route(logits: np.ndarray, m: MoESpec) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts [T, n_used] in descending order of their score, their weights [T, n_used])."""
    logits = np.asarray(logits, F32)
    p = softmax(logits) if m.gating is Gating.SOFTMAX else sigmoid(logits)
    score = logits if m.select_on_logits else p
    chosen = np.argsort(-score, axis=-1, kind="stable")[:, : m.n_used]
    w = np.take_along_axis(p, chosen, axis=-1)
    if m.norm_weights:
        total = w.sum(axis=-1, dtype=np.float64, keepdims=True).astype(F32)
        w = w / np.maximum(total, RENORM_FLOOR)
    if m.weight_scale not in (None, 0.0, 1.0):
        w = w * F32(m.weight_scale)
    return chosen, w.astype(F32, copy=False)


def moe_forward(h: np.ndarray, logits: np.ndarray, m: MoESpec, banks: list[ExpertBank],
                q8: tuple[bool, ...], rounding: str = INFR, scales: np.ndarray | None = None) -> np.ndarray:
    """The experts' weighted sum for each row of h [T, n_embd]; q8: which banks take rounded input,
    rounded `rounding`'s way (numerics.ROUNDINGS); scales: per expert, a factor of its output
    before the router's weight (gemma4's ffn_down_exps.scale)."""
    chosen, w = route(logits, m)
    t, k = chosen.shape
    n_embd = h.shape[1]
    up_banks, down = banks[:-1], banks[-1]
    q8_up, q8_down = q8[0], q8[-1]
    ys = np.empty((t, k, n_embd), F32)
    for e in np.unique(chosen):
        rows, slots = np.nonzero(chosen == e)
        x = h[rows]
        if m.weight_before:
            x = x * w[rows, slots][:, None]
        if q8_up:
            x = quantize_q8(x, rounding)
        mats = [b[e].T for b in up_banks]
        dt = down[e].T
        for i, (r, s) in enumerate(zip(rows, slots)):
            if len(mats) == 1:  # fused gate_up: gate rows, then up rows
                gu = x[i] @ mats[0]
                g, u = gu[: m.hidden], gu[m.hidden :]
            else:
                g, u = x[i] @ mats[0], x[i] @ mats[1]
            a = F.gated_act(g, u, m.activation)
            if q8_down:
                a = quantize_q8(a, rounding)
            y = a @ dt
            if scales is not None:
                y = y * scales[e]
            if not m.weight_before:
                y = y * w[r, s]
            ys[r, s] = y
    out = ys[:, 0].copy()
    for s in range(1, k):
        out += ys[:, s]
    return out

"""The GPU sampler (wgsl/sample.wgsl) in numpy: the oracle its tests compare to.

Same chain and semantics as infr/sampling.py (llama.cpp's order: penalties ->
top_k -> top_p -> min_p -> temperature -> draw), with two choices made so a
GPU can run it without a sort or a prefix sum and agree with this file token
for token:
- the kept set is the shortest of the top_k prefix, the top_p prefix (the
  first tokens, in descending logit order with ties by lower id, whose mass
  reaches top_p of the top_k set's mass) and the tokens with logit >=
  max + log(min_p);
- the draw is Gumbel-max: argmax over kept tokens of (x - max) / temperature
  + g, with g = -log(-log(u)) and u a PCG hash of (seed, position, token id).
  That is an exact draw from the filtered softmax at that temperature, and
  the same (seed, position) gives the same token on any run.
Arithmetic that decides a token is done in float32 as the GPU does it.
Penalties multiply by the f32 reciprocal of repeat_penalty (the GPU's
division is not correctly rounded; a multiply is).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infr.numerics import has_penalties
from infr.numerics import sampler_constants as constants
from infr.sampling import SamplingParams

M32 = np.uint64(0xFFFFFFFF)


def pcg(v) -> np.ndarray:
    """PCG hash of uint32 values (wraps like WGSL's u32)."""
    s = (np.asarray(v, np.uint64) * np.uint64(747796405) + np.uint64(2891336453)) & M32
    w = (((s >> ((s >> np.uint64(28)) + np.uint64(4))) ^ s) * np.uint64(277803737)) & M32
    return ((w >> np.uint64(22)) ^ w) & M32


def row_key(seed: int, pos: int) -> np.uint64:
    lo, hi = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    return pcg(pcg(pcg(hi) ^ lo) ^ np.uint64(pos & 0xFFFFFFFF))


def gumbel(seed: int, pos: int, ids: np.ndarray) -> np.ndarray:
    """The Gumbel noise of token `ids` at `pos` (float32, as the kernel computes it)."""
    rk = row_key(seed, pos)
    h = pcg((pcg(np.asarray(ids, np.uint64) ^ rk) + rk) & M32)
    m = (h >> np.uint64(9)).astype(np.float32)
    f = np.float32
    v = (f(8388607.5) - m) * f(1.0 / 8388608.0)  # 1 - u, exact
    with np.errstate(divide="ignore"):
        e = -np.log((m + f(0.5)) * f(1.0 / 8388608.0))  # u in (0, 1)
    near = v < f(0.0625)  # -log(1 - v) as its series, as the kernel does (sample_common.wgsl: why)
    s = v * (f(1) + v * (f(0.5) + v * (f(0.33333334) + v * (f(0.25) + v * (f(0.2) + v * f(0.16666667))))))
    return -np.log(np.where(near, s, e))


def penalize(x: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Logits after the penalties over the last repeat_last_n of `history` (a copy)."""
    x = np.array(x, np.float32)
    if not has_penalties(p) or len(history) == 0:
        return x
    window = np.asarray(history if p.repeat_last_n < 0 else history[-p.repeat_last_n:], np.int64)
    ids, counts = np.unique(window, return_counts=True)
    keep = ids < x.size
    ids, counts = ids[keep], counts[keep]
    v = x[ids]
    if p.repeat_penalty != 1.0:
        v = np.where(v <= 0, v * np.float32(p.repeat_penalty), v * constants(p, x.size).rep_inv).astype(np.float32)
    sub = counts.astype(np.float32) * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
    x[ids] = v - sub.astype(np.float32)
    return x


def kept(x: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Boolean mask of the tokens the draw chooses from (x already penalised)."""
    x = np.asarray(x, np.float32)
    n = x.size
    c = constants(p, n)
    m = x.max()
    order = np.lexsort((np.arange(n), -x.astype(np.float64)))  # descending, ties by lower id
    length = c.top_k if c.use_k else n
    if c.use_p:
        e = np.exp(x[order].astype(np.float64) - float(m))
        target = float(c.top_p) * e[:length].sum()
        cum = np.cumsum(e)
        length = min(length, int(np.searchsorted(cum, target, side="left")) + 1)
    mask = np.zeros(n, bool)
    mask[order[:max(1, length)]] = True
    if c.has_min_p:
        mask &= x >= np.float32(m + c.min_p_log)
    return mask & (x != -np.inf)


def sample(logits: np.ndarray, p: SamplingParams, seed: int, pos: int, history: Sequence[int] = ()) -> int:
    """The token the GPU sampler picks for position `pos` (history = the context's tokens)."""
    x = penalize(logits, history, p)
    if p.greedy:
        return int(np.argmax(x))
    mask = kept(x, p)
    ids = np.flatnonzero(mask)
    score = (x[ids] - x.max()) * constants(p, x.size).inv_temp + gumbel(seed, pos, ids)
    return int(ids[int(np.argmax(score))])


def probabilities(logits: np.ndarray, p: SamplingParams, history: Sequence[int] = ()) -> np.ndarray:
    """The distribution the draw follows: softmax((x - max) / T) over the kept tokens (float64)."""
    x = penalize(logits, history, p)
    if p.greedy:
        out = np.zeros(x.size)
        out[int(np.argmax(x))] = 1.0
        return out
    mask = kept(x, p)
    z = np.where(mask, (x.astype(np.float64) - float(x.max())) / p.temperature, -np.inf)
    e = np.exp(z - z.max())
    return e / e.sum()

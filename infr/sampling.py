"""Token sampling: llama.cpp's default sampler chain in vectorised numpy.

The chain, in llama.cpp's order: penalties -> top_k -> top_p -> min_p ->
temperature -> softmax -> seeded draw. Greedy (temperature <= 0) is the argmax
after penalties, which is what llama.cpp's chain reduces to at temperature 0
(top_k/top_p/min_p always keep the best token).

Everything works on whole arrays: with a 262k vocabulary the only full-vocab
passes are a max, a partition for top_k and, with penalties, one copy.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from infr.errors import InfrError


class SamplingError(InfrError):
    """Bad sampling settings, or logits that cannot be sampled from (NaN, +inf)."""


@dataclass
class SamplingParams:
    """Sampling settings; the defaults are llama.cpp's (common_params_sampling)."""

    temperature: float = 0.8
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off
    repeat_last_n: int = 64  # penalty window; 0 = off, -1 = the whole history
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None = fresh OS entropy

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def validate(self) -> "SamplingParams":
        """Raise SamplingError naming the first out-of-range field; return self."""

        def real(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise SamplingError(f"{name} must be a finite number, got {v!r}")
            return float(v)

        def integer(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise SamplingError(f"{name} must be an integer, got {v!r}")
            return int(v)

        real("temperature")  # any value: <= 0 means greedy, as in llama.cpp
        if integer("top_k") < 0:
            raise SamplingError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < real("top_p") <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if not 0.0 <= real("min_p") <= 1.0:
            raise SamplingError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if real("repeat_penalty") <= 0.0:
            raise SamplingError(
                f"repeat_penalty must be > 0 (1 disables it), got {self.repeat_penalty}"
            )
        if integer("repeat_last_n") < -1:
            raise SamplingError(
                f"repeat_last_n must be >= -1 (-1 = whole context, 0 = off), got {self.repeat_last_n}"
            )
        real("presence_penalty")
        real("frequency_penalty")
        if self.seed is not None and (integer("seed") < 0):
            raise SamplingError(f"seed must be a non-negative integer or None, got {self.seed}")
        return self


# ---------------------------------------------------------------- helpers


def _as_logits(logits: np.ndarray, n_vocab: int | None = None) -> np.ndarray:
    x = np.asarray(logits)
    if x.ndim != 1 or (n_vocab is not None and x.shape[0] != n_vocab):
        want = f"({n_vocab},)" if n_vocab is not None else "one dimension"
        raise SamplingError(f"logits have shape {x.shape}, expected {want}")
    if x.size == 0:
        raise SamplingError("logits are empty")
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float32)
    return x


def _check_max(x: np.ndarray) -> float:
    """Return max(x); reject what no distribution can come from.

    One reduction catches all cases: max propagates NaN, and +inf / all -inf
    show up as the max itself.
    """
    mx = float(x.max())
    if math.isnan(mx):
        n_nan = int(np.isnan(x).sum())
        raise SamplingError(f"logits contain NaN ({n_nan} of {x.size}); the model output is broken")
    if mx == math.inf:
        raise SamplingError("logits contain +inf; the model output is broken")
    if mx == -math.inf:
        raise SamplingError("every logit is -inf; no token can be sampled")
    return mx


def _top_sorted(x: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m largest entries of x, largest first, ties by lower index.

    np.partition finds the m-th value (cheaper than argpartition); the ties at
    that value are then resolved by index so the kept set never depends on
    the selection algorithm's internals.
    """
    n = x.size
    if m >= n:
        idx = np.arange(n)
    else:
        thr = np.partition(x, n - m)[n - m]
        above = np.flatnonzero(x > thr)
        at = np.flatnonzero(x == thr)[: m - above.size]
        idx = np.concatenate([above, at])
    # lexsort: last key is primary -> descending value, then ascending index.
    return idx[np.lexsort((idx, -x[idx]))]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities (float64) of a 1-D logit vector; -inf entries get 0."""
    x = _as_logits(logits)
    mx = _check_max(x)
    e = np.exp(x.astype(np.float64) - mx)
    return e / e.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) of a 1-D logit vector; -inf entries stay -inf."""
    x = _as_logits(logits)
    mx = _check_max(x)
    # exp in float32 is the expensive part; the sum is kept in float64.
    lse = mx + math.log(float(np.exp(x - np.asarray(mx, x.dtype)).sum(dtype=np.float64)))
    return x.astype(np.float64) - lse


def top_logprobs(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens as (id, logprob), best first, ties by lower id.

    Tokens with zero probability (-inf logits) are left out, so fewer than k
    may come back; k is clamped to the vocabulary.
    """
    x = _as_logits(logits)
    mx = _check_max(x)
    if k <= 0:
        return []
    lse = mx + math.log(float(np.exp(x - np.asarray(mx, x.dtype)).sum(dtype=np.float64)))
    ids = _top_sorted(x, min(int(k), x.size))
    return [(int(i), float(x[i]) - lse) for i in ids if x[i] != -np.inf]


def apply_penalties(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """Logits after llama.cpp's repeat / frequency / presence penalties.

    For each distinct token among the last repeat_last_n of `history`
    (count = its occurrences there): a positive logit is divided by
    repeat_penalty, a non-positive one multiplied; then
    logit -= count * frequency_penalty + presence_penalty.
    Never modifies `logits`; returns it unchanged (same object) when no
    penalty applies.
    """
    x = _as_logits(logits)
    n = params.repeat_last_n
    if (
        n == 0
        or len(history) == 0
        or (params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0)
    ):
        return x
    window = np.asarray(history if n < 0 else history[-n:], dtype=np.int64)
    if window.ndim != 1:
        raise SamplingError("history must be a flat sequence of token ids")
    if window.size and (window.min() < 0 or window.max() >= x.size):
        bad = window[(window < 0) | (window >= x.size)][0]
        raise SamplingError(f"history has token id {int(bad)} outside the vocabulary (size {x.size})")
    ids, counts = np.unique(window, return_counts=True)
    out = x.copy()
    v = out[ids]
    if params.repeat_penalty != 1.0:
        v = np.where(v <= 0, v * params.repeat_penalty, v / params.repeat_penalty)
    v = v - (counts * params.frequency_penalty + params.presence_penalty)
    out[ids] = v.astype(out.dtype)
    return out


# ---------------------------------------------------------------- sampler


class Sampler:
    """Draws token ids from logits with fixed settings and a seeded generator.

    Stateless apart from the random stream: the caller passes the context's
    tokens (prompt + generated so far) as `history` on every call, so one
    Sampler can follow a context that is edited or rewound.
    """

    # First prefix tried when top_k is off and top_p / min_p need the best
    # tokens in order; grown 8x until the cut is found (see _filter).
    _FIRST_PREFIX = 256

    def __init__(self, params: SamplingParams, n_vocab: int):
        self.params = params.validate()
        if n_vocab <= 0:
            raise SamplingError(f"n_vocab must be positive, got {n_vocab}")
        self.n_vocab = int(n_vocab)
        self.reset()

    def reset(self) -> None:
        """Restart the random stream (same seed -> the same draws again)."""
        self.rng = np.random.default_rng(self.params.seed)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the draw chooses from and their probabilities.

        Returns (ids int64, probs float64 summing to 1), best token first
        when any of top_k / top_p / min_p is on (with all off, the whole
        vocabulary in id order: sorting it would cost more than sampling);
        greedy gives the single argmax with probability 1.
        """
        x = apply_penalties(_as_logits(logits, self.n_vocab), history, self.params)
        mx = _check_max(x)
        p = self.params
        if p.greedy:
            return np.array([int(np.argmax(x))]), np.ones(1)
        if 0 < p.top_k < x.size:
            ids = _top_sorted(x, p.top_k)
            ids = ids[self._filter(x[ids], mx, presorted=True)]
        elif p.top_p < 1.0 or p.min_p > 0.0:
            ids = self._filter(x, mx, presorted=False)
        else:
            ids = np.flatnonzero(x != -np.inf)  # nothing to cut: the whole (unmasked) vocabulary
        # Temperature after the cuts, as in llama.cpp: it reshapes, never selects.
        z = (x[ids].astype(np.float64) - mx) / p.temperature
        e = np.exp(z - z.max())
        return ids, e / e.sum()

    def _filter(self, v: np.ndarray, mx: float, presorted: bool) -> np.ndarray:
        """Positions in v kept by top_p then min_p, best first.

        Both keep a prefix of v in descending order: top_p the shortest one
        whose probability (normalised over all of v) reaches top_p, min_p the
        tokens with logit >= max + log(min_p). So only a prefix needs sorting:
        its length is bounded by the min_p count and grown until the top_p
        cut falls inside it.
        """
        p = self.params
        limit = v.size
        if p.min_p > 0.0:
            limit = int(np.count_nonzero(v >= mx + math.log(p.min_p)))
        total = float(np.exp(v - np.asarray(mx, v.dtype)).sum(dtype=np.float64))
        m = limit if presorted else min(limit, self._FIRST_PREFIX)
        while True:
            top = np.arange(m) if presorted else _top_sorted(v, m)
            if p.top_p < 1.0:
                cum = np.cumsum(np.exp(v[top].astype(np.float64) - mx)) / total
                cut = int(np.searchsorted(cum, p.top_p, side="left"))  # first cum >= top_p
                if cut < m:
                    return top[: cut + 1]
            if m >= limit:
                return top[:limit]
            m = min(limit, m * 8)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from `logits` (shape (n_vocab,)) given the context `history`."""
        ids, probs = self.distribution(logits, history)
        if ids.size == 1:
            return int(ids[0])
        cdf = np.cumsum(probs)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        # Rounding can put the draw at the very end; zero-probability tails
        # (-inf logits) must never be picked, so fall back to the last real one.
        if i >= ids.size:
            i = int(np.flatnonzero(probs > 0)[-1])
        return int(ids[i])


def host_sample(row, logits: np.ndarray) -> int:
    """The token for an output row (infr.batch.OutputRow) from its logits, on the host:
    its grammar mask first, then its sampler (greedy without one)."""
    x = logits
    if row.mask is not None:
        x = np.where(unpack_mask(row.mask, x.shape[-1]), x, np.float32(-np.inf)).astype(np.float32, copy=False)
    if row.sampler is not None:
        return row.sampler.sample(x, row.history)
    if not row.params.greedy:
        raise SamplingError("a sampled row needs a sampler")
    return int(np.argmax(apply_penalties(_as_logits(x), row.history, row.params)))


def unpack_mask(bits: np.ndarray, n: int) -> np.ndarray:
    """A grammar's token bitmask (bit i of byte i // 8, little-endian: token i allowed) as bool [n];
    tokens past the mask's end are not allowed."""
    allowed = np.unpackbits(np.asarray(bits, np.uint8), bitorder="little")[:n].astype(bool)
    if allowed.shape[0] < n:  # model rows past the tokenizer's vocabulary
        allowed = np.concatenate([allowed, np.zeros(n - allowed.shape[0], bool)])
    return allowed

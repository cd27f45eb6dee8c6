"""Sampling on the GPU (wgsl/sample.wgsl, wgsl/sample_topk.wgsl): the dispatches that turn
a step's logits into the next token of each of its sampled rows.

`StepSampling` holds up to `slots` samplers. `load(rows)` writes every row's settings
(temperature, top_k, top_p, min_p, penalties, seed, which row of the logits it reads, where in
the output it writes, where in `state` its position is) into one storage array with one call;
`dispatches(x, out, draws)` are the step's dispatches: each entry point runs once for all the rows, one slot per
workgroup_id.z, and a slot whose path does not take an entry point returns at once. Bind
groups are built once per (logits, out) buffer pair, so a new request with new values
rebuilds nothing. The numpy twin is infr/cpu/sample.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from infr import numerics as ref
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.sampling import SamplingParams

SLICE = 4096  # values per workgroup in the full-vocabulary passes
ROUNDS = 8  # 4 key bits per radix round (sample.wgsl)
ROUNDS8 = 4  # 8 key bits per round (sample_topk.wgsl)
CAND_MAX = 1024  # top_k up to this many runs sample_topk.wgsl (its CAND_MAX)
NONE = 0xFFFFFFFF
MAX_PENALTY_WINDOW = 1024  # the penalty kernel is one workgroup, quadratic in the window
PATH_PEN, PATH_TOPK, PATH_FULL = 1, 2, 4  # sample_common.wgsl's PATH_*


def parts_for(n: int) -> int:
    return max(1, -(-n // SLICE))


def scratch_words(n: int, rows: int) -> int:
    parts = parts_for(n)
    return 64 + 2 * parts + 128 * parts + 2 * rows * parts + 2 * 256 * parts + 2 * CAND_MAX


def _chain(params: SamplingParams) -> SamplingParams:
    """The settings the kernels run: greedy is top_k 1 (the first of the largest logits)."""
    if not params.greedy:
        return params
    return SamplingParams(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=params.repeat_penalty,
                          repeat_last_n=params.repeat_last_n, presence_penalty=params.presence_penalty,
                          frequency_penalty=params.frequency_penalty, seed=params.seed)


def supports(params: SamplingParams, n_ctx: int) -> bool:
    """Whether the GPU sampler runs these settings (penalties over a bounded window)."""
    if not ref.has_penalties(params):
        return True
    window = n_ctx + 1 if params.repeat_last_n < 0 else params.repeat_last_n
    return window <= MAX_PENALTY_WINDOW


PARAMS_DTYPE = np.dtype([
    ("n", "<u4"), ("parts", "<u4"), ("slice", "<u4"), ("top_k", "<u4"), ("top_p", "<f4"), ("min_p_log", "<f4"),
    ("has_min_p", "<u4"), ("inv_temp", "<f4"), ("seed_lo", "<u4"), ("seed_hi", "<u4"), ("rows", "<u4"),
    ("use_k", "<u4"), ("use_p", "<u4"), ("pen_n", "<u4"), ("rep", "<f4"), ("rep_inv", "<f4"), ("freq", "<f4"),
    ("pres", "<f4"), ("x_off", "<u4"), ("out_off", "<u4"), ("pos_at", "<u4"), ("scratch_off", "<u4"),
    ("seq_off", "<u4"), ("slot", "<u4"), ("path", "<u4"),
])  # sample_common.wgsl's Params, an array stride of 100 bytes


def _path(params: SamplingParams, c) -> int:
    topk = c.use_k and c.top_k <= CAND_MAX
    return (PATH_PEN if ref.has_penalties(params) else 0) | (PATH_TOPK if topk else PATH_FULL)


def pack_slot(rec, n: int, params: SamplingParams, seed: int, rows: int, x_off: int, out_off: int, pos_at: int,
              scratch_off: int, seq_off: int, slot: int) -> None:
    """One slot's settings into rec (a PARAMS_DTYPE record)."""
    p = _chain(params)
    c = ref.sampler_constants(p, n)
    rec["n"], rec["parts"], rec["slice"], rec["top_k"] = n, parts_for(n), SLICE, c.top_k
    rec["top_p"], rec["min_p_log"], rec["has_min_p"], rec["inv_temp"] = c.top_p, c.min_p_log, int(c.has_min_p), c.inv_temp
    rec["seed_lo"], rec["seed_hi"], rec["rows"] = seed & NONE, (seed >> 32) & NONE, rows
    rec["use_k"], rec["use_p"] = int(c.use_k), int(c.use_p)
    rec["pen_n"] = NONE if p.repeat_last_n < 0 else p.repeat_last_n
    rec["rep"], rec["rep_inv"], rec["freq"], rec["pres"] = p.repeat_penalty, c.rep_inv, p.frequency_penalty, p.presence_penalty
    rec["x_off"], rec["out_off"], rec["pos_at"] = x_off, out_off, pos_at
    rec["scratch_off"], rec["seq_off"], rec["slot"], rec["path"] = scratch_off, seq_off, slot, _path(params, c)


class Draws(NamedTuple):
    """What a step's loaded slots need run: their number and which entry points any of them takes."""

    slots: int
    pen: bool
    topk: bool
    full: bool
    full_k: bool  # a full-path slot cuts by top_k: job 0's radix rounds
    full_p: bool  # ... by top_p: job 1's


class StepSampling:
    """Up to `slots` sampled rows of a step over logits of n values: slot j draws `rows` tokens
    (for positions state[pos_at] + 1 + r) from x[x_off : x_off + n] into out[out_off + r], after
    the penalties over its history (written into its own part of `seq`). The backend's state
    is its `rows` buffer (batch row t's position at word 2 t), so decode_steps' samplers follow
    the positions its step kernel advances."""

    def __init__(self, kern: Kernels, n: int, n_ctx: int, state, slots: int, rows: int = 1):
        self.kern, self.n, self.state, self.slots, self.rows = kern, int(n), state, int(slots), int(rows)
        self.parts = parts_for(self.n)
        dev = kern.dev
        self.words = scratch_words(self.n, self.rows)
        self.seq_words = n_ctx + 1
        self.params = storage(dev, self.slots * PARAMS_DTYPE.itemsize, label="sample.slots")
        self.scratch = storage(dev, 4 * self.slots * self.words, label="sample.scratch")
        self.counter = storage(dev, 4 * self.slots, label="sample.counter")
        self.seq = storage(dev, 4 * self.slots * self.seq_words, label="sample.seq")
        self._steps: dict[tuple[int, int], object] = {}  # (job, round) uniforms
        self._binds: dict[tuple, tuple] = {}  # (id(x), id(out), module, entry, job, round) -> (x, out, bind group)
        self._lists: dict[tuple, list[Dispatch]] = {}

    def _bind(self, x, out, module: str, entry: str, job: int = 0, rnd: int = 0):
        key = (id(x), id(out), module, entry, job, rnd)
        hit = self._binds.get(key)
        if hit is None:
            step = self._steps.get((job, rnd))
            if step is None:
                step = self._steps[(job, rnd)] = storage(self.kern.dev, np.array([job, rnd, 0, 0], np.uint32),
                                                         label="sample.step", uniform=True)
            pipe = self.kern.pipeline(module, entry)
            bufs = [self.params, step, x, self.seq, self.state, self.scratch, out, self.counter]
            hit = self._binds[key] = (x, out, pipe, self.kern.bind(pipe, bufs))  # x, out kept: ids stay unique
        return hit[2], hit[3]

    def dispatches(self, x, out, draws: Draws | None) -> list[Dispatch]:
        """The dispatches that draw the loaded slots from logits `x` into `out` (built once per
        buffer pair and kind of step)."""
        if draws is None:
            return []
        key = (id(x), id(out), draws)
        got = self._lists.get(key)
        if got is not None:
            return got
        P, R, S = self.parts, self.rows, draws.slots

        def d(module, entry, groups, label, job=0, rnd=0):
            pipe, bg = self._bind(x, out, module, entry, job, rnd)
            return Dispatch(pipe, bg, groups, label)

        got = [d("sample", "penalize", (1, 1, S), "sample_penalize")] if draws.pen else []
        if draws.topk:  # top_p and min_p then look only inside the top_k set
            got += [d("sample_topk", "radix8", (P, 1, S), f"sample_radix8 k{r}", 0, r) for r in range(ROUNDS8)]
            got.append(d("sample_topk", "collect", (P, 1, S), f"sample_collect {self.n}"))
            got.append(d("sample_topk", "pick", (R, 1, S), "sample_pick"))
        if draws.full:
            got.append(d("sample", "slice_max", (P, 1, S), f"sample_max {self.n}"))
            for job, on in ((0, draws.full_k), (1, draws.full_p)):
                if on:
                    got += [d("sample", "radix", (P, 1, S), f"sample_radix {'kp'[job]}{r}", job, r) for r in range(ROUNDS)]
            got.append(d("sample", "draw", (P, R, S), f"sample_draw {self.n}"))
            got.append(d("sample", "merge", (R, 1, S), "sample_merge"))
        self._lists[key] = got
        return got

    def load(self, rows) -> Draws | None:
        """rows: (x row, out index, pos_at, params, seed, history) per sampled row, at most `slots`.
        Writes their settings (and the penalty windows of their histories) in one call; the
        dispatches() of what it returns draw them all. None: no rows."""
        S = len(rows)
        if S > self.slots:
            raise ValueError(f"at most {self.slots} sampled rows per step, got {S}")
        if not S:
            return None
        q = self.kern.dev.device.queue
        recs = np.zeros(S, PARAMS_DTYPE)
        for j, (xr, oi, pos_at, p, seed, history) in enumerate(rows):
            pack_slot(recs[j], self.n, p, int(seed), self.rows, xr * self.n, oi, pos_at, j * self.words,
                      j * self.seq_words, j)
            if ref.has_penalties(p):  # the window the penalty kernel reads: seq[len - window, len)
                hist = np.asarray(history, np.uint32)
                lo = 0 if p.repeat_last_n < 0 else max(0, hist.size - p.repeat_last_n)
                if hist.size > lo:
                    q.write_buffer(self.seq, 4 * (j * self.seq_words + lo), hist[lo:])
        q.write_buffer(self.params, 0, recs.tobytes())
        path, full = recs["path"], (recs["path"] & PATH_FULL) != 0
        return Draws(S, bool((path & PATH_PEN).any()), bool((path & PATH_TOPK).any()), bool(full.any()),
                     bool((recs["use_k"][full] != 0).any()), bool((recs["use_p"][full] != 0).any()))

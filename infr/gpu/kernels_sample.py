"""Sampling on the GPU (wgsl/sample.wgsl): the dispatches that turn a logits
buffer into the next token id, built once per buffer set.

`SampleKernels(kern, n_vocab, x, seq, state, out)` owns the scratch and
uniform buffers; `dispatches(params)` is the prebuilt list for one kind of
settings (greedy, top_k on/off and up to CAND_MAX or not, top_p on/off,
penalties on/off) and `set()`
writes the values (temperature, seed, ...) into the uniform, so a new request
with new values rebuilds nothing. The numpy twin is infr/cpu/sample.py.
"""

from __future__ import annotations

import numpy as np

from infr import numerics as ref
from infr.gpu import kernels_misc as KS
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.sampling import SamplingParams

SLICE = 4096  # values per workgroup in the full-vocabulary passes
ROUNDS = 8  # 4 key bits per radix round (sample.wgsl)
ROUNDS8 = 4  # 8 key bits per round (sample_topk.wgsl)
CAND_MAX = 1024  # top_k up to this many runs sample_topk.wgsl (its CAND_MAX)
NONE = 0xFFFFFFFF
MAX_PENALTY_WINDOW = 1024  # the penalty kernel is one workgroup, quadratic in the window


def parts_for(n: int) -> int:
    return max(1, -(-n // SLICE))


def scratch_words(n: int, rows: int) -> int:
    parts = parts_for(n)
    return 64 + 2 * parts + 128 * parts + 2 * rows * parts + 2 * 256 * parts + 2 * CAND_MAX


def takes_topk(params: SamplingParams, n: int) -> bool:
    """Whether these settings run the top_k path (sample_topk.wgsl): 6 dispatches."""
    c = ref.sampler_constants(params, n)
    return not params.greedy and c.use_k and c.top_k <= CAND_MAX


def supports(params: SamplingParams, n_ctx: int) -> bool:
    """Whether the GPU sampler runs these settings (penalties over a bounded window)."""
    if not ref.has_penalties(params):
        return True
    window = n_ctx + 1 if params.repeat_last_n < 0 else params.repeat_last_n
    return window <= MAX_PENALTY_WINDOW


def pack_params(n: int, params: SamplingParams, seed: int, rows: int = 1) -> bytes:
    c = ref.sampler_constants(params, n)
    fields = [
        ("n", "u32", n), ("parts", "u32", parts_for(n)), ("slice", "u32", SLICE),
        ("top_k", "u32", c.top_k), ("top_p", "f32", c.top_p), ("min_p_log", "f32", c.min_p_log),
        ("has_min_p", "u32", int(c.has_min_p)), ("inv_temp", "f32", c.inv_temp),
        ("seed_lo", "u32", seed & NONE), ("seed_hi", "u32", (seed >> 32) & NONE), ("rows", "u32", rows),
        ("use_k", "u32", int(c.use_k)), ("use_p", "u32", int(c.use_p)),
        ("pen_n", "u32", NONE if params.repeat_last_n < 0 else params.repeat_last_n),
        ("rep", "f32", params.repeat_penalty), ("rep_inv", "f32", c.rep_inv),
        ("freq", "f32", params.frequency_penalty), ("pres", "f32", params.presence_penalty),
    ]
    return KS._pack(fields)


class SampleKernels:
    """The sampler over logits `x` (n values): writes out[row] for rows 0..rows-1,
    row r drawn for position state[0] + 1 + r; `advance` appends out[0] to `seq`."""

    def __init__(self, kern: Kernels, n: int, x, seq, state, out, rows: int = 1):
        self.kern, self.n, self.rows = kern, int(n), int(rows)
        self.parts = parts_for(self.n)
        dev = kern.dev
        self.scratch = storage(dev, 4 * scratch_words(self.n, self.rows), label="sample.scratch")
        self.params = storage(dev, np.frombuffer(pack_params(self.n, SamplingParams(), 0, rows), np.uint8),
                              label="sample.params", uniform=True)
        self.counter = storage(dev, 16, label="sample.counter")
        self._bufs = [x, seq, state, self.scratch, out, self.counter]
        self._steps: dict[tuple[int, int], object] = {}
        self._argmax = KS.argmax_dispatches(kern, x, out, self.n)
        self._cache: dict[tuple, list[Dispatch]] = {}

    def _dispatch(self, entry: str, groups, job: int = 0, rnd: int = 0, label: str = "",
                  module: str = "sample") -> Dispatch:
        step = self._steps.get((job, rnd))
        if step is None:
            step = self._steps[(job, rnd)] = storage(self.kern.dev, np.array([job, rnd, 0, 0], np.uint32),
                                                     label="sample.step", uniform=True)
        pipe = self.kern.pipeline(module, entry)
        return Dispatch(pipe, self.kern.bind(pipe, [self.params, step, *self._bufs]), groups, label or f"sample_{entry}")

    def set(self, params: SamplingParams, seed: int) -> None:
        self.kern.dev.device.queue.write_buffer(self.params, 0, pack_params(self.n, params, seed, self.rows))

    def dispatches(self, params: SamplingParams, penalties: bool = True) -> list[Dispatch]:
        """The prebuilt list for settings of this kind (values come from set())."""
        c = ref.sampler_constants(params, self.n)
        pen = penalties and ref.has_penalties(params)
        key = (params.greedy, c.use_k, c.use_p, pen, takes_topk(params, self.n))
        if key in self._cache:
            return self._cache[key]
        out = [self._dispatch("penalize", (1, 1, 1))] if pen else []
        if params.greedy:
            out += self._argmax
        elif takes_topk(params, self.n):  # top_p and min_p then look only inside the top_k set
            P = self.parts
            out += [self._dispatch("radix8", (P, 1, 1), 0, r, f"sample_radix8 k{r}", "sample_topk")
                    for r in range(ROUNDS8)]
            out.append(self._dispatch("collect", (P, 1, 1), label=f"sample_collect {self.n}", module="sample_topk"))
            out.append(self._dispatch("pick", (self.rows, 1, 1), label="sample_pick", module="sample_topk"))
        else:
            P = self.parts
            # the slice maxima, by argmax's first pass, into scratch[PMAX] (byte 256: a valid binding offset)
            out.append(KS.slice_maxima_dispatch(self.kern, self._bufs[0], (self.scratch, 256, 8 * P), self._bufs[4],
                                                self.n, SLICE, label=f"sample_max {self.n}"))
            for job, on in ((0, c.use_k), (1, c.use_p)):
                if on:
                    out += [self._dispatch("radix", (P, 1, 1), job, r, f"sample_radix {'kp'[job]}{r}")
                            for r in range(ROUNDS)]
            out.append(self._dispatch("draw", (P, self.rows, 1), label=f"sample_draw {self.n}"))
            out.append(self._dispatch("merge", (self.rows, 1, 1)))
        self._cache[key] = out
        return out

    def advance(self) -> Dispatch:
        return self._dispatch("advance", (1, 1, 1))

"""Sampling on the GPU (wgsl/sample.wgsl): the dispatches that turn a logits
buffer into the next token id, built once per buffer set.

`SampleKernels(kern, n_vocab, x, seq, state, out)` owns the scratch and
uniform buffers; `dispatches(params)` is the prebuilt list for one kind of
settings (greedy, top_k on/off and up to CAND_MAX or not, top_p on/off,
penalties on/off) and `set()`
writes the values (temperature, seed, ...) into the uniform, so a new request
with new values rebuilds nothing. The numpy twin is infr/cpu/sample.py.

`StepSampling` is a step's: one sampler slot per sampled output row, each
reading its row of the step's logits buffer and its position from the graph's
`rows` buffer, their settings written in one call (GPUBackend.step and
decode_steps).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

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


def pack_params(n: int, params: SamplingParams, seed: int, rows: int = 1, x_off: int = 0, out_off: int = 0,
                pos_at: int = 0) -> bytes:
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
        ("x_off", "u32", x_off), ("out_off", "u32", out_off), ("pos_at", "u32", pos_at),
    ]
    return KS._pack(fields)


UNIFORM = 256  # bytes: a uniform range's offset alignment (WebGPU's minUniformBufferOffsetAlignment)


@dataclass(frozen=True)
class Place:
    """Where a sampler's own buffers are: (buffer, offset, size) ranges, so many samplers can
    share one buffer of each kind (StepSampling) and be written in one call."""

    params: tuple  # uniform: pack_params
    argmax: tuple  # uniform: the slice maxima's pack_argmax (its base is the row's x_off)
    scratch: tuple
    counter: tuple


def _whole(buf) -> tuple:
    return (buf, 0, buf.size)


class SampleKernels:
    """The sampler over logits x[x_off : x_off + n]: writes out[out_off + row] for rows
    0..rows-1, row r drawn for position state[pos_at] + 1 + r, after the penalties over the ids
    in `seq` (positions 0 .. state[pos_at]). Its params, scratch and counter are its own
    buffers, or the ranges `place` gives."""

    def __init__(self, kern: Kernels, n: int, x, seq, state, out, rows: int = 1, place: Place | None = None,
                 steps: dict | None = None):
        self.kern, self.n, self.rows = kern, int(n), int(rows)
        self.parts = parts_for(self.n)
        dev = kern.dev
        if place is None:
            params = storage(dev, np.frombuffer(pack_params(self.n, SamplingParams(), 0, rows), np.uint8),
                             label="sample.params", uniform=True)
            argmax = storage(dev, np.frombuffer(KS.pack_argmax(self.n, SLICE, self.parts), np.uint8),
                             label="sample.argmax", uniform=True)
            place = Place(_whole(params), _whole(argmax),
                          _whole(storage(dev, 4 * scratch_words(self.n, self.rows), label="sample.scratch")),
                          _whole(storage(dev, 16, label="sample.counter")))
        self.place = place
        self._bufs = [x, seq, state, place.scratch, out, place.counter]
        self._steps: dict[tuple[int, int], object] = {} if steps is None else steps  # (job, round) uniforms
        self._argmax = KS.argmax_dispatches(kern, x, out, self.n)
        self._cache: dict[tuple, list[Dispatch]] = {}

    def _dispatch(self, entry: str, groups, job: int = 0, rnd: int = 0, label: str = "",
                  module: str = "sample") -> Dispatch:
        step = self._steps.get((job, rnd))
        if step is None:
            step = self._steps[(job, rnd)] = storage(self.kern.dev, np.array([job, rnd, 0, 0], np.uint32),
                                                     label="sample.step", uniform=True)
        pipe = self.kern.pipeline(module, entry)
        return Dispatch(pipe, self.kern.bind(pipe, [self.place.params, step, *self._bufs]), groups,
                        label or f"sample_{entry}")

    def packed(self, params: SamplingParams, seed: int, x_off: int = 0, out_off: int = 0,
               pos_at: int = 0) -> tuple[bytes, bytes]:
        """The bytes of the two uniforms for these settings and this row."""
        return (pack_params(self.n, params, seed, self.rows, x_off, out_off, pos_at),
                KS.pack_argmax(self.n, SLICE, self.parts, x_off))

    def set(self, params: SamplingParams, seed: int, x_off: int = 0, out_off: int = 0, pos_at: int = 0) -> None:
        q = self.kern.dev.device.queue
        for (buf, offset, _), data in zip((self.place.params, self.place.argmax),
                                          self.packed(params, seed, x_off, out_off, pos_at)):
            q.write_buffer(buf, offset, data)

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
            buf, offset, _ = self.place.scratch
            out.append(KS.slice_maxima_dispatch(self.kern, self._bufs[0], (buf, offset + 256, 8 * P), self._bufs[4],
                                                self.n, SLICE, params=self.place.argmax, label=f"sample_max {self.n}"))
            for job, on in ((0, c.use_k), (1, c.use_p)):
                if on:
                    out += [self._dispatch("radix", (P, 1, 1), job, r, f"sample_radix {'kp'[job]}{r}")
                            for r in range(ROUNDS)]
            out.append(self._dispatch("draw", (P, self.rows, 1), label=f"sample_draw {self.n}"))
            out.append(self._dispatch("merge", (self.rows, 1, 1)))
        self._cache[key] = out
        return out



class StepSampling:
    """The samplers of a step's sampled output rows (temperature > 0), on the GPU: slot j draws
    output row i of the step's logits buffer (its row i) into out[i], for the position after
    state[pos_at] (the graph's `rows` buffer: batch row r's position at word 2 r), seeded by the
    row's seed, after its penalties over the history the host wrote into the slot's `seq`. Every
    slot's settings go up in one write a step; a slot's bind groups are built at its first use
    per (logits, out) pair and kept."""

    def __init__(self, kern: Kernels, n: int, n_ctx: int, state, slots: int):
        self.kern, self.n, self.state, self.slots = kern, int(n), state, int(slots)
        dev = kern.dev
        self.slot_bytes = 2 * UNIFORM  # the sampler's uniform, then its argmax's
        self.params = storage(dev, self.slots * self.slot_bytes, label="step_sample.params", uniform=True)
        self.scratch_bytes = -(-4 * scratch_words(self.n, 1) // UNIFORM) * UNIFORM
        self.scratch = storage(dev, self.slots * self.scratch_bytes, label="step_sample.scratch")
        self.counter = storage(dev, self.slots * UNIFORM, label="step_sample.counter")
        self.seq_words = -(-(n_ctx + 1) // 64) * 64  # a context's ids, at 256-byte strides
        self.seq = storage(dev, self.slots * 4 * self.seq_words, label="step_sample.seq")
        self._steps: dict = {}
        self._kernels: dict[tuple[int, int, int], tuple] = {}  # (id(x), id(out), slot) -> (x, out, kernels)

    def _slot(self, x, out, j: int) -> SampleKernels:
        key = (id(x), id(out), j)
        hit = self._kernels.get(key)
        if hit is None:
            place = Place((self.params, j * self.slot_bytes, UNIFORM), (self.params, j * self.slot_bytes + UNIFORM, 16),
                          (self.scratch, j * self.scratch_bytes, self.scratch_bytes), (self.counter, j * UNIFORM, 16))
            seq = (self.seq, 4 * j * self.seq_words, 4 * self.seq_words)
            hit = self._kernels[key] = (x, out, SampleKernels(self.kern, self.n, x, seq, self.state, out,
                                                              place=place, steps=self._steps))
        return hit[2]

    def load(self, x, out, rows) -> list[Dispatch]:
        """rows: (output index i, batch row r, OutputRow) per sampled row, at most `slots`. Writes
        their settings (and the penalty windows of their histories) and returns their dispatches."""
        if len(rows) > self.slots:
            raise ValueError(f"at most {self.slots} sampled rows per step, got {len(rows)}")
        q = self.kern.dev.device.queue
        data = np.zeros(len(rows) * self.slot_bytes, np.uint8)
        out_list: list[Dispatch] = []
        for j, (i, r, row) in enumerate(rows):
            sk = self._slot(x, out, j)
            p = row.params
            out_list += sk.dispatches(p)
            seed = int(p.seed) if p.seed is not None else secrets.randbits(63)
            a, b = sk.packed(p, seed, x_off=i * self.n, out_off=i, pos_at=2 * r)
            o = j * self.slot_bytes
            data[o:o + len(a)] = np.frombuffer(a, np.uint8)
            data[o + UNIFORM:o + UNIFORM + len(b)] = np.frombuffer(b, np.uint8)
            if ref.has_penalties(p):  # the window the penalty kernel reads: seq[len - window, len)
                hist = np.asarray(row.history, np.uint32)
                lo = 0 if p.repeat_last_n < 0 else max(0, hist.size - p.repeat_last_n)
                if hist.size > lo:
                    q.write_buffer(self.seq, 4 * (j * self.seq_words + lo), hist[lo:])
        if rows:
            q.write_buffer(self.params, 0, data)  # after every build: a new dispatch writes its slot's defaults
        return out_list

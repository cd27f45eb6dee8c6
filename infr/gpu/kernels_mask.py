"""Grammar masks on the GPU for a step's constrained rows (wgsl/step_mask.wgsl).

A row under a JSON-schema or tool grammar carries llguidance's token bitmask
(`OutputRow.mask`). One the GPU draws (greedy, or sampled without a host sampler, no logits wanted)
need not read its logits back: `StepMasks.load` packs the step's masks as u32
words into one array and uploads it with one `queue.write_buffer`, and the
dispatch `StepMasks.dispatch` gives (built once per logits buffer and row count)
sets the disallowed logits to -inf before the step's argmax and samplers, so only
token ids come back. A step without such rows uploads and encodes none of this.
Sampled constrained rows drawn on the GPU (kernels_sample.StepSampling) get their
masks the same way; rows with a host sampler keep the host path (`host_sample`).
"""

from __future__ import annotations

import numpy as np

from infr.gpu.runtime import Dispatch, Kernels, storage

HEAD = 64  # words of row indices before the masks: a step's output rows at most (backend.MAX_LOGIT_ROWS)
WG = 256  # tokens per workgroup (step_mask.wgsl)
NEG_INF = 0xFF800000  # the bits of f32 -inf


def pack_mask(mask, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """A uint8 token bitmask (bit i of byte i // 8, little-endian: infr.sampling.unpack_mask's
    order) as ceil(n / 32) u32 words, bit i % 32 of word i / 32 for token i, written into `out`
    (zeros) when given. Tokens past the mask's end are not allowed, nor bits past n, as on the host."""
    words = -(-n // 32)
    w = np.zeros(words, "<u4") if out is None else out
    b = np.asarray(mask, np.uint8).reshape(-1)[: 4 * words]
    w.view(np.uint8)[: b.size] = b
    if n % 32:
        w[-1] &= (1 << (n % 32)) - 1
    return w


def pack_params(n: int, words: int) -> bytes:
    return np.array([n, words, HEAD, NEG_INF], "<u4").tobytes()


class StepMasks:
    """The masks buffer of a backend (HEAD row indices, then up to HEAD masks of ceil(n / 32)
    words), its uniform, and the mask dispatch per (logits buffer, masked rows)."""

    def __init__(self, kernels: Kernels, n_vocab: int):
        self.kern, self.n = kernels, n_vocab
        self.words = -(-n_vocab // 32)
        groups = -(-n_vocab // WG)
        if groups > int(kernels.dev.limits.get("max-compute-workgroups-per-dimension", 65535)):
            raise ValueError(f"a vocabulary of {n_vocab} is past the mask kernel's grid")
        self.groups = groups
        self.buffer = storage(kernels.dev, 4 * (HEAD + HEAD * self.words), label="step_masks")
        self.params = storage(kernels.dev, np.frombuffer(pack_params(n_vocab, self.words), np.uint8),
                              label="step_mask.params", uniform=True)
        self.pipeline = kernels.pipeline("step_mask", "main")
        self._binds: dict[int, tuple] = {}  # id(logits buffer) -> (it, bind group): kept, so ids stay unique
        self._dispatches: dict[tuple[int, int], Dispatch] = {}
        self.uploads = 0  # steps whose masks were written (one write_buffer each)

    def load(self, outs, rows: list[int]) -> list[int]:
        """Pack the masks of output rows `rows` (indices into `outs`, each with a mask) and upload
        them in one write; returns the rows whose mask the GPU applies. A mask that allows no
        token stays with the host, which today gives the argmax of all -inf (token 0), or the
        row's sampler its error."""
        if len(rows) > HEAD:
            raise ValueError(f"at most {HEAD} masked rows per step, got {len(rows)}")
        W = self.words
        data = np.zeros(HEAD + len(rows) * W, "<u4")
        on: list[int] = []
        for i in rows:
            j = len(on)
            seg = pack_mask(outs[i].mask, self.n, data[HEAD + j * W: HEAD + (j + 1) * W])
            if not seg.any():
                continue  # all zeros still: the next row takes the slot
            data[j] = i  # the step's logits buffer holds output row i at row i
            on.append(i)
        if on:
            self.kern.dev.device.queue.write_buffer(self.buffer, 0, data[: HEAD + len(on) * W])
            self.uploads += 1
        return on

    def dispatch(self, logits_buf, m: int) -> Dispatch:
        """The mask dispatch over the first m masked rows `load` wrote, for this logits buffer."""
        key = (id(logits_buf), m)
        d = self._dispatches.get(key)
        if d is None:
            if id(logits_buf) not in self._binds:
                bg = self.kern.bind(self.pipeline, [self.params, logits_buf, self.buffer])
                self._binds[id(logits_buf)] = (logits_buf, bg)
            bg = self._binds[id(logits_buf)][1]
            d = self._dispatches[key] = Dispatch(self.pipeline, bg, (self.groups, m, 1), f"step_mask {self.n}x{m}")
        return d

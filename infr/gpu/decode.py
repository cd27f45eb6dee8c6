"""GPU-resident generation: sample on the GPU, keep tokens there, stream them back.

One compute pass per submit holds `per_submit` decode steps; a step is the
decode graph (embedding -> logits, built at load), the sampler
(infr/gpu/kernels_sample.py) writing the next token into the `ids` buffer
the next step's embedding reads, and `advance` (wgsl/step.wgsl `context`),
which appends the token to `seq` (the context's token ids, which the penalty
kernel reads) and moves the position in `state` (the sampler's) and `rows`
(rope's, the KV store's and attention's). Nothing is rebuilt per token: the
host only re-encodes prebuilt bind groups.

Token ids come back asynchronously: each submit copies its slice of `seq`
into a staging buffer of a small ring and maps it with map_async; the host
keeps `depth` submits in flight, so it encodes the next batch while the GPU
runs the earlier ones, and yields each batch's tokens as soon as its map
resolves. The first submit only samples from the prefill's logits, so the
first token streams without waiting for a batch of steps. The caller stops at end-of-generation; the few steps already in
flight past it only write KV entries beyond the accepted tokens, which the
next prefill overwrites.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from infr.errors import InfrError
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_sample as KSA
from infr.gpu import profile
from infr.gpu import tuning as TU
from infr.gpu.runtime import Dispatch, Recording, storage
from infr.sampling import SamplingParams



class ResidentDecoder:
    """The decode-and-sample loop of one GPUBackend (built once, on first use)."""

    def __init__(self, be):
        self.be = be
        dev = be.dev
        logits = be._logits_buffer(1, 1)  # the far graph's is the same buffer (one lowering)
        self.logits = logits
        self.n_vocab = be.plan.spec.n_vocab
        self.seq = storage(dev, 4 * (be.n_ctx + 1), label="seq")
        self.sampler = KSA.SampleKernels(be.kern, self.n_vocab, logits, self.seq, be.state, be.ids)
        self.forward = {}
        for far in (False, True):  # the step's graph: attention over near or far keys (GPUBackend.spans)
            body, head, _ = be._graph(1, 1, far)
            if be._logits_buffer(1, 1, far) is not logits:
                raise RuntimeError("the near and far decode graphs must share the logits buffer")
            self.forward[far] = body.dispatches + head.dispatches
        # The sampler's own `advance` moves state[0] alone; the step kernel also moves the rows.
        pipe = be.kern.pipeline("step", "context")
        self.advance = Dispatch(pipe, be.kern.bind(pipe, [be.ids, be.state, self.seq, be.rows]), (1, 1, 1), "advance")
        self._recordings: dict[int, tuple[Recording, dict[bool, Recording]]] = {}
        self._free: list = []  # staging buffers not in flight
        self.last = {}  # the latest stream's numbers: tokens, submits, host seconds

    def supports(self, params: SamplingParams) -> bool:
        return KSA.supports(params, self.be.n_ctx)

    def recordings(self, params: SamplingParams) -> tuple[Recording, dict[bool, Recording]]:
        """(first, steps): the sample from the prefill's logits, and a full decode
        step by span (False: near keys, True: far)."""
        sample = self.sampler.dispatches(params)
        key = id(sample)
        if key not in self._recordings:
            self._recordings[key] = (Recording(sample + [self.advance]),
                                     {far: Recording(f + sample + [self.advance]) for far, f in self.forward.items()})
        return self._recordings[key]

    def dispatches_per_token(self, params: SamplingParams) -> int:
        return len(self.recordings(params)[1][False])

    def _staging(self, size: int):
        import wgpu

        for i, buf in enumerate(self._free):
            if buf.size >= size:
                return self._free.pop(i)
        return self.be.dev.device.create_buffer(
            size=max(16, -(-size // 16) * 16), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
            label="token staging",
        )

    def stream(
        self, logits: np.ndarray, context: Sequence[int], n: int, params: SamplingParams,
        seed: int | None = None, per_submit: int | None = None, depth: int | None = None,
    ) -> Iterator[int]:
        """Yield n tokens sampled after `context` (whose KV the cache holds and whose
        last position produced `logits`): token j is drawn for position
        len(context) + j, and tokens 0 .. n-2 are run through the model."""
        P = len(context)
        if P < 1:
            raise InfrError("the GPU decode loop needs a non-empty context")
        if n <= 0:
            return
        if P + n - 1 > self.be.n_ctx:
            raise InfrError(f"context full: {P + n - 1} tokens do not fit in a context of {self.be.n_ctx}")
        if not self.supports(params):
            raise InfrError("these sampling settings need the host sampler (penalty window too long)")
        seed = secrets.randbits(63) if params.seed is None else int(params.seed)
        # Decode steps per submit and submits in flight (tuning: INFR_DECODE_PER_SUBMIT / _DEPTH). Steps
        # in flight past an end-of-generation token are wasted: at most per_submit * depth.
        per_submit = max(1, int(per_submit or TU.current().decode_per_submit))
        depth = max(1, int(depth or TU.current().decode_depth))
        be, q = self.be, self.be.dev.device.queue
        first, steps = self.recordings(params)
        if params.repeat_last_n != 0:  # the penalty kernel reads the context's ids
            q.write_buffer(self.seq, 0, np.asarray(context, np.uint32))
        q.write_buffer(self.logits, 0, np.ascontiguousarray(logits, np.float32))
        be._identity_table()
        q.write_buffer(be.state, 0, KS.pack_state(P - 1, 1))
        q.write_buffer(be.rows, 0, KS.pack_rows([P - 1], 0))
        self.sampler.set(params, seed)
        timer = profile.timer_for(be.dev)
        longest = max(len(st) for st in steps.values())
        if timer is not None:
            per_submit = max(1, min(per_submit, (profile.CAPACITY - 2) // longest))
            if longest + 2 > profile.CAPACITY:
                timer = None
        pending: deque = deque()
        # host seconds: encoding the passes, submitting them (lavapipe runs the work inside
        # submit), waiting for token maps
        stats = self.last = {"tokens": 0, "submits": 0, "encode_s": 0.0, "submit_s": 0.0, "wait_s": 0.0,
                             "dispatches_per_token": len(steps[False])}
        produced = 0

        def submit() -> None:
            nonlocal produced
            # The first submit only samples from the prefill's logits: the first token streams at once.
            k = 1 if produced == 0 else min(per_submit, n - produced)
            t0 = time.perf_counter()
            with profile.HostClock(timer, "encode"):
                enc = be.dev.device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                if produced == 0:
                    first.encode(cpass, times=1, timer=timer)
                else:  # step j runs token j - 1, at position P + j - 1
                    for far, times in be.spans(P + produced - 1, k):
                        steps[far].encode(cpass, times=times, timer=timer)
                cpass.end()
                buf = self._staging(4 * k)
                enc.copy_buffer_to_buffer(self.seq, 4 * (P + produced), buf, 0, 4 * k)
                cmd = profile.finish_encoder(enc, timer, k)
            t1 = time.perf_counter()
            with profile.HostClock(timer, "submit"):
                q.submit([cmd])
            pending.append((buf, buf.map_async("READ", 0, 4 * k), k))
            produced += k
            stats["submits"] += 1
            stats["encode_s"] += t1 - t0
            stats["submit_s"] += time.perf_counter() - t1

        try:
            while produced < n or pending:
                while produced < n and len(pending) < depth:
                    submit()
                buf, promise, k = pending.popleft()
                t0 = time.perf_counter()
                with profile.HostClock(timer, "wait"):
                    promise.sync_wait()
                stats["wait_s"] += time.perf_counter() - t0
                tokens = np.frombuffer(buf.read_mapped(0, 4 * k), np.uint32).tolist()
                buf.unmap()
                self._free.append(buf)
                for token in tokens:
                    stats["tokens"] += 1
                    yield token
        finally:  # stopped early (end of generation, or the caller closed us): settle the ring
            for buf, promise, _ in pending:
                promise.sync_wait()
                buf.unmap()
                self._free.append(buf)

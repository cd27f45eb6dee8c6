"""Host timing of dispatch sequences, shared by the kernel benchmarks in perf/."""

from __future__ import annotations

import time

from infr.gpu.runtime import Recording


def seconds_per_rep(dev, groups: list[list], reps: int, sink, best_of: int = 3) -> float:
    """Seconds per repetition: `reps` repetitions encoded in one compute pass,
    repetition i running dispatch group i % len(groups) (copies of the data,
    so nothing stays in L2), timed from submit to a 16-byte read of `sink`;
    a warm-up pass first, then the best of `best_of`."""
    rec = Recording([d for i in range(reps) for d in groups[i % len(groups)]])
    q = dev.device.queue

    def once() -> float:
        enc = dev.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        rec.encode(cp)
        cp.end()
        t0 = time.perf_counter()
        q.submit([enc.finish()])
        q.read_buffer(sink, 0, 16)
        return time.perf_counter() - t0

    once()
    return min(once() for _ in range(best_of)) / reps

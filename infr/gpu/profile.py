"""GPU time per dispatch from timestamp queries, host time per token.

While a profile is active the backend encodes its recordings with a timestamp
before the first dispatch of a pass and after each dispatch (the adapter's
`timestamp-query-inside-passes`; on Dawn, which has only pass timestamps, each
dispatch in a pass of its own), resolves them after the pass and reads them
all back when the profile ends, so the overlapped decode loop keeps running
ahead of the GPU. Off, nothing is encoded: the backend asks `timer_for(dev)`
once per submit and gets None.

    with profile() as p:
        model.session().generate(...)
    print(p.result.table())

`INFR_PROFILE=1` profiles the whole process and prints the table to stderr at
exit (any command); `INFR_PROFILE=path.json` writes the JSON there too.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

CAPACITY = 4096  # timestamps per query set (wgpu's largest)


class Timer:
    """Timestamp queries for one device; collects (label, bytes, ns) per dispatch. `per_pass`: the
    device writes timestamps only at pass boundaries (Dawn: its in-pass timestamps are another API),
    so a profiled recording puts each dispatch in a pass of its own (Recording.encode_passes); the
    span is the dispatch alone, the pass switch falling between spans."""

    def __init__(self, dev, per_pass: bool = False):
        BU = dev.api.BufferUsage
        self.dev, self.per_pass = dev, per_pass
        self.query_set = dev.device.create_query_set(type="timestamp", count=CAPACITY)
        self.resolve = dev.device.create_buffer(
            size=8 * CAPACITY, usage=BU.QUERY_RESOLVE | BU.COPY_SRC
        )
        self._labels: list = []
        self._pending: list[tuple[list, object]] = []
        self.host = {"encode": 0.0, "submit": 0.0, "wait": 0.0}
        self.tokens = 0

    @property
    def room(self) -> int:
        """Dispatches that can still be timed before the next flush."""
        left = CAPACITY - len(self._labels)
        return left // 2 if self.per_pass else left

    def take(self, dispatch, first: bool = False) -> int:
        self._labels.append(None if first else dispatch)
        return len(self._labels) - 1

    def flush(self, encoder) -> None:
        """After the pass ends: resolve this submit's timestamps into a buffer of their own."""
        BU = self.dev.api.BufferUsage
        n = len(self._labels)
        if not n:
            return
        staging = self.dev.device.create_buffer(size=8 * n, usage=BU.COPY_DST | BU.COPY_SRC)
        encoder.resolve_query_set(self.query_set, 0, n, self.resolve, 0)
        encoder.copy_buffer_to_buffer(self.resolve, 0, staging, 0, 8 * n)
        self._pending.append((self._labels, staging))
        self._labels = []

    def spans(self) -> list[tuple[object, int]]:
        """(dispatch, ns) for every timed dispatch so far, in order; reads the GPU once."""
        out = []
        q = self.dev.device.queue
        for labels, staging in self._pending:
            ts = np.frombuffer(q.read_buffer(staging), np.uint64).astype(np.int64)
            for i in range(1, len(labels)):
                if labels[i] is not None:
                    out.append((labels[i], max(0, int(ts[i] - ts[i - 1]))))
        self._pending.clear()
        return out


@dataclass
class KernelRow:
    label: str          # kernel and shape, e.g. "gemv_q4_k 4096x14336"
    kernel: str         # kernel name alone
    count: int
    total_us: float
    mean_us: float
    percent: float
    gbps: float | None  # weight bytes read per second, for weight ops


@dataclass
class ProfileResult:
    rows: list[KernelRow] = field(default_factory=list)
    gpu_us: float = 0.0     # sum of every timed dispatch
    tokens: int = 0         # tokens the profiled forward passes and decode steps ran
    dispatches: int = 0
    host_us: dict = field(default_factory=dict)  # encode / submit / wait, totals

    def by_kernel(self) -> dict[str, float]:
        """Total µs per kernel name (all shapes together)."""
        out: dict[str, float] = defaultdict(float)
        for r in self.rows:
            out[r.kernel] += r.total_us
        return dict(out)

    def table(self) -> str:
        lines = [f"{'kernel':<34} {'count':>7} {'total ms':>10} {'mean µs':>9} {'%':>6} {'GB/s':>8}"]
        for r in self.rows:
            gb = f"{r.gbps:8.0f}" if r.gbps else f"{'':>8}"
            lines.append(f"{r.label:<34} {r.count:>7} {r.total_us / 1e3:>10.3f} {r.mean_us:>9.2f} {r.percent:>6.1f} {gb}")
        per_tok = f", {self.gpu_us / self.tokens / 1e3:.3f} ms/token" if self.tokens else ""
        lines.append(f"GPU time {self.gpu_us / 1e3:.3f} ms over {self.dispatches} dispatches{per_tok}")
        if self.tokens:
            host = ", ".join(f"{k} {v / self.tokens:.1f}" for k, v in self.host_us.items())
            lines.append(f"host µs/token: {host} ({self.tokens} tokens)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)


def summarise(spans: list[tuple[object, int]], host: dict, tokens: int) -> ProfileResult:
    agg: dict[str, list] = {}
    for d, ns in spans:
        a = agg.setdefault(d.label or "?", [0, 0, 0])
        a[0] += 1
        a[1] += ns
        a[2] += d.bytes
    total = sum(a[1] for a in agg.values()) or 1
    rows = [
        KernelRow(label, label.split(" ")[0], n, ns / 1e3, ns / n / 1e3, 100.0 * ns / total,
                  (nbytes / ns) if nbytes and ns else None)  # bytes per ns = GB/s
        for label, (n, ns, nbytes) in agg.items()
    ]
    rows.sort(key=lambda r: -r.total_us)
    return ProfileResult(rows, sum(a[1] for a in agg.values()) / 1e3, tokens, sum(a[0] for a in agg.values()),
                         {k: v * 1e6 for k, v in host.items()})


class Profiler:
    def __init__(self, per_pass: bool = False):
        self.per_pass = per_pass  # a pass per dispatch even where in-pass timestamps exist (tests)
        self.timers: dict[int, Timer] = {}
        self.result: ProfileResult | None = None

    def timer(self, dev) -> Timer | None:
        inside = dev.has("timestamp-query-inside-passes")
        if not inside and not dev.has("timestamp-query"):
            return None
        t = self.timers.get(id(dev))
        if t is None:
            t = self.timers[id(dev)] = Timer(dev, per_pass=not inside or self.per_pass)
        return t

    def finish(self) -> ProfileResult:
        spans, host, tokens = [], defaultdict(float), 0
        for t in self.timers.values():
            spans += t.spans()
            for k, v in t.host.items():
                host[k] += v
            tokens += t.tokens
        self.result = summarise(spans, dict(host), tokens)
        return self.result


_active: Profiler | None = None


def timer_for(dev) -> Timer | None:
    """The active profile's timer for `dev`, or None (the fast path: profiling off)."""
    return _active.timer(dev) if _active is not None else None


@contextmanager
def profile(per_pass: bool = False):
    """Profile every GPU forward pass and decode step inside the block; `.result` after it."""
    global _active
    outer, _active = _active, Profiler(per_pass)
    p = _active
    try:
        yield p
    finally:
        _active = outer
        p.finish()


def finish_encoder(encoder, timer: Timer | None, tokens: int):
    """encoder.finish(), after resolving this submit's timestamps when profiling."""
    if timer is not None:
        timer.flush(encoder)
        timer.tokens += tokens
    return encoder.finish()


class HostClock:
    """Adds the seconds of a with-block to one of a timer's host counters (no-op without a timer)."""

    __slots__ = ("timer", "key", "t0")

    def __init__(self, timer: Timer | None, key: str):
        self.timer, self.key = timer, key

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.host[self.key] += time.perf_counter() - self.t0


_installed = False


def install_from_env() -> None:
    """INFR_PROFILE=1 (or a .json path): profile the process, report at exit."""
    global _active, _installed
    value = os.environ.get("INFR_PROFILE", "")
    if _installed or value in ("", "0"):
        return
    _installed = True
    _active = Profiler()
    prof = _active

    def report() -> None:
        res = prof.finish()
        print("\n" + res.table(), file=sys.stderr)
        if value.endswith(".json"):
            with open(value, "w") as f:
                json.dump(res.to_json(), f, indent=1)

    atexit.register(report)

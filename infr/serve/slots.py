"""Slots: `--parallel` independent KV caches over one set of loaded weights, and the metrics.

The CPU backend keeps its KV cache in numpy arrays on the backend object, so a slot is a
shallow copy of the backend with caches of its own (weights shared, read-only). The GPU
backend forks (GPUBackend.fork: the uploaded weights shared, its own KV cache, activations
and recorded graphs). Slots run in worker threads and interleave one forward pass at a time
(see _Serialised). A backend that can do neither gets one slot whatever `--parallel` says:
requests take turns on it, one whole request at a time, and the others wait in the pool's
queue (`infr_requests_waiting` in /metrics).

A request takes the idle slot whose cache shares the longest prefix with its prompt, so a
follow-up chat turn lands where its history is already cached.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import dataclass

import numpy as np

from infr.engine import Session, common_prefix


class _Serialised:
    """A backend whose forward passes take one process-wide lock. numpy's BLAS already uses
    every core for one pass; passes from several threads at once oversubscribe the cores and
    ran 10x slower when measured (16 streams on 4 slots). Slots still interleave per token."""

    def __init__(self, backend, lock: threading.Lock):
        self._backend = backend
        self._lock = lock

    def forward(self, *args, **kwargs):
        with self._lock:
            return self._backend.forward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._backend, name)


class _SlotModel:
    """The Model as a Session sees it, with this slot's backend."""

    def __init__(self, model, backend):
        self._model = model
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self._model, name)


def _fork_backend(backend):
    """A copy with fresh KV caches and shared weights, or None when the backend can
    neither fork nor has numpy caches to replace."""
    if callable(getattr(backend, "fork", None)):
        return backend.fork()
    k, v = getattr(backend, "k_cache", None), getattr(backend, "v_cache", None)
    if not isinstance(k, dict) or not all(isinstance(a, np.ndarray) for a in list(k.values()) + list(v.values())):
        return None
    twin = copy.copy(backend)
    twin.k_cache = {i: np.zeros_like(a) for i, a in k.items()}
    twin.v_cache = {i: np.zeros_like(a) for i, a in v.items()}
    return twin


@dataclass
class Slot:
    index: int
    session: Session
    busy: bool = False


class SlotPool:
    def __init__(self, model, parallel: int):
        self.model = model
        compute = threading.Lock()
        backends = [model.backend]
        for _ in range(parallel - 1):
            twin = _fork_backend(model.backend)
            if twin is None:  # one KV cache only: one slot (see the module note)
                backends = [model.backend]
                break
            backends.append(twin)
        # True when --parallel asked for more slots than the backend can hold caches for.
        self.shared = len(backends) < parallel
        if len(backends) == 1:  # one slot: nothing to serialise against
            self.slots = [Slot(0, Session(_SlotModel(model, model.backend)))]
        else:
            self.slots = [Slot(i, Session(_SlotModel(model, _Serialised(be, compute)))) for i, be in enumerate(backends)]
        self._cond: asyncio.Condition | None = None
        self.waiting = 0

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def acquire(self, prompt: list[int]) -> Slot:
        cond = self._condition()
        async with cond:
            self.waiting += 1
            try:
                while all(s.busy for s in self.slots):
                    await cond.wait()
            finally:
                self.waiting -= 1
            idle = [s for s in self.slots if not s.busy]
            best = max(idle, key=lambda s: (common_prefix(s.session.tokens, prompt), -s.index))
            best.busy = True
            return best

    async def release(self, slot: Slot) -> None:
        cond = self._condition()
        async with cond:
            slot.busy = False
            cond.notify()

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self.slots)


class Metrics:
    """Counters for `/metrics` in Prometheus' text format."""

    def __init__(self):
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.generated_tokens = 0
        self.cancelled = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.gen_seconds = 0.0

    def request(self, endpoint: str) -> None:
        self.requests[endpoint] = self.requests.get(endpoint, 0) + 1

    def error(self, status: int) -> None:
        key = str(status)
        self.errors[key] = self.errors.get(key, 0) + 1

    def finished(self, outcome) -> None:
        self.prompt_tokens += outcome.prompt_tokens
        self.reused_tokens += outcome.reused_tokens
        self.generated_tokens += outcome.completion_tokens
        if outcome.cancelled:
            self.cancelled += 1
        if outcome.completion_tokens or outcome.ttft:
            self.ttft_sum += outcome.ttft
            self.ttft_count += 1
        self.gen_seconds += outcome.gen_seconds

    def render(self, pool: SlotPool | None) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP infr_{name} {help_}")
            lines.append(f"# TYPE infr_{name} {kind}")
            for labels, value in samples:
                lines.append(f"infr_{name}{labels} {value:g}")

        metric("requests_total", "counter", "Requests received, by endpoint.",
               [(f'{{endpoint="{k}"}}', v) for k, v in sorted(self.requests.items())] or [("", 0)])
        metric("errors_total", "counter", "Error responses, by status.",
               [(f'{{status="{k}"}}', v) for k, v in sorted(self.errors.items())] or [("", 0)])
        metric("prompt_tokens_total", "counter", "Prompt tokens processed (cached ones included).",
               [("", self.prompt_tokens)])
        metric("prompt_tokens_reused_total", "counter", "Prompt tokens served from the KV cache.",
               [("", self.reused_tokens)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
        metric("requests_cancelled_total", "counter", "Generations stopped because the client left.",
               [("", self.cancelled)])
        metric("time_to_first_token_seconds", "summary", "Time from slot start to the first token.",
               [("_sum", self.ttft_sum), ("_count", self.ttft_count)])
        rate = self.generated_tokens / self.gen_seconds if self.gen_seconds > 0 else 0.0
        metric("tokens_per_second", "gauge", "Mean decode rate over all requests.", [("", rate)])
        if pool is not None:
            metric("slots_busy", "gauge", "Slots generating now.", [("", pool.busy)])
            metric("slots_idle", "gauge", "Slots free now.", [("", len(pool.slots) - pool.busy)])
            metric("requests_waiting", "gauge", "Requests queued for a slot.", [("", pool.waiting)])
        return "\n".join(lines) + "\n"

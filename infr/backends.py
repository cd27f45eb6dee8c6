"""Backend choice: the GPU when wgpu finds a hardware adapter, else the numpy reference.
`dawn` runs the GPU backend on Dawn (wgpudawn, an optional extra) instead of wgpu-native.

Kept apart from the engine so tools that need no tokenizer (the benchmark)
import only this.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Generator
from typing import Protocol

import numpy as np

from infr.batch import Batch, StepResult
from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.plan import Plan
from infr.sampling import SamplingParams
from infr.split import SplitOptions

BACKENDS = ("auto", "cpu", "gpu", "dawn")
GPU_BACKENDS = ("gpu", "dawn")  # the GPU backend on wgpu-native, and on Dawn


NVIDIA = 0x10DE  # PCI vendor id


def prefers_dawn(dev) -> bool:
    """Whether `auto` takes the Dawn tier for this wgpu adapter: an NVIDIA GPU, where Dawn ran every
    test of the comparison faster (f16 and subgroup matrices enabled, unchecked modules, the
    tensor-core prompt matmul: perf/README.md, 2026-12-05), with the optional wgpudawn installed."""
    return int(dev.info.get("vendor_id") or 0) == NVIDIA and importlib.util.find_spec("wgpudawn") is not None


def choose_backend(name: str) -> tuple[str, str | None]:
    """`auto` takes a hardware GPU when wgpu finds one (on Dawn where prefers_dawn
    and Dawn finds it too), else the CPU reference, with a note saying why. A
    software adapter (lavapipe) is slower than numpy, so only `--backend gpu` uses it."""
    if name not in BACKENDS:
        raise InfrError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return name, None
    from infr.gpu.device import NoAdapterError, get_device

    try:
        dev = get_device()
    except NoAdapterError as e:
        return "cpu", f"no GPU adapter ({e}); using the CPU reference"
    if dev.is_cpu:
        return "cpu", f"only a software adapter ({dev.name}); using the CPU reference (--backend gpu forces it)"
    if prefers_dawn(dev):
        try:
            dawn = get_device(flavor="dawn")
        except InfrError as e:
            return "gpu", f"Dawn finds no GPU ({e}); using wgpu-native"
        if not dawn.is_cpu and dawn.info.get("backend_type") != "Null":
            return "dawn", None
    return "gpu", None


def step_rows(name: str) -> int:
    """The most rows one step of backend `name` runs (its class's max_rows), known before it is made:
    the engine cuts its batch-token budget to it, and that budget sizes the window store."""
    if name == "cpu":
        from infr.cpu.backend import CPUBackend

        return CPUBackend.max_rows
    from infr.gpu.backend import GPUBackend

    return GPUBackend.max_rows  # a layer split's stages too (SplitBackend.max_rows)


def make_backend(name: str, gf: GGUFFile, plan: Plan, n_ctx: int, progress=None, kv_blocks=None,
                 max_seqs: int = 1, batch_tokens: int | None = None, cpu_moe: int = 0,
                 split: SplitOptions | None = None) -> "Backend":
    """`progress(stage, done, total)`, optional: the GPU backend's weight upload and graph build.
    `kv_blocks`: the KV store's size in blocks (default: one context), or a kvpool.KVBudget;
    `max_seqs`: sequences per step; `batch_tokens`: rows per step (with max_seqs, what sizes the
    sliding-window layers' store: kvpool.store_sizes); `cpu_moe`: the GPU backend runs the experts
    of the first cpu_moe MoE layers on the CPU (the CPU backend runs everything there already);
    `split`: `--split-mode layer` runs the GPU backend's layers over several devices (infr/gpu/split.py;
    the CPU backend has one device and ignores it)."""
    if name == "cpu":
        from infr.cpu.backend import CPUBackend

        return CPUBackend(gf, plan, n_ctx, kv_blocks=kv_blocks, max_seqs=max_seqs, batch_tokens=batch_tokens)
    from infr.gpu.backend import GPUBackend
    from infr.gpu.device import get_device

    flavor = "dawn" if name == "dawn" else "wgpu"
    if split is not None and split.layered:
        from infr.gpu.split import make_split

        return make_split(gf, plan, n_ctx, split, flavor, progress=progress, kv_blocks=kv_blocks,
                          max_seqs=max_seqs, batch_tokens=batch_tokens, cpu_moe=cpu_moe)
    dev = get_device(flavor=flavor)
    return GPUBackend(gf, plan, n_ctx, dev=dev, progress=progress, kv_blocks=kv_blocks, max_seqs=max_seqs,
                      batch_tokens=batch_tokens, cpu_moe=cpu_moe)


class RecurrentStates(Protocol):
    """A backend's per-slot recurrent (DeltaNet) state, saved and restored whole: the engine's prefix
    checkpoints (infr/checkpoints.py). Called only for plans with recurrent layers (Plan.recurrent)."""

    def save_state(self, slot: int) -> object:
        """An opaque snapshot of every recurrent layer's state of slot as it stands after the last
        step: a copy, unchanged by later steps of any slot."""
        ...

    def load_state(self, slot: int, snap: object, pos: int) -> None:
        """Slot's state becomes a copy of snap (from save_state), standing at position pos: its
        next row is at pos. The snapshot stays usable for other slots."""
        ...


class Backend(RecurrentStates, Protocol):
    """What the engine needs of a backend (infr/cpu/backend.py, infr/gpu/backend.py)."""

    name: str
    plan: Plan
    n_ctx: int
    n_blocks: int  # KV store size in blocks of block_size tokens (infr/kvpool.py)
    n_window_blocks: int  # the sliding-window layers' store, in blocks (n_blocks where it is as large)
    block_size: int
    kv_bytes_per_token: int  # KV cache bytes one token takes, all layers
    multi_step: int  # greedy decode steps decode_steps runs per call (1: none; the engine calls step)
    max_rows: int  # the most rows one step runs: the engine cuts its batch-token budget to it

    def step(self, batch: Batch) -> StepResult:
        """Every row of the batch through the model; one sampled token per output row."""
        ...

    def decode_steps(self, batch: Batch, k: int, stop: Callable[[], bool] | None = None
                     ) -> Generator[list[int], None, None]:
        """k steps of a batch of decode rows (greedy, or drawn by the device's sampler), tokens
        kept on the device (multi_step > 1): each step's tokens as they come back. Once stop()
        is true no step is started and those already running still come back: the caller keeps
        every step that ran, which a recurrent model's state needs. Closing it early lets the
        steps in flight finish (their tokens dropped)."""
        ...

    def free_memory(self) -> tuple[int, str] | None:
        """(free bytes, where) of the memory the KV store takes (kvpool.KVBudget), or None."""
        ...

    def warm(self, rows: int, far: bool = False) -> None:
        """Build ahead what a greedy decode step of `rows` rows runs (graphs, pipelines), its form for
        keys past the one-pass span with `far` (nothing where it has one form), so that the first such
        step does not pay for it: the engine calls it while idle. Runs nothing on the model."""
        ...

    def samples(self, params: SamplingParams) -> bool:
        """Whether step() and decode_steps draw a sampled row with these settings themselves (an
        output row without a host sampler, seeded by its params); else the caller gives a sampler."""
        ...

    def forward(self, tokens, start: int, n_logits: int = 1) -> np.ndarray:
        """One sequence at positions start.. over blocks 0.. (tools and tests, not the engine):
        the logits of the last n_logits rows."""
        ...

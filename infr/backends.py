"""Backend choice: the GPU when wgpu finds a hardware adapter, else the numpy reference.

Kept apart from the engine so tools that need no tokenizer (the benchmark)
import only this.
"""

from __future__ import annotations

from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.plan import Plan

BACKENDS = ("auto", "cpu", "gpu")


def choose_backend(name: str) -> tuple[str, str | None]:
    """`auto` takes a hardware GPU when wgpu finds one, else the CPU reference,
    with a note saying why. A software adapter (lavapipe) is slower than numpy,
    so only `--backend gpu` uses it."""
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
    return "gpu", None


def make_backend(name: str, gf: GGUFFile, plan: Plan, n_ctx: int, progress=None):
    """`progress(stage, done, total)`, optional: the GPU backend's weight upload and graph build."""
    if name == "cpu":
        from infr.cpu.backend import CPUBackend

        return CPUBackend(gf, plan, n_ctx)
    from infr.gpu.backend import GPUBackend

    return GPUBackend(gf, plan, n_ctx, progress=progress)

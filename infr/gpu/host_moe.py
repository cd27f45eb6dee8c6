"""`--cpu-moe N` (llama.cpp's --n-cpu-moe): the experts of the first N MoE layers stay in host
memory and run on the CPU reference (infr/cpu/moe.py); everything else, their router and shared
expert included, stays on the GPU.

Such a layer's MoE op lowers to a HostMoE step instead of dispatches: the graph's body becomes
a HostRecording, GPU runs with host steps between them. At each step the backend submits what
came before, reads the layer's input and router logits back, runs the experts on the host and
writes their sum into the op's output buffer, then records the rest in a new encoder. Correctness
over speed: one round trip per such layer and step, and no multi-step decode on the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from infr.cpu.moe import ExpertBank, ExpertCache, moe_forward
from infr.errors import InfrError
from infr.gpu.runtime import Dispatch, Recording
from infr.ops import MoE
from infr.plan import Plan

if TYPE_CHECKING:
    from infr.gpu.lowering import Lowering


def host_layers(plan: Plan, n: int) -> frozenset[int]:
    """The layers of the plan's first n MoE ops (all of them when n is larger)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InfrError(f"--cpu-moe takes a number of MoE layers (0 or more), got {n!r}")
    return frozenset(sorted({op.layer for op in plan.ops if isinstance(op, MoE)})[:n])


def host_banks(plan: Plan, layers: frozenset[int]) -> frozenset[str]:
    """The expert banks of those layers: kept in host memory, never uploaded."""
    return frozenset(b for op in plan.ops if isinstance(op, MoE) and op.layer in layers for b in op.banks)


class HostMoE:
    """One MoE op run on the host: src and router logits in, the experts' sum out, on the physical
    buffers the lowering chose for this graph."""

    def __init__(self, lower: Lowering, op: MoE):
        be = lower.be
        self.op = op
        self.src, self.logits = lower.current(op.src), lower.current(op.logits)
        self.dst = lower.target(op.dst, op.src, op.logits)
        self.width, self.label = be.widths[op.src], f"host_moe {op.layer}"
        cache = be.__dict__.setdefault("host_expert_cache", ExpertCache())
        banks = be.__dict__.setdefault("host_expert_banks", {})
        for name in op.banks:
            if name not in banks:
                banks[name] = ExpertBank(be.gf.tensor(name), cache)
        self.banks = [banks[name] for name in op.banks]
        self.q8 = op.q8 if op.q8 is not None else (False,) * len(op.banks)
        self.rounding = be.plan.q8_rounding
        self.scales = np.asarray(be.gf.tensor(op.scales).raw, np.float32) if op.scales else None  # gemma4's

    def run(self, dev, n: int) -> None:
        """The experts for the first n rows (the live ones; the GPU's writes before it are submitted)."""
        q, E = dev.device.queue, self.op.spec.n_expert
        h = np.frombuffer(q.read_buffer(self.src, 0, n * self.width * 4), np.float32).reshape(n, self.width)
        logits = np.frombuffer(q.read_buffer(self.logits, 0, n * E * 4), np.float32).reshape(n, E)
        out = moe_forward(h, logits, self.op.spec, self.banks, self.q8, self.rounding, self.scales)
        q.write_buffer(self.dst, 0, np.ascontiguousarray(out, np.float32))


class HostRecording(Recording):
    """A graph body with host steps: `parts` alternate Recordings of dispatches and HostMoE steps;
    `dispatches` lists the GPU's alone (counts and labels, as a Recording's)."""

    def __init__(self, items: list):
        super().__init__([d for d in items if isinstance(d, Dispatch)])
        self.parts: list = []
        run: list[Dispatch] = []
        for item in items:
            if isinstance(item, HostMoE):
                self.parts += [Recording(run), item]
                run = []
            else:
                run.append(item)
        self.parts.append(Recording(run))

    def encode(self, cpass, times: int = 1, timer=None) -> None:
        raise InfrError("a body with host MoE steps runs through GPUBackend._encode_body, not in one pass")


def recording(items: list) -> Recording:
    """A Recording of the lowered body, a HostRecording where it holds host steps."""
    return HostRecording(items) if any(isinstance(d, HostMoE) for d in items) else Recording(items)

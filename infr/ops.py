"""The op vocabulary of a plan: small frozen records over named buffers.

Every buffer holds one row per token of the batch being run ([T, width]).
Backends implement each op once; the GPU backend may fuse neighbours
(norm into the next matmul, gate and up with the activation) when lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.models.spec import Activation, AttentionSpec, RopeSpec


@dataclass(frozen=True)
class Embed:
    dst: str
    table: str  # tensor name; rows gathered by token id
    scale: float = 1.0


@dataclass(frozen=True)
class RMSNorm:
    dst: str
    src: str
    weight: str
    eps: float
    group: int | None = None  # normalise each group of this many values (per head)


@dataclass(frozen=True)
class MatMul:
    dst: str
    src: str
    weight: str  # [out, in] tensor: dst = src @ weight.T (+ bias)
    bias: str | None = None
    n_out: int = 0  # the output width the family declares (0: not declared); checked against the file
    # Its input rounded to 8 bits per 32 values (infr/numerics.py: takes_q8 of the weight's type),
    # set once from the file by infr.plan.bind; None in a plan not yet bound to a file.
    q8: bool | None = None


@dataclass(frozen=True)
class Rope:
    buf: str
    n_heads: int
    head_dim: int
    rope: RopeSpec


@dataclass(frozen=True)
class StoreKV:
    layer: int
    k: str
    v: str


@dataclass(frozen=True)
class Attention:
    dst: str
    q: str
    layer: int
    spec: AttentionSpec


@dataclass(frozen=True)
class GatedAct:
    dst: str
    gate: str
    up: str
    act: Activation


@dataclass(frozen=True)
class Add:
    dst: str
    a: str
    b: str


@dataclass(frozen=True)
class Softcap:
    buf: str
    cap: float


Op = Embed | RMSNorm | MatMul | Rope | StoreKV | Attention | GatedAct | Add | Softcap

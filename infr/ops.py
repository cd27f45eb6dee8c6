"""The op vocabulary of a plan: small frozen records over named buffers.

Every buffer holds one row per token of the batch being run ([T, width]).
Backends implement each op once; the GPU backend may fuse neighbours
(norm into the next matmul, gate and up with the activation) when lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.models.spec import Activation, AttentionSpec, MoESpec, QueryTemperature, RopeSpec


@dataclass(frozen=True)
class Embed:
    dst: str
    table: str  # tensor name; rows gathered by token id
    scale: float = 1.0


@dataclass(frozen=True)
class RMSNorm:
    dst: str
    src: str
    weight: str | None  # None: weightless (llama4's q/k norm after rope)
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


@dataclass(frozen=True)
class QueryTemp:
    """buf's rows (queries) times tau(position): llama4's temperature on its NoPE layers."""

    buf: str
    temp: QueryTemperature


@dataclass(frozen=True)
class MoE:
    """dst = the mixture of experts on src (spec: infr.models.spec.MoESpec), routed by the
    router's logits already in `logits` ([T, n_expert], an ordinary MatMul before it).

    banks: the expert weight banks, each [n_expert, out, in] in its GGUF block type:
    (gate, up, down), or (gate_up, down) when spec.fused_gate_up. A backend reads only the
    selected experts' blocks. q8: per bank, whether its matmuls take 8-bit-rounded inputs
    (numerics.takes_q8 of its type; set by infr.plan.bind, None before)."""

    dst: str
    src: str
    logits: str
    layer: int
    spec: MoESpec
    banks: tuple[str, ...]
    q8: tuple[bool, ...] | None = None


@dataclass(frozen=True)
class SigmoidGate:
    """buf *= sigmoid(src . weight), one scalar per row (weight: a vector of src's width):
    the gate of a shared expert (ffn_gate_inp_shexp)."""

    buf: str
    src: str
    weight: str


Op = Embed | RMSNorm | MatMul | Rope | StoreKV | Attention | GatedAct | Add | Softcap | QueryTemp | MoE | SigmoidGate

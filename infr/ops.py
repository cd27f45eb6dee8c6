"""The op vocabulary of a plan: small frozen records over named buffers.

Every buffer holds one row per token of the batch being run ([T, width]).
Backends implement each op once; the GPU backend may fuse neighbours
(norm into the next matmul, gate and up with the activation) when lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.models.spec import Activation, AttentionSpec, DeltaNetSpec, MoESpec, QueryTemperature, RopeSpec


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
    layer: int  # the layer whose cache it reads: its own, or a KV-shared layer's source (gemma4)
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
    scales: str | None = None  # gemma4's ffn_down_exps.scale [n_expert]: expert e's output times scales[e]

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.scales,) if self.scales else ()


@dataclass(frozen=True)
class SigmoidGate:
    """buf *= sigmoid(src . weight), one scalar per row (weight: a vector of src's width):
    the gate of a shared expert (ffn_gate_inp_shexp)."""

    buf: str
    src: str
    weight: str


@dataclass(frozen=True)
class HeadSlice:
    """dst = part `part` of each head's 2 * head_dim values of src: rows laid out per head as
    [first (head_dim) | second (head_dim)] (qwen35's attn_q: [q_h | gate_h])."""

    dst: str
    src: str
    n_heads: int
    head_dim: int
    part: int  # 0: the first head_dim values of each head, 1: the second


@dataclass(frozen=True)
class SigmoidMul:
    """buf *= sigmoid(gate), element by element (qwen35's gated attention output)."""

    buf: str
    gate: str


@dataclass(frozen=True)
class DeltaNet:
    """dst [T, n_v_heads * d_v] = a gated DeltaNet mixer's output before its output projection
    (wave2-families.md section 2.3), from its projections already in env: qkv [T, conv_dim],
    z (the output gate) [T, n_v_heads * d_v], beta and alpha [T, n_v_heads]. Token-serial per
    sequence; each sequence keeps, per layer, the conv's last d_conv - 1 inputs and a d_k x d_v
    matrix per V-head (the plan's RecurrentState). Weights: the conv [conv_dim, d_conv], dt bias
    and a (-exp(A_log)) [n_v_heads], the gated norm [d_v]."""

    dst: str
    qkv: str
    z: str
    beta: str
    alpha: str
    layer: int
    spec: DeltaNetSpec
    conv: str
    dt_bias: str
    a: str
    norm: str
    eps: float  # of the L2 norms of q and k and of the gated RMSNorm

    @property
    def tensors(self) -> tuple[str, ...]:
        return self.conv, self.dt_bias, self.a, self.norm


@dataclass(frozen=True)
class Mul:
    """buf = (buf * scale) * weight, weight a vector of buf's width or one value (gemma4's router input
    scale with scale 1 / sqrt(n_embd); its layer_output_scale with scale 1)."""

    buf: str
    weight: str
    scale: float = 1.0


@dataclass(frozen=True)
class PerLayerInputs:
    """gemma4's per-layer embeddings (wave2-families.md section 3.3), dst [T, n_layers * width]:
    ((rms(proj / sqrt(n_embd)) * norm per layer's width) + table[token] * sqrt(width)) / sqrt(2), proj
    the per_layer_model_proj matmul of the scaled embedding already in env. The table
    [n_vocab, n_layers * width] is read by row (its rows gathered from the file's blocks)."""

    dst: str
    proj: str
    table: str
    norm: str
    n_layers: int
    width: int
    n_embd: int
    eps: float

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.norm,)


@dataclass(frozen=True)
class PLEGate:
    """buf = act(buf) * layer `layer`'s part of the per-layer inputs ple ([T, width] of [T, n_layers * width])."""

    buf: str
    ple: str
    layer: int
    width: int
    act: Activation


Op = (Embed | RMSNorm | MatMul | Rope | StoreKV | Attention | GatedAct | Add | Softcap | QueryTemp | MoE | SigmoidGate
      | HeadSlice | SigmoidMul | DeltaNet | Mul | PerLayerInputs | PLEGate)

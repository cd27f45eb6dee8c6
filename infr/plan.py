"""Lower a `ModelSpec` into a plan: the ordered ops both backends execute.

The plan has three parts so a backend can run the head on the last row only
(prefill needs one row of logits, teacher forcing needs all of them). Its
`groups` cut the body into the runs a backend may fuse (infr/fusion.py).
`build_plan` needs only the family's spec; `bind` then reads the file once:
it checks the weights' shapes and sets each matmul's input numerics
(MatMul.q8), so no backend derives them from weight types while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from infr import fusion, numerics
from infr.errors import InfrError
from infr.models.spec import Activation, DeltaNetSpec, FFNSpec, LayerSpec, ModelSpec, MoESpec, ParallelFFN
from infr.ops import (Add, Attention, DeltaNet, Embed, GatedAct, HeadSlice, MatMul, MoE, Mul, Op, PerLayerInputs,
                      PLEGate, QueryTemp, RMSNorm, Rope, SigmoidGate, SigmoidMul, Softcap, StoreKV)


@dataclass(frozen=True)
class KVState:
    """What one attention layer keeps per sequence: keys and values, per token
    (a backend stores them in the engine's KV blocks, infr/kvpool.py)."""

    layer: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    window: int | None = None  # sliding window: only the last `window` positions are read

    @property
    def bytes_per_token(self) -> int:
        """f16 K and V of one token."""
        return 2 * self.n_kv_heads * (self.head_dim + self.v_head_dim)


@dataclass(frozen=True)
class RecurrentState:
    """What one recurrent (DeltaNet) layer keeps per sequence, whatever its length: the conv's
    last d_conv - 1 inputs [d_conv - 1, conv_dim] and a d_k x d_v matrix per V-head, f32. It
    cannot be rewound: a sequence that resumes anywhere but where its state stands must start
    again from position 0 (no prefix reuse)."""

    layer: int
    spec: DeltaNetSpec
    window = None  # no KV blocks
    bytes_per_token = 0

    @property
    def bytes_per_sequence(self) -> int:
        return 4 * self.spec.state_floats


LayerState = KVState | RecurrentState


@dataclass(frozen=True)
class Plan:
    spec: ModelSpec
    embed: tuple[Op, ...]
    layers: tuple[Op, ...]
    head: tuple[Op, ...]  # reads "x", writes "logits"
    state: tuple[LayerState, ...] = ()  # per layer, what a sequence keeps between steps
    # How the matmuls marked q8 round their activations (numerics.ROUNDINGS): infr's, or llama.cpp's
    # for the oracle tests; both backends read it here.
    q8_rounding: str = numerics.INFR
    # Where each layer's ops begin in `layers` (build_plan sets it): what a layer split cuts at (part).
    layer_starts: tuple[int, ...] = ()
    # Values a part of a plan reads before it writes them, with their widths: handed to it by the part
    # before (part; empty for a whole plan, whose embed writes them).
    inputs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        numerics.check_rounding(self.q8_rounding)

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.embed + self.layers + self.head

    @property
    def row_tables(self) -> frozenset[str]:
        """The tables read by row (token embeddings, gemma4's per-layer ones): a backend gathers their
        rows from the file's blocks and never expands the whole table at load."""
        return frozenset(op.table for op in self.embed if isinstance(op, (Embed, PerLayerInputs)))

    @property
    def kv(self) -> tuple[KVState, ...]:
        """The layers that keep keys and values (the engine's KV blocks)."""
        return tuple(st for st in self.state if isinstance(st, KVState))

    @property
    def recurrent(self) -> tuple[RecurrentState, ...]:
        """The layers that keep a fixed-size recurrent state per sequence."""
        return tuple(st for st in self.state if isinstance(st, RecurrentState))

    @property
    def recurrent_bytes_per_sequence(self) -> int:
        return sum(st.bytes_per_sequence for st in self.recurrent)

    @property
    def window(self) -> int | None:
        """The widest sliding window of the plan's window layers (None: every layer sees every
        position). The engine keeps those layers' KV in a pool of its own and gives blocks back once
        they fall out of this window (infr/kvseq.py)."""
        return max((st.window for st in self.state if st.window), default=None)

    def kv_bytes_per_token(self, windowed: bool | None = None) -> int:
        """KV bytes a token takes in every layer (None), in the window layers (True) or in the
        others (False): what a block of each pool costs per token."""
        return sum(st.bytes_per_token for st in self.state if windowed is None or bool(st.window) == windowed)

    @property
    def bound(self) -> bool:
        """Whether every matmul's input numerics are set (bind)."""
        return all(op.q8 is not None for op in self.ops if isinstance(op, (MatMul, MoE)))

    @property
    def expert_banks(self) -> frozenset[str]:
        """The MoE ops' expert banks ([n_expert, out, in]): a backend reads only the selected
        experts' blocks of these, never the whole tensor at load."""
        return frozenset(b for op in self.ops if isinstance(op, MoE) for b in op.banks)

    @property
    def cpu_only(self) -> tuple[str, ...]:
        """What in this plan has no GPU kernels yet (empty: the GPU backend can run it). Every op
        has them now (llama4's weightless q/k norm, query temperature and chunked attention, qwen35's
        gated attention and DeltaNet mixer, gemma4's per-layer inputs, table GELU, scaled values,
        expert scales and KV-shared layers included); an op added to the CPU reference first is
        named here until it does."""
        return ()

    @cached_property
    def groups(self) -> tuple[fusion.Group, ...]:
        """embed + layers as fusion groups (infr/fusion.py's kinds)."""
        return fusion.groups(self.embed + self.layers)

    @cached_property
    def widths(self) -> dict[str, int]:
        """Each named value's width (the widest it holds anywhere in the plan): what a backend sizes
        its activation buffers by."""
        out: dict[str, int] = dict(self.inputs)
        for op in self.ops:
            w = _width(op, out, self.spec)
            if w:
                out[op.dst] = max(out.get(op.dst, 0), w)
        return out

    @cached_property
    def carried(self) -> tuple[str, ...]:
        """The values that cross from one layer to the next: the residual stream "x" and what the
        embed part computes for every layer to read (gemma4's per-layer inputs "ple"). Every other
        value a layer reads it wrote itself (each layer begins by norming x), so a split of the
        plan between layers hands over exactly these."""
        written = {op.dst for op in self.embed if hasattr(op, "dst")} - {"x"}
        read = {v for op in self.layers for f in fields(op)
                if f.name != "dst" and isinstance(v := getattr(op, f.name), str)}
        return ("x",) + tuple(sorted(written & read))

    def part(self, first: int, last: int, embed: bool, head: bool) -> "Plan":
        """Layers first .. last - 1 as a plan of their own (a device's share of a layer split),
        with the embed part and the head where asked. A part without the embed reads the carried
        values (Plan.carried) as inputs, which the part before hands it."""
        if len(self.layer_starts) != self.spec.n_layers:
            raise InfrError("this plan does not mark where its layers begin (build_plan does)")
        if not 0 <= first <= last <= self.spec.n_layers:
            raise InfrError(f"layers {first}..{last - 1} are not in 0..{self.spec.n_layers - 1}")
        bounds = self.layer_starts + (len(self.layers),)
        widths = self.widths
        return replace(
            self, embed=self.embed if embed else (), layers=self.layers[bounds[first]:bounds[last]],
            head=self.head if head else (), state=tuple(st for st in self.state if first <= st.layer < last),
            layer_starts=tuple(b - bounds[first] for b in bounds[first:last]),
            inputs=() if embed else tuple((name, widths[name]) for name in self.carried))

    def weights(self) -> list[str]:
        names: list[str] = []
        for op in self.ops:
            for name in (getattr(op, "table", None), getattr(op, "weight", None), getattr(op, "bias", None),
                         getattr(getattr(op, "rope", None), "freq_factors", None), *getattr(op, "banks", ()),
                         *getattr(op, "tensors", ())):
                if name and name not in names:
                    names.append(name)
        return names


def _width(op: Op, known: dict[str, int], spec: ModelSpec) -> int:
    if isinstance(op, Embed):
        return spec.n_embd
    if isinstance(op, MatMul):
        return op.n_out
    if isinstance(op, Attention):
        return op.spec.n_heads * op.spec.v_head_dim
    if isinstance(op, RMSNorm):
        return known[op.src]
    if isinstance(op, GatedAct):
        return known[op.gate]
    if isinstance(op, Add):
        return known[op.a]
    if isinstance(op, MoE):
        return spec.n_embd
    if isinstance(op, HeadSlice):
        return op.n_heads * op.head_dim
    if isinstance(op, DeltaNet):
        return op.spec.n_v_heads * op.spec.d_v
    if isinstance(op, PerLayerInputs):
        return op.n_layers * op.width
    return 0  # ops that write in place (Rope, Softcap) or write no value (StoreKV)


def check_shapes(plan: Plan, gf) -> None:
    """Every matmul's weight has the shape the family declares: [n_out, width of its input]."""
    from infr.errors import InfrError

    now: dict[str, int] = dict(plan.inputs)  # each value's width where the op reads it
    for op in plan.ops:
        if isinstance(op, MatMul) and op.n_out:
            shape = tuple(int(d) for d in gf.tensor(op.weight).shape)
            if shape != (op.n_out, now[op.src]):
                raise InfrError(f"{op.weight} is {shape[0]} x {shape[-1]}, but the model's metadata "
                                f"makes it {op.n_out} x {now[op.src]}: a damaged or mislabelled GGUF")
        if isinstance(op, MoE):
            for name, want in zip(op.banks, bank_shapes(op, now[op.src])):
                shape = tuple(int(d) for d in gf.tensor(name).shape)
                if shape != want:
                    raise InfrError(f"{name} is {' x '.join(map(str, shape))}, but the model's metadata makes it "
                                    f"{' x '.join(map(str, want))}: a damaged or mislabelled GGUF")
        if isinstance(op, SigmoidGate):
            shape = tuple(int(d) for d in gf.tensor(op.weight).shape)
            if shape != (now[op.src],):
                raise InfrError(f"{op.weight} has shape {shape}, expected ({now[op.src]},)")
        for name, want in _vector_shapes(op, now, plan.spec.n_vocab):
            shape = tuple(int(d) for d in gf.tensor(name).shape)
            if shape not in want:
                raise InfrError(f"{name} has shape {shape}, but the model's metadata makes it "
                                f"{' or '.join(map(str, want))}: a damaged or mislabelled GGUF")
        if isinstance(op, DeltaNet):
            m = op.spec
            for name, want in zip(op.tensors, ((m.conv_dim, m.d_conv), (m.n_v_heads,), (m.n_v_heads,), (m.d_v,))):
                shape = tuple(int(d) for d in gf.tensor(name).shape)
                if shape != want:
                    raise InfrError(f"{name} has shape {shape}, but the model's metadata makes it {want}: "
                                    f"a damaged or mislabelled GGUF")
        w = _width(op, now, plan.spec)
        if w:
            now[op.dst] = w


def _vector_shapes(op: Op, now: dict[str, int], n_vocab: int) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
    """The non-matmul tensors of gemma4's ops and the shapes each may have."""
    if isinstance(op, Mul):
        return [(op.weight, ((now[op.buf],), (1,)))]
    if isinstance(op, MoE) and op.scales:
        return [(op.scales, ((op.spec.n_expert,),))]
    if isinstance(op, PerLayerInputs):
        return [(op.norm, ((op.width,),)), (op.table, ((n_vocab, op.n_layers * op.width),))]
    return []


def bind(plan: Plan, gf) -> Plan:
    """The plan for file gf, once at load: its weights' shapes checked (check_shapes) and each
    matmul not yet marked given its input numerics from its weight's type, MatMul.q8 =
    numerics.takes_q8 (the rounding both backends then apply as the op says). A plan whose
    matmuls are all marked comes back as it is."""
    check_shapes(plan, gf)
    if plan.bound:
        return plan

    def mark_one(op: Op) -> Op:
        if isinstance(op, MatMul) and op.q8 is None:
            return replace(op, q8=numerics.takes_q8(gf.tensor(op.weight).qtype))
        if isinstance(op, MoE) and op.q8 is None:
            return replace(op, q8=tuple(numerics.takes_q8(gf.tensor(b).qtype) for b in op.banks))
        return op

    def mark(ops: tuple[Op, ...]) -> tuple[Op, ...]:
        return tuple(mark_one(op) for op in ops)

    return replace(plan, embed=mark(plan.embed), layers=mark(plan.layers), head=mark(plan.head))


def bank_shapes(op: MoE, n_in: int) -> tuple[tuple[int, int, int], ...]:
    """The numpy shapes [n_expert, out, in] the MoE op's banks must have, in op.banks order."""
    m, e = op.spec, op.spec.n_expert
    up = ((e, 2 * m.hidden, n_in),) if m.fused_gate_up else ((e, m.hidden, n_in), (e, m.hidden, n_in))
    return up + ((e, n_in, m.hidden),)


def build_plan(spec: ModelSpec) -> Plan:
    embed: tuple[Op, ...] = (Embed("x", "token_embd.weight", spec.embed_scale),)
    if spec.per_layer_input:
        n = spec.n_layers * spec.per_layer_input
        embed += (MatMul("plp", "x", "per_layer_model_proj.weight", n_out=n),
                  PerLayerInputs("ple", "plp", "per_layer_token_embd.weight", "per_layer_proj_norm.weight",
                                 spec.n_layers, spec.per_layer_input, spec.n_embd, spec.norm_eps))
    layers: list[Op] = []
    starts: list[int] = []
    for layer in spec.layers:
        starts.append(len(layers))
        layers += _deltanet_block(spec, layer) if layer.mixer is not None else _attention_block(spec, layer)
        layers += _ffn_block(spec, layer)
        layers += _layer_tail(spec, layer)
    head: list[Op] = [RMSNorm("h", "x", "output_norm.weight", spec.norm_eps)]
    head.append(MatMul("logits", "h", "token_embd.weight" if spec.tied_embeddings else "output.weight",
                       n_out=spec.n_vocab))
    if spec.final_logit_softcap:
        head.append(Softcap("logits", spec.final_logit_softcap))
    state = tuple(RecurrentState(la.index, la.mixer) if la.mixer is not None else
                  KVState(la.index, la.attention.n_kv_heads, la.attention.head_dim, la.attention.v_head_dim,
                          la.attention.sliding_window) for la in spec.layers if la.kv_from is None)
    return Plan(spec, embed, tuple(layers), tuple(head), state, layer_starts=tuple(starts))


def _attention_block(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    a = layer.attention
    p = f"blk.{layer.index}."
    own_kv = layer.kv_from is None  # a KV-shared layer (gemma4) projects only its queries
    ops: list[Op] = [RMSNorm("h", "x", p + "attn_norm.weight", spec.norm_eps)]
    widths = {"q": a.n_heads * a.head_dim, "k": a.n_kv_heads * a.head_dim, "v": a.n_kv_heads * a.v_head_dim}
    if a.output_gate:  # attn_q's rows: per head [q_h | gate_h]
        widths["q"] *= 2
    names = ["q"]
    if own_kv:
        names += ["k"] if a.v_from_k else ["k", "v"]
    for name in names:
        bias = p + f"attn_{name}.bias" if a.qkv_bias else None
        ops.append(MatMul("qg" if name == "q" and a.output_gate else name, "h", p + f"attn_{name}.weight", bias,
                          widths[name]))
    if a.v_norm and own_kv:  # weightless, per head; from the raw K projection where there is no attn_v
        ops.append(RMSNorm("v", "k" if a.v_from_k else "v", None, spec.norm_eps, group=a.v_head_dim))
    if a.output_gate:
        ops.append(HeadSlice("q", "qg", a.n_heads, a.head_dim, 0))
        ops.append(HeadSlice("gate", "qg", a.n_heads, a.head_dim, 1))
    if a.qk_norm:
        ops.append(RMSNorm("q", "q", p + "attn_q_norm.weight", spec.norm_eps, group=a.head_dim))
        if own_kv:
            ops.append(RMSNorm("k", "k", p + "attn_k_norm.weight", spec.norm_eps, group=a.head_dim))
    if a.rope is not None:
        ops.append(Rope("q", a.n_heads, a.head_dim, a.rope))
        if own_kv:
            ops.append(Rope("k", a.n_kv_heads, a.head_dim, a.rope))
    if a.qk_rms_after_rope:
        ops.append(RMSNorm("q", "q", None, spec.norm_eps, group=a.head_dim))
        ops.append(RMSNorm("k", "k", None, spec.norm_eps, group=a.head_dim))
    if a.temperature is not None:
        ops.append(QueryTemp("q", a.temperature))
    if own_kv:
        ops.append(StoreKV(layer.index, "k", "v"))
    ops.append(Attention("attn", "q", layer.index if own_kv else layer.kv_from, a))
    if a.output_gate:
        ops.append(SigmoidMul("attn", "gate"))
    ops.append(MatMul("o", "attn", p + "attn_output.weight", n_out=spec.n_embd))
    if layer.post_attn_norm:
        ops.append(RMSNorm("o", "o", p + "post_attention_norm.weight", spec.norm_eps))
    ops.append(Add("x", "x", "o"))
    return ops


def _deltanet_block(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    """A gated DeltaNet layer's mixer: its four projections, the recurrence (one DeltaNet op, which
    keeps the sequence's state), the output projection, the residual add."""
    m = layer.mixer
    assert m is not None
    p = f"blk.{layer.index}."
    ops: list[Op] = [RMSNorm("h", "x", p + "attn_norm.weight", spec.norm_eps)]
    ops.append(MatMul("qkv", "h", p + "attn_qkv.weight", n_out=m.conv_dim))
    ops.append(MatMul("z", "h", p + "attn_gate.weight", n_out=m.n_v_heads * m.d_v))
    ops.append(MatMul("beta", "h", p + "ssm_beta.weight", n_out=m.n_v_heads))
    ops.append(MatMul("alpha", "h", p + "ssm_alpha.weight", n_out=m.n_v_heads))
    ops.append(DeltaNet("dn", "qkv", "z", "beta", "alpha", layer.index, m, p + "ssm_conv1d.weight",
                        p + "ssm_dt.bias", p + "ssm_a", p + "ssm_norm.weight", spec.norm_eps))
    ops.append(MatMul("o", "dn", p + "ssm_out.weight", n_out=spec.n_embd))
    ops.append(Add("x", "x", "o"))
    return ops


def _ffn_block(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    """The FFN of one layer, by its kind: dense (FFNSpec) or a mixture of experts (MoESpec)."""
    if isinstance(layer.ffn, MoESpec):
        return _moe_block(spec, layer)
    if isinstance(layer.ffn, ParallelFFN):
        return _parallel_block(spec, layer)
    if not isinstance(layer.ffn, FFNSpec):
        raise InfrError(f"layer {layer.index}: unknown FFN kind {type(layer.ffn).__name__}")
    f = layer.ffn
    p = f"blk.{layer.index}."
    ops: list[Op] = [RMSNorm("h", "x", p + layer.ffn_norm + ".weight", spec.norm_eps)]
    ops.append(MatMul("g", "h", p + "ffn_gate.weight", n_out=f.hidden))
    ops.append(MatMul("u", "h", p + "ffn_up.weight", n_out=f.hidden))
    ops.append(GatedAct("g", "g", "u", f.activation))
    ops.append(MatMul("f", "g", p + "ffn_down.weight", n_out=spec.n_embd))
    if layer.post_ffn_norm:
        ops.append(RMSNorm("f", "f", p + "post_ffw_norm.weight", spec.norm_eps))
    ops.append(Add("x", "x", "f"))
    return ops


def _moe_block(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    """Router matmul, the experts (one MoE op), the shared expert as a dense gated FFN (scaled
    by its sigmoid gate where it has one) added to their sum, then the residual add: llama.cpp's
    order of sums, ((experts) + shared) + x."""
    m = layer.ffn
    assert isinstance(m, MoESpec)
    p = f"blk.{layer.index}."
    ops: list[Op] = [RMSNorm("h", "x", p + layer.ffn_norm + ".weight", spec.norm_eps)]
    ops.append(MatMul("router", "h", p + "ffn_gate_inp.weight", n_out=m.n_expert))
    banks = (("ffn_gate_up_exps",) if m.fused_gate_up else ("ffn_gate_exps", "ffn_up_exps")) + ("ffn_down_exps",)
    ops.append(MoE("f", "h", "router", layer.index, m, tuple(p + b + ".weight" for b in banks)))
    if m.shared is not None:
        sh = m.shared
        ops.append(MatMul("g", "h", p + "ffn_gate_shexp.weight", n_out=sh.hidden))
        ops.append(MatMul("u", "h", p + "ffn_up_shexp.weight", n_out=sh.hidden))
        ops.append(GatedAct("g", "g", "u", sh.activation))
        ops.append(MatMul("s", "g", p + "ffn_down_shexp.weight", n_out=spec.n_embd))
        if sh.gated:
            ops.append(SigmoidGate("s", "h", p + "ffn_gate_inp_shexp.weight"))
        ops.append(Add("f", "f", "s"))
    if layer.post_ffn_norm:
        ops.append(RMSNorm("f", "f", p + "post_ffw_norm.weight", spec.norm_eps))
    ops.append(Add("x", "x", "f"))
    return ops


def _parallel_block(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    """gemma4's dense FFN beside its routed experts (ParallelFFN), the router on the raw residual,
    then post_ffw_norm of their sum and the residual add: llama.cpp's order of norms and sums."""
    pf = layer.ffn
    assert isinstance(pf, ParallelFFN)
    f, m = pf.dense, pf.moe
    p = f"blk.{layer.index}."
    eps = spec.norm_eps
    ops: list[Op] = [RMSNorm("h", "x", p + layer.ffn_norm + ".weight", eps)]
    ops.append(MatMul("g", "h", p + "ffn_gate.weight", n_out=f.hidden))
    ops.append(MatMul("u", "h", p + "ffn_up.weight", n_out=f.hidden))
    ops.append(GatedAct("g", "g", "u", f.activation))
    ops.append(MatMul("f", "g", p + "ffn_down.weight", n_out=spec.n_embd))
    ops.append(RMSNorm("h", "x", p + "pre_ffw_norm_2.weight", eps))
    ops.append(RMSNorm("r", "x", None, eps))
    ops.append(Mul("r", p + "ffn_gate_inp.scale", 1.0 / float(np.sqrt(np.float32(spec.n_embd)))))
    ops.append(MatMul("router", "r", p + "ffn_gate_inp.weight", n_out=m.n_expert))
    banks = (("ffn_gate_up_exps",) if m.fused_gate_up else ("ffn_gate_exps", "ffn_up_exps")) + ("ffn_down_exps",)
    ops.append(MoE("m", "h", "router", layer.index, m, tuple(p + b + ".weight" for b in banks),
                   scales=p + "ffn_down_exps.scale" if pf.expert_scales else None))
    ops.append(RMSNorm("m", "m", p + "post_ffw_norm_2.weight", eps))
    # the dense FFN's post-norm here, not after its down (nothing reads f in between): with the sum's
    # norm and the add after them, the experts' combine does all three (fusion.py's moe_post_norms)
    ops.append(RMSNorm("f", "f", p + "post_ffw_norm_1.weight", eps))
    ops.append(Add("f", "f", "m"))
    ops.append(RMSNorm("f", "f", p + "post_ffw_norm.weight", eps))
    ops.append(Add("x", "x", "f"))
    return ops


def _layer_tail(spec: ModelSpec, layer: LayerSpec) -> list[Op]:
    """What follows the FFN's residual add in gemma4: the per-layer embedding's branch (its gate
    on the stream times this layer's per-layer input, projected back, normed, added) and the
    layer's output scale."""
    p = f"blk.{layer.index}."
    ops: list[Op] = []
    if spec.per_layer_input:
        ops.append(MatMul("pg", "x", p + "inp_gate.weight", n_out=spec.per_layer_input))
        ops.append(PLEGate("pg", "ple", layer.index, spec.per_layer_input, Activation.GELU_F16))
        ops.append(MatMul("pp", "pg", p + "proj.weight", n_out=spec.n_embd))
        ops.append(RMSNorm("pp", "pp", p + "post_norm.weight", spec.norm_eps))
        ops.append(Add("x", "x", "pp"))
    if layer.output_scale:
        ops.append(Mul("x", p + "layer_output_scale.weight"))
    return ops

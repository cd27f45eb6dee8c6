"""Typed model specs: what a model is, per layer, with no loops or kernels.

A family module (llama.py, gemma3.py, ...) reads GGUF metadata and returns a
`ModelSpec`; `infr.plan` lowers it into ops. Later families add kinds (a MoE
FFN, a DeltaNet mixer) rather than branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np


class RopeStyle(str, Enum):
    NORM = "norm"  # rotate adjacent pairs (x[2i], x[2i+1]): llama
    NEOX = "neox"  # rotate halves (x[i], x[i + d/2]): qwen, gemma
    # multi-section rope (qwen35): NEOX pairs, pair i turning by the position of its section; a text
    # token's positions are [p, p, p, 0] over the sections, which makes it NEOX over n_rot dims
    IMROPE = "imrope"


class Activation(str, Enum):
    SILU = "silu"
    GELU = "gelu"  # tanh approximation, as gemma and llama.cpp use
    # the tanh GELU as llama.cpp's CPU backend computes it (GGML_GELU_FP16): f16(gelu(f16(x))) from a
    # table for -10 < x < 10, 0 below, x above; gemma4's oracle differs from exact GELU by ~1e-4 otherwise
    GELU_F16 = "gelu_f16"


@dataclass(frozen=True)
class RopeSpec:
    style: RopeStyle
    theta: float
    n_rot: int  # leading dims of each head that rotate
    freq_scale: float = 1.0  # linear position scaling
    freq_factors: str | None = None  # tensor of per-frequency divisors (llama 3)
    sections: tuple[int, ...] | None = None  # IMROPE's rope.dimension_sections (4 counts of pairs)


@dataclass(frozen=True)
class AttentionSpec:
    n_heads: int
    n_kv_heads: int
    head_dim: int  # of queries and keys
    v_head_dim: int
    rope: RopeSpec | None
    scale: float  # multiplies q.k
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k before rope
    sliding_window: int | None = None  # keys with q_pos - k_pos >= window are masked
    softcap: float | None = None  # tanh cap on the scores
    # llama4's options (wave2-families.md section 4):
    qk_rms_after_rope: bool = False  # weightless RMSNorm over each head of q and k after rope
    chunk: int | None = None  # chunked attention: keys before floor(q_pos / chunk) * chunk are masked
    temperature: "QueryTemperature | None" = None  # queries scaled by a factor of their position
    # qwen35: attn_q's rows are per head [q_h | gate_h]; the attention output is times sigmoid(gate)
    output_gate: bool = False
    # gemma4: V is the raw K projection where a layer has no attn_v; a weightless RMSNorm on each V head
    v_from_k: bool = False
    v_norm: bool = False


@dataclass(frozen=True)
class QueryTemperature:
    """Queries multiplied by tau(p) = log(floor((p + offset) / floor_scale) + 1) * scale + 1
    (llama4's NoPE layers; tau = 1 below floor_scale - offset)."""

    floor_scale: int
    scale: float
    offset: float = 1.0

    def factor(self, pos) -> np.ndarray:
        """tau per position, float32 (llama.cpp computes it in double and stores a float)."""
        p = np.asarray(pos, np.float64)
        scale = float(np.float32(self.scale))  # a float constant in llama.cpp
        return (np.log(np.floor((p + self.offset) / self.floor_scale) + 1.0) * scale + 1.0).astype(np.float32)


@dataclass(frozen=True)
class FFNSpec:
    hidden: int
    activation: Activation
    gated: bool = True  # act(gate(x)) * up(x)


class Gating(str, Enum):
    SOFTMAX = "softmax"  # p = softmax over every expert's logit
    SIGMOID = "sigmoid"  # p = sigmoid of each logit


@dataclass(frozen=True)
class SharedExpert:
    """An always-on expert beside the routed ones: a dense gated FFN (ffn_{gate,up,down}_shexp),
    optionally scaled per token by sigmoid(ffn_gate_inp_shexp . x)."""

    hidden: int
    activation: Activation = Activation.SILU
    gated: bool = False  # scaled by sigmoid(ffn_gate_inp_shexp . x)


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts FFN (llama.cpp's build_moe_ffn): a router picks n_used of n_expert
    gated FFNs per token, their outputs are summed weighted by the router's probabilities.

    logits = ffn_gate_inp . x; p = gating(logits); the n_used largest of p (or of the raw logits,
    select_on_logits) are chosen, in descending order; w_e = p_e, divided by
    max(sum w, 6.103515625e-5) when norm_weights, times weight_scale when it is set and not 1.
    Expert e: y_e = down_e . act(gate_e . x) * (up_e . x), with the input x * w_e when weight_before
    (llama4) or the output y_e * w_e otherwise; out = y_0 + y_1 + ... in selection order."""

    n_expert: int
    n_used: int
    hidden: int  # each expert's FFN width
    activation: Activation = Activation.SILU
    gating: Gating = Gating.SOFTMAX
    select_on_logits: bool = False
    norm_weights: bool = True
    weight_scale: float | None = None
    weight_before: bool = False
    fused_gate_up: bool = False  # one ffn_gate_up_exps bank: gate rows then up rows per expert
    shared: SharedExpert | None = None


@dataclass(frozen=True)
class ParallelFFN:
    """gemma4's MoE layers (wave2-families.md section 3.3): a dense GeGLU FFN (its pre-norm ffn_norm,
    post-norm post_ffw_norm_1) beside a routed MoE (pre-norm pre_ffw_norm_2, post-norm post_ffw_norm_2),
    their sum then post_ffw_norm'd. The router reads the RAW residual: rms(x) / sqrt(n_embd) times
    ffn_gate_inp.scale; expert_scales: each expert's output times ffn_down_exps.scale[e]."""

    dense: FFNSpec
    moe: MoESpec
    expert_scales: bool = False


@dataclass(frozen=True)
class DeltaNetSpec:
    """A gated DeltaNet mixer (qwen35, wave2-families.md section 2.3): a causal depthwise conv over
    the [q | k | v] projection, L2-normed q and k, and per V-head a d_k x d_v state updated by the
    gated delta rule; V-head h reads K-head h mod n_k_heads (the GGUF's tiled order)."""

    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    d_k: int  # ssm.state_size
    d_v: int  # ssm.inner_size / n_v_heads
    d_conv: int  # ssm.conv_kernel

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v

    @property
    def state_floats(self) -> int:
        """f32 values a sequence keeps for this layer: the conv's last d_conv - 1 inputs and the matrices."""
        return (self.d_conv - 1) * self.conv_dim + self.n_v_heads * self.d_k * self.d_v


@dataclass(frozen=True)
class LayerSpec:
    index: int
    attention: AttentionSpec  # the model's attention shape (unused where mixer is set)
    ffn: "FFNSpec | MoESpec | ParallelFFN"
    post_attn_norm: bool = False  # norm the attention output before the residual add
    post_ffn_norm: bool = False
    mixer: DeltaNetSpec | None = None  # a recurrent mixer in place of the attention
    ffn_norm: str = "ffn_norm"  # the FFN's pre-norm tensor (qwen35: post_attention_norm)
    # gemma4: a KV-shared layer reads layer kv_from's cache and keeps none of its own (no K/V projection)
    kv_from: int | None = None
    output_scale: bool = False  # the layer's output times layer_output_scale.weight (one value)


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    name: str
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    layers: tuple[LayerSpec, ...]
    tied_embeddings: bool
    embed_scale: float = 1.0
    final_logit_softcap: float | None = None
    per_layer_input: int = 0  # gemma4's per-layer embeddings (PLE): their width per layer (0: none)
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def recurrent(self) -> bool:
        return any(layer.mixer is not None for layer in self.layers)

    @property
    def moe(self) -> bool:
        return any(isinstance(layer.ffn, (MoESpec, ParallelFFN)) for layer in self.layers)

    def describe(self) -> str:
        a0 = self.layers[0].attention
        windows = sorted({layer.attention.sliding_window for layer in self.layers}, key=str)
        return (
            f"{self.arch} '{self.name}': {self.n_layers} layers, d={self.n_embd}, "
            f"heads {a0.n_heads}/{a0.n_kv_heads}x{a0.head_dim}, vocab {self.n_vocab}, "
            f"windows {windows}"
        ) + self._describe_moe() + self._describe_mixers()

    def _describe_mixers(self) -> str:
        dn = [layer.mixer for layer in self.layers if layer.mixer is not None]
        if not dn:
            return ""
        m = dn[0]
        return (f", DeltaNet on {len(dn)} of {self.n_layers} layers: {m.n_v_heads} v-heads / {m.n_k_heads} k-heads "
                f"x {m.d_k}, conv {m.d_conv}")

    def _describe_moe(self) -> str:
        moe = [layer.ffn.moe if isinstance(layer.ffn, ParallelFFN) else layer.ffn for layer in self.layers
               if isinstance(layer.ffn, (MoESpec, ParallelFFN))]
        if not moe:
            return ""
        m = moe[0]
        return (f", MoE on {len(moe)} layers: {m.n_used} of {m.n_expert} experts x {m.hidden}"
                + (f" + shared {m.shared.hidden}" if m.shared else ""))

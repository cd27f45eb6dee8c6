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


class Activation(str, Enum):
    SILU = "silu"
    GELU = "gelu"  # tanh approximation, as gemma and llama.cpp use


@dataclass(frozen=True)
class RopeSpec:
    style: RopeStyle
    theta: float
    n_rot: int  # leading dims of each head that rotate
    freq_scale: float = 1.0  # linear position scaling
    freq_factors: str | None = None  # tensor of per-frequency divisors (llama 3)


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
class LayerSpec:
    index: int
    attention: AttentionSpec
    ffn: "FFNSpec | MoESpec"
    post_attn_norm: bool = False  # norm the attention output before the residual add
    post_ffn_norm: bool = False


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
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def moe(self) -> bool:
        return any(isinstance(layer.ffn, MoESpec) for layer in self.layers)

    def describe(self) -> str:
        a0 = self.layers[0].attention
        windows = sorted({layer.attention.sliding_window for layer in self.layers}, key=str)
        return (
            f"{self.arch} '{self.name}': {self.n_layers} layers, d={self.n_embd}, "
            f"heads {a0.n_heads}/{a0.n_kv_heads}x{a0.head_dim}, vocab {self.n_vocab}, "
            f"windows {windows}"
        ) + self._describe_moe()

    def _describe_moe(self) -> str:
        moe = [layer.ffn for layer in self.layers if isinstance(layer.ffn, MoESpec)]
        if not moe:
            return ""
        m = moe[0]
        return (f", MoE on {len(moe)} layers: {m.n_used} of {m.n_expert} experts x {m.hidden}"
                + (f" + shared {m.shared.hidden}" if m.shared else ""))

"""Typed model specs: what a model is, per layer, with no loops or kernels.

A family module (llama.py, gemma3.py, ...) reads GGUF metadata and returns a
`ModelSpec`; `infr.plan` lowers it into ops. Later families add kinds (a MoE
FFN, a DeltaNet mixer) rather than branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


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


@dataclass(frozen=True)
class FFNSpec:
    hidden: int
    activation: Activation
    gated: bool = True  # act(gate(x)) * up(x)


@dataclass(frozen=True)
class LayerSpec:
    index: int
    attention: AttentionSpec
    ffn: FFNSpec
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

    def describe(self) -> str:
        a0 = self.layers[0].attention
        windows = sorted({layer.attention.sliding_window for layer in self.layers}, key=str)
        return (
            f"{self.arch} '{self.name}': {self.n_layers} layers, d={self.n_embd}, "
            f"heads {a0.n_heads}/{a0.n_kv_heads}x{a0.head_dim}, vocab {self.n_vocab}, "
            f"windows {windows}"
        )

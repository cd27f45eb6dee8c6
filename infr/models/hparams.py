"""The hyperparameters every transformer family reads the same way."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from dataclasses import dataclass

from infr.gguf_file import GGUFFile

if TYPE_CHECKING:
    from infr.models.spec import ModelSpec


@dataclass(frozen=True)
class HParams:
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    norm_eps: float
    rope_theta: float
    n_rot: int
    rope_freq_scale: float
    n_ctx_train: int
    n_vocab: int
    name: str
    tied_embeddings: bool

    @property
    def default_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


def read_hparams(gf: GGUFFile) -> HParams:
    n_layers = int(gf.require(f"{gf.arch}.block_count"))
    n_embd = int(gf.require(f"{gf.arch}.embedding_length"))
    n_heads = int(gf.require(f"{gf.arch}.attention.head_count"))
    n_kv = int(gf.arch_key("attention.head_count_kv", n_heads))
    head_dim = int(gf.arch_key("attention.key_length", n_embd // n_heads))
    v_head_dim = int(gf.arch_key("attention.value_length", head_dim))
    eps = float(gf.arch_key("attention.layer_norm_rms_epsilon", 1e-5))
    n_ff = gf.arch_key("feed_forward_length")
    if n_ff is None:  # MoE files may have no dense FFN at all (0)
        n_ff = gf.tensor("blk.0.ffn_up.weight").shape[0] if gf.has_tensor("blk.0.ffn_up.weight") else 0
    scale = 1.0
    if gf.arch_key("rope.scaling.type") == "linear":
        scale = 1.0 / float(gf.arch_key("rope.scaling.factor", 1.0))
    n_vocab = gf.tensor("token_embd.weight").shape[0]
    return HParams(
        n_layers=n_layers,
        n_embd=n_embd,
        n_ff=int(n_ff),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        norm_eps=eps,
        rope_theta=float(gf.arch_key("rope.freq_base", 10000.0)),
        n_rot=int(gf.arch_key("rope.dimension_count", head_dim)),
        rope_freq_scale=scale,
        n_ctx_train=int(gf.arch_key("context_length", 2048)),
        n_vocab=int(n_vocab),
        name=str(gf.get("general.name", gf.path.stem)),
        tied_embeddings=not gf.has_tensor("output.weight"),
    )


def expert_counts(gf: GGUFFile) -> tuple[int, int]:
    """(expert_count, expert_used_count), both required and 0 < used <= count (llama.cpp's loader)."""
    from infr.errors import GGUFError

    n_expert = int(gf.require(f"{gf.arch}.expert_count"))
    n_used = int(gf.require(f"{gf.arch}.expert_used_count"))
    if not 0 < n_used <= n_expert:
        raise GGUFError(f"{gf.path.name}: expert_used_count {n_used} is not in 1..expert_count ({n_expert})")
    return n_expert, n_used


def dense_model(gf: GGUFFile, hp: HParams, rope_style, **attention_flags) -> "ModelSpec":
    """A model whose layers are all alike: GQA attention with RoPE, SwiGLU FFN
    (llama, qwen2, qwen3 differ only in the rope style and attention flags)."""
    from infr.models.spec import Activation, AttentionSpec, FFNSpec, LayerSpec, ModelSpec, RopeSpec

    factors = "rope_freqs.weight" if gf.has_tensor("rope_freqs.weight") else None
    rope = RopeSpec(rope_style, hp.rope_theta, hp.n_rot, hp.rope_freq_scale, freq_factors=factors)
    attention = AttentionSpec(
        hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope, hp.default_scale,
        qkv_bias=gf.has_tensor("blk.0.attn_q.bias"), **attention_flags,
    )
    ffn = FFNSpec(hp.n_ff, Activation.SILU)
    layers = tuple(LayerSpec(i, attention, ffn) for i in range(hp.n_layers))
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings)

"""Qwen3 (dense): RoPE NEOX, RMSNorm on each q and k head, no bias, SwiGLU."""

from __future__ import annotations

from infr.gguf_file import GGUFFile
from infr.models.hparams import read_hparams
from infr.models.spec import Activation, AttentionSpec, FFNSpec, LayerSpec, ModelSpec, RopeSpec, RopeStyle


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    rope = RopeSpec(RopeStyle.NEOX, hp.rope_theta, hp.n_rot, hp.rope_freq_scale)
    attention = AttentionSpec(
        hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope, hp.default_scale, qk_norm=True,
        qkv_bias=gf.has_tensor("blk.0.attn_q.bias"),
    )
    ffn = FFNSpec(hp.n_ff, Activation.SILU)
    layers = tuple(LayerSpec(i, attention, ffn) for i in range(hp.n_layers))
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings)

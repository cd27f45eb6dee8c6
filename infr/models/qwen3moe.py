"""Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (RoPE NEOX, RMSNorm on each
q and k head before rope) and on every layer a mixture of experts: softmax over all experts,
the top expert_used_count by probability, their weights renormalised, SiLU-gated experts,
no shared expert (wave2-families.md section 1)."""

from __future__ import annotations

from infr.gguf_file import GGUFFile
from infr.models.hparams import expert_counts, read_hparams
from infr.models.spec import (Activation, AttentionSpec, Gating, LayerSpec, ModelSpec, MoESpec, RopeSpec,
                              RopeStyle)


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    n_expert, n_used = expert_counts(gf)
    # llama.cpp falls back to n_ff / n_used when the file has no expert width
    hidden = int(gf.arch_key("expert_feed_forward_length", 0)) or hp.n_ff // n_used
    rope = RopeSpec(RopeStyle.NEOX, hp.rope_theta, hp.n_rot, hp.rope_freq_scale)
    attention = AttentionSpec(hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope, hp.default_scale,
                              qk_norm=True)
    moe = MoESpec(n_expert, n_used, hidden, Activation.SILU, Gating.SOFTMAX, norm_weights=True)
    layers = tuple(LayerSpec(i, attention, moe) for i in range(hp.n_layers))
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings)

"""Gemma 3: five local (sliding-window) layers to one global, GeGLU, QK-norm,
norms before and after attention and FFN, embeddings scaled by sqrt(d)."""

from __future__ import annotations

import math

from infr.gguf_file import GGUFFile
from infr.models.hparams import read_hparams
from infr.models.spec import Activation, AttentionSpec, FFNSpec, LayerSpec, ModelSpec, RopeSpec, RopeStyle

SWA_PATTERN = 6  # layers 5, 11, 17, ... are global, unless the file says otherwise
LOCAL_ROPE_THETA = 10_000.0


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    window = gf.arch_key("attention.sliding_window")  # absent: every layer attends globally
    pattern = int(gf.arch_key("attention.sliding_window_pattern", SWA_PATTERN))
    local_theta = float(gf.arch_key("rope.freq_base_swa", LOCAL_ROPE_THETA))
    softcap = gf.arch_key("final_logit_softcapping")
    # Gemma scales queries by 1/sqrt(query_pre_attn_scalar); GGUF does not
    # store it, and llama.cpp uses head_dim for every size but 27B.
    scale = 1.0 / math.sqrt(hp.n_embd // hp.n_heads if hp.n_layers == 62 else hp.head_dim)

    def attention(is_global: bool) -> AttentionSpec:
        theta = hp.rope_theta if is_global else local_theta
        freq_scale = hp.rope_freq_scale if is_global else 1.0
        rope = RopeSpec(RopeStyle.NEOX, theta, hp.n_rot, freq_scale)
        return AttentionSpec(
            hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope, scale,
            qk_norm=True, sliding_window=None if is_global or not window else int(window),
        )

    ffn = FFNSpec(hp.n_ff, Activation.GELU)
    layers = tuple(
        LayerSpec(i, attention((i + 1) % pattern == 0), ffn, post_attn_norm=True, post_ffn_norm=True)
        for i in range(hp.n_layers)
    )
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings, embed_scale=math.sqrt(hp.n_embd),
                     final_logit_softcap=float(softcap) if softcap else None)

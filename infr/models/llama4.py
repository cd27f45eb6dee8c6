"""Llama 4 (Scout 17B-16E, Maverick 17B-128E), wave2-families.md section 4.

Attention: RoPE NORM (adjacent pairs) with the file's rope_freqs, then a weightless RMSNorm
of each q and k head (not on Maverick, 128 experts). Unless the file sets
attention.sliding_window to 0: layers with il % pattern < pattern - 1 (pattern 4 unless the file
says otherwise) attend within 8192-token chunks (the stored window is ignored) with
rope.freq_base_swa, the others see everything; every 4th layer ((il + 1) % 4 == 0) has no rope
and scales its queries by tau(p) = log(floor((p + 1) / 8192) + 1) * 0.1 + 1. With
sliding_window 0: no chunks, no temperature, and the NoPE step is the layer count (the last
layer has no rope).
FFN: every interleave_moe_layer_step-th layer is MoE: sigmoid of the router's logits, the top
expert_used_count chosen on the raw logits, no renormalisation, the weight applied to the
expert's input, plus a plain shared expert of the experts' width; the others dense SwiGLU.
"""

from __future__ import annotations

from infr.errors import GGUFError
from infr.gguf_file import GGUFFile
from infr.models.hparams import expert_counts, read_hparams
from infr.models.spec import (Activation, AttentionSpec, FFNSpec, Gating, LayerSpec, ModelSpec, MoESpec,
                              QueryTemperature, RopeSpec, RopeStyle, SharedExpert)

CHUNK = 8192  # llama.cpp's n_swa for llama4, whatever the file stores
TEMPERATURE = QueryTemperature(floor_scale=8192, scale=0.1, offset=1.0)
NO_ROPE_STEP = 4
SWA_PATTERN = 4


def _chunked_layers(gf: GGUFFile, n_layers: int) -> list[bool]:
    pattern = gf.arch_key("attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):  # a per-layer bool array
        if len(pattern) < n_layers:
            raise GGUFError(f"{gf.path.name}: sliding_window_pattern has {len(pattern)} entries for {n_layers} layers")
        return [bool(v) for v in pattern[:n_layers]]
    n = SWA_PATTERN if pattern is None else int(pattern)
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    n_expert, n_used = expert_counts(gf)
    hidden = gf.require(f"{gf.arch}.expert_feed_forward_length")
    hidden = int(hidden[0] if isinstance(hidden, (list, tuple)) else hidden)
    step = int(gf.require(f"{gf.arch}.interleave_moe_layer_step"))
    window = gf.arch_key("attention.sliding_window")
    chunked_mode = window is None or int(window) != 0
    chunked = _chunked_layers(gf, hp.n_layers) if chunked_mode else [False] * hp.n_layers
    no_rope_step = NO_ROPE_STEP if chunked_mode else hp.n_layers
    swa_theta = float(gf.arch_key("rope.freq_base_swa", hp.rope_theta))
    factors = "rope_freqs.weight" if gf.has_tensor("rope_freqs.weight") else None
    kq_norm = n_expert != 128

    def attention(i: int) -> AttentionSpec:
        use_rope = (i + 1) % no_rope_step != 0
        theta = swa_theta if chunked[i] else hp.rope_theta
        rope = RopeSpec(RopeStyle.NORM, theta, hp.n_rot, hp.rope_freq_scale, freq_factors=factors) if use_rope else None
        return AttentionSpec(
            hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope, hp.default_scale,
            qk_rms_after_rope=use_rope and kq_norm,
            chunk=CHUNK if chunked[i] else None,
            temperature=TEMPERATURE if not use_rope and chunked_mode else None,
        )

    moe = MoESpec(n_expert, n_used, hidden, Activation.SILU, Gating.SIGMOID, select_on_logits=True,
                  norm_weights=False, weight_before=True, shared=SharedExpert(hidden, Activation.SILU))
    dense = FFNSpec(hp.n_ff, Activation.SILU)
    layers = tuple(
        LayerSpec(i, attention(i), moe if step > 0 and (i + 1) % step == 0 else dense) for i in range(hp.n_layers)
    )
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings)

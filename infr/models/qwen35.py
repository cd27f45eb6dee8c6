"""Qwen3.5 / Qwen3.6 dense (`qwen35`), wave2-families.md section 2: a hybrid of gated DeltaNet
layers and gated full-attention layers, each followed by a SwiGLU FFN whose pre-norm is
`post_attention_norm`.

Mixer per layer: `attention.recurrent_layers` (a bool per layer) wins where the file has it,
else layer il is DeltaNet unless (il + 1) % full_attention_interval == 0 (default 4).
DeltaNet sizes reuse llama.cpp's SSM keys: d_k = ssm.state_size, H_k = ssm.group_count,
H_v = ssm.time_step_rank, d_v = ssm.inner_size / H_v (d_k must equal d_v, H_v a multiple of H_k).
Attention: attn_q's rows per head [q_h | gate_h], RMSNorm on each q and k head, IMROPE over the
first rope.dimension_count dims (NEOX for text), output times sigmoid(gate).
"""

from __future__ import annotations

import numpy as np

from infr.errors import GGUFError
from infr.gguf_file import GGUFFile
from infr.models.hparams import read_hparams
from infr.models.spec import (Activation, AttentionSpec, DeltaNetSpec, FFNSpec, LayerSpec, ModelSpec, MoESpec,
                              RopeSpec, RopeStyle)

FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the file has neither layer-pattern key


def _array(v) -> list | None:
    """A metadata array as a list (the reader gives numpy arrays or lists); None for a scalar."""
    if isinstance(v, (str, bytes)) or np.ndim(v) != 1:
        return None
    return list(np.asarray(v).tolist())


def recurrent_layers(gf: GGUFFile, n_layers: int) -> list[bool]:
    raw = gf.arch_key("attention.recurrent_layers")
    if raw is not None:
        flags = _array(raw)
        if flags is None or len(flags) != n_layers:
            raise GGUFError(f"{gf.path.name}: attention.recurrent_layers must be one bool per layer ({n_layers})")
        return [bool(v) for v in flags]
    interval = int(gf.arch_key("full_attention_interval", FULL_ATTENTION_INTERVAL))
    if interval <= 0:
        raise GGUFError(f"{gf.path.name}: full_attention_interval must be positive, not {interval}")
    return [(i + 1) % interval != 0 for i in range(n_layers)]


def deltanet_spec(gf: GGUFFile) -> DeltaNetSpec:
    def need(key: str) -> int:
        v = int(gf.require(f"{gf.arch}.{key}"))
        if v <= 0:
            raise GGUFError(f"{gf.path.name}: {gf.arch}.{key} must be positive, not {v}")
        return v

    d_conv, inner, d_k = need("ssm.conv_kernel"), need("ssm.inner_size"), need("ssm.state_size")
    h_v, h_k = need("ssm.time_step_rank"), need("ssm.group_count")
    if inner % h_v:
        raise GGUFError(f"{gf.path.name}: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {h_v}")
    if h_v % h_k:
        raise GGUFError(f"{gf.path.name}: ssm.time_step_rank {h_v} (V heads) is not a multiple of "
                        f"ssm.group_count {h_k} (K heads)")
    d_v = inner // h_v
    if d_v != d_k:
        raise GGUFError(f"{gf.path.name}: the DeltaNet needs d_k == d_v; ssm.state_size {d_k}, "
                        f"ssm.inner_size / time_step_rank {d_v}")
    return DeltaNetSpec(h_k, h_v, d_k, d_v, d_conv)


def rope_spec(gf: GGUFFile, hp) -> RopeSpec:
    raw = gf.require(f"{gf.arch}.rope.dimension_sections")
    sections = _array(raw)
    if sections is None or len(sections) != 4:
        raise GGUFError(f"{gf.path.name}: rope.dimension_sections must be 4 counts, not {raw!r}")
    if hp.n_rot % 2 or not 0 < hp.n_rot <= hp.head_dim:
        raise GGUFError(f"{gf.path.name}: rope.dimension_count {hp.n_rot} must be even and in 1..{hp.head_dim}")
    return RopeSpec(RopeStyle.IMROPE, hp.rope_theta, hp.n_rot, hp.rope_freq_scale,
                    sections=tuple(int(s) for s in sections))


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    if hp.n_ff <= 0:
        raise GGUFError(f"{gf.path.name}: qwen35 needs feed_forward_length")
    return hybrid_spec(gf, hp, FFNSpec(hp.n_ff, Activation.SILU))


def hybrid_spec(gf: GGUFFile, hp, ffn: FFNSpec | MoESpec) -> ModelSpec:
    """The qwen35 trunk (its mixers by layer pattern, post_attention_norm before the FFN) with ffn
    on every layer: qwen35's dense SwiGLU or qwen35moe's experts."""
    recurrent = recurrent_layers(gf, hp.n_layers)
    mixer = deltanet_spec(gf) if any(recurrent) else None
    scale = float(gf.arch_key("attention.scale", 0.0)) or hp.default_scale
    attention = AttentionSpec(hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.v_head_dim, rope_spec(gf, hp), scale,
                              qk_norm=True, output_gate=True)
    layers = tuple(LayerSpec(i, attention, ffn, mixer=mixer if recurrent[i] else None,
                             ffn_norm="post_attention_norm") for i in range(hp.n_layers))
    return ModelSpec(gf.arch, hp.name, hp.n_embd, hp.n_vocab, hp.n_ctx_train, hp.norm_eps, layers,
                     hp.tied_embeddings)

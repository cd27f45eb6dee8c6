"""Gemma 4 (`gemma4`: 31B dense, E2B/E4B with per-layer embeddings and KV sharing, 26B-A4B MoE),
wave2-families.md section 3, checked against llama.cpp's src/models/gemma4.cpp.

One family; what a file contains picks the variant:
- attention.sliding_window_pattern (a bool per layer, true = sliding-window) splits the layers into
  SWA ones (head dim attention.key_length_swa, NEOX rope over rope.dimension_count_swa with
  rope.freq_base_swa) and full ones (head dim attention.key_length, NEOX over
  rope.dimension_count with rope.freq_base and the proportional-rope divisors rope_freqs.weight);
  head counts and KV-head counts may be per-layer arrays. Attention scale 1.0; q and k RMS-normed
  per head with weights, v with none; where a layer has no attn_v, V is its raw K projection.
- attention.shared_kv_layers = s > 0: the last s layers compute no K or V and read the cache of
  layer (n_layer - s) - 2 (SWA layers) or - 1 (full layers).
- embedding_length_per_layer_input > 0: per-layer embeddings (per_layer_token_embd and friends).
- a layer with ffn_gate_inp.weight is a ParallelFFN (dense GeGLU beside routed GELU experts).
- feed_forward_length may be per layer (E2B's double-wide FFN on shared layers).
- layer_output_scale.weight scales a layer's output; final_logit_softcapping caps the logits.
GELU is llama.cpp CPU's fp16-table GELU (Activation.GELU_F16). Norm weights are plain multipliers.
"""

from __future__ import annotations

import math

import numpy as np

from infr.errors import GGUFError
from infr.gguf_file import GGUFFile
from infr.models.hparams import expert_counts
from infr.models.spec import (Activation, AttentionSpec, FFNSpec, Gating, LayerSpec, ModelSpec, MoESpec,
                              ParallelFFN, RopeSpec, RopeStyle)

SWA_ROPE_THETA = 10_000.0  # llama.cpp's default rope.freq_base_swa
ROPE_THETA = 10_000.0


def _per_layer(gf: GGUFFile, key: str, n_layers: int, default=None) -> list[int]:
    """A key that is one value or one per layer, as ints per layer."""
    raw = gf.arch_key(key, default)
    if raw is None:
        raise GGUFError(f"{gf.path.name}: missing metadata key {gf.arch + '.' + key!r}")
    if isinstance(raw, (str, bytes)):
        raise GGUFError(f"{gf.path.name}: {gf.arch}.{key} must be a number or one per layer, not {raw!r}")
    if np.ndim(raw) == 0:
        return [int(raw)] * n_layers
    vals = [int(v) for v in np.asarray(raw).tolist()]
    if len(vals) != n_layers:
        raise GGUFError(f"{gf.path.name}: {gf.arch}.{key} has {len(vals)} values for {n_layers} layers")
    return vals


def _positive(gf: GGUFFile, key: str, v: int) -> int:
    if v <= 0:
        raise GGUFError(f"{gf.path.name}: {gf.arch}.{key} must be positive, not {v}")
    return v


def swa_layers(gf: GGUFFile, n_layers: int) -> list[bool]:
    raw = gf.require(f"{gf.arch}.attention.sliding_window_pattern")
    if isinstance(raw, (str, bytes)) or np.ndim(raw) != 1 or len(raw) != n_layers:
        raise GGUFError(f"{gf.path.name}: attention.sliding_window_pattern must be one bool per layer ({n_layers})")
    return [bool(v) for v in np.asarray(raw).tolist()]


def kv_sources(gf: GGUFFile, swa: list[bool]) -> list[int | None]:
    """Per layer, the layer whose cache a KV-shared layer reads (None: its own); llama.cpp's rule."""
    n = len(swa)
    shared = int(gf.arch_key("attention.shared_kv_layers", 0))
    if not 0 <= shared < n:
        raise GGUFError(f"{gf.path.name}: attention.shared_kv_layers {shared} is not in 0..{n - 1}")
    start = n - shared
    if shared and start < 2:
        raise GGUFError(f"{gf.path.name}: attention.shared_kv_layers {shared} leaves {start} layers with a cache; "
                        f"KV sharing needs at least 2")
    out: list[int | None] = []
    for i in range(n):
        if i < start:
            out.append(None)
            continue
        src = start - (2 if swa[i] else 1)
        if swa[src] != swa[i]:
            raise GGUFError(f"{gf.path.name}: KV-shared layer {i} ({'sliding' if swa[i] else 'full'}) would read "
                            f"layer {src}, which is not of its kind")
        out.append(src)
    return out


def build(gf: GGUFFile) -> ModelSpec:
    a, name = gf.arch, gf.path.name
    n_layers = _positive(gf, "block_count", int(gf.require(f"{a}.block_count")))
    n_embd = _positive(gf, "embedding_length", int(gf.require(f"{a}.embedding_length")))
    eps = float(gf.require(f"{a}.attention.layer_norm_rms_epsilon"))
    window = _positive(gf, "attention.sliding_window", int(gf.require(f"{a}.attention.sliding_window")))
    swa = swa_layers(gf, n_layers)
    n_heads = _per_layer(gf, "attention.head_count", n_layers)
    n_kv = _per_layer(gf, "attention.head_count_kv", n_layers, gf.arch_key("attention.head_count"))
    d_full = int(gf.arch_key("attention.key_length", n_embd // n_heads[0]))
    d_swa = int(gf.require(f"{a}.attention.key_length_swa"))
    if int(gf.arch_key("attention.value_length", d_full)) != d_full or \
            int(gf.require(f"{a}.attention.value_length_swa")) != d_swa:
        raise GGUFError(f"{name}: gemma4 needs value_length == key_length on each kind of layer")
    n_rot = int(gf.arch_key("rope.dimension_count", d_full))
    n_rot_swa = int(gf.arch_key("rope.dimension_count_swa", n_rot))
    for d, r, kind in ((d_full, n_rot, "rope.dimension_count"), (d_swa, n_rot_swa, "rope.dimension_count_swa")):
        if d <= 0 or r % 2 or not 0 < r <= d:
            raise GGUFError(f"{name}: {a}.{kind} {r} must be even and in 1..{d} (the head dim)")
    theta = float(gf.arch_key("rope.freq_base", ROPE_THETA))
    theta_swa = float(gf.arch_key("rope.freq_base_swa", SWA_ROPE_THETA))
    n_ff = _per_layer(gf, "feed_forward_length", n_layers)
    n_pl = int(gf.require(f"{a}.embedding_length_per_layer_input"))
    if n_pl < 0:
        raise GGUFError(f"{name}: {a}.embedding_length_per_layer_input must not be negative")
    sources = kv_sources(gf, swa)
    if not all(swa) and not gf.has_tensor("rope_freqs.weight"):
        raise GGUFError(f"{name}: gemma4's full-attention layers need rope_freqs.weight (proportional RoPE)")
    if any(gf.has_tensor(f"blk.{i}.attn_qkv.weight") for i in range(n_layers)):
        raise GGUFError(f"{name}: a fused attn_qkv is not supported for gemma4 yet")
    full_rope = RopeSpec(RopeStyle.NEOX, theta, n_rot, freq_factors="rope_freqs.weight")
    swa_rope = RopeSpec(RopeStyle.NEOX, theta_swa, n_rot_swa)

    def layer(i: int) -> LayerSpec:
        p = f"blk.{i}."
        d = d_swa if swa[i] else d_full
        if n_heads[i] <= 0 or n_kv[i] <= 0 or n_heads[i] % n_kv[i]:
            raise GGUFError(f"{name}: layer {i}: {n_heads[i]} heads are not a multiple of {n_kv[i]} KV heads")
        attention = AttentionSpec(n_heads[i], n_kv[i], d, d, swa_rope if swa[i] else full_rope, 1.0, qk_norm=True,
                                  sliding_window=window if swa[i] else None,
                                  v_from_k=not gf.has_tensor(p + "attn_v.weight"), v_norm=True)
        if n_ff[i] <= 0:
            raise GGUFError(f"{name}: layer {i}: feed_forward_length must be positive")
        ffn: FFNSpec | ParallelFFN = FFNSpec(n_ff[i], Activation.GELU_F16)
        if gf.has_tensor(p + "ffn_gate_inp.weight"):
            n_expert, n_used = expert_counts(gf)
            hidden = _per_layer(gf, "expert_feed_forward_length", n_layers)[i]
            moe = MoESpec(n_expert, n_used, _positive(gf, "expert_feed_forward_length", hidden),
                          Activation.GELU_F16, Gating.SOFTMAX, norm_weights=True,
                          fused_gate_up=gf.has_tensor(p + "ffn_gate_up_exps.weight"))
            ffn = ParallelFFN(ffn, moe, expert_scales=gf.has_tensor(p + "ffn_down_exps.scale"))
        return LayerSpec(i, attention, ffn, post_attn_norm=True, post_ffn_norm=True, kv_from=sources[i],
                         output_scale=gf.has_tensor(p + "layer_output_scale.weight"))

    softcap = gf.arch_key("final_logit_softcapping")
    return ModelSpec(a, str(gf.get("general.name", gf.path.stem)), n_embd, int(gf.tensor("token_embd.weight").shape[0]),
                     int(gf.require(f"{a}.context_length")), eps, tuple(layer(i) for i in range(n_layers)),
                     not gf.has_tensor("output.weight"), embed_scale=math.sqrt(n_embd),
                     final_logit_softcap=float(softcap) if softcap else None, per_layer_input=n_pl)

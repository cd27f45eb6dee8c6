"""The gemma4 part of infr.synth (wave2-families.md section 3): its layer kinds, tensors, metadata
and llama-quantize's rules for its tensors.

SynthSpec's head_dim, n_kv_heads, n_heads, n_ff and sliding_window are the full-attention layers'
head dim and KV heads, the (common) query heads, the FFN width and the window; `Gemma4Shape` holds
the rest. Names and shapes as llama.cpp's gemma4 loader reads them (numpy order [out, in]):
- global: token_embd, output_norm, rope_freqs [d_full / 2] (proportional RoPE: 1 for the first
  d_full * partial_rotary / 2 pairs, 1e30 for the rest, as the converter writes it); with PLE
  per_layer_token_embd [n_vocab, n_pl * n_layer], per_layer_model_proj [n_pl * n_layer, n_embd],
  per_layer_proj_norm [n_pl];
- per layer: attn_norm, attn_q, attn_k / attn_k_norm (own-KV layers), attn_v (own-KV layers
  except full ones when full_v_from_k), attn_output, attn_q_norm, post_attention_norm,
  layer_output_scale [1], ffn_norm, ffn_gate/up/down (twice as wide on KV-shared layers when
  double_wide), post_ffw_norm; MoE layers: ffn_gate_inp, ffn_gate_inp.scale [n_embd], pre_ffw_norm_2,
  post_ffw_norm_1/2, ffn_gate_up_exps [E, 2 * n_ff_exp, n_embd], ffn_down_exps, ffn_down_exps.scale [E];
  PLE: inp_gate [n_pl, n_embd], proj [n_embd, n_pl], post_norm.

Quantization (llama.cpp src/llama-quant.cpp): per_layer_token_embd is in the TOKEN_EMBD category,
so in a tied model it takes the output's type (Q6_K in Q4_K_M, Q8_0 in Q8_0); per_layer_model_proj
and the router are never quantized (F32 here); attn_v's use_more_bits counter runs over the attn_v
tensors that exist (none on KV-shared layers, none on full layers without attn_v).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType

from infr import chat_gemma4

# Gemma 4's chat and tool markers (infr/chat_gemma4.py); <turn|> and <|tool_response> end generation.
CHAT_TOKENS = ("<bos>", "<eos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
               "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|think|>")
VECTOR_KINDS = ("g4_rope_freqs", "out_scale", "router_scale", "expert_scale", "qk_norm", "final_norm")
NORM_SPREAD = 0.2


@dataclass(frozen=True)
class Gemma4Shape:
    swa_pattern: tuple[bool, ...]  # per layer: True = sliding-window
    swa_head_dim: int
    swa_kv_heads: int
    rope_theta_swa: float = 10_000.0
    partial_rotary: float = 0.25  # of the full layers' pairs that turn (the rest: rope_freqs 1e30)
    per_layer_input: int = 0  # PLE width (0: none)
    shared_kv_layers: int = 0
    double_wide: bool = False  # KV-shared layers' FFN twice n_ff (E2B)
    full_v_from_k: bool = True  # full layers have no attn_v (V = the raw K projection)
    output_scale: bool = True
    softcap: float | None = 30.0
    fused_gate_up: bool = True
    expert_scales: bool = True


def own_kv(spec, i: int) -> bool:
    return i < spec.n_layers - spec.gemma4.shared_kv_layers


def is_moe_layer(spec, i: int) -> bool:
    return spec.arch == "gemma4" and spec.n_expert > 0


def head_dim(spec, i: int) -> int:
    g = spec.gemma4
    return g.swa_head_dim if g.swa_pattern[i] else spec.head_dim


def kv_heads(spec) -> "int | list[int]":
    """attention.head_count_kv: per layer for gemma4, else the one value."""
    if spec.arch != "gemma4":
        return spec.n_kv_heads
    g = spec.gemma4
    return [g.swa_kv_heads if s else spec.n_kv_heads for s in g.swa_pattern]


def n_ff(spec, i: int | None = None) -> "int | list[int]":
    """feed_forward_length: per layer for gemma4 (double-wide on KV-shared layers), else the one value."""
    if spec.arch != "gemma4":
        return spec.n_ff
    g = spec.gemma4
    per = [spec.n_ff * (2 if g.double_wide and not own_kv(spec, j) else 1) for j in range(spec.n_layers)]
    return per if i is None else per[i]


def has_v(spec, i: int) -> bool:
    return own_kv(spec, i) and (spec.gemma4.swa_pattern[i] or not spec.gemma4.full_v_from_k)


def validate(spec) -> None:
    if spec.arch != "gemma4":
        return
    g = spec.gemma4
    if g is None or len(g.swa_pattern) != spec.n_layers:
        raise ValueError("gemma4 needs a Gemma4Shape with one swa_pattern flag per layer")
    if not spec.sliding_window:
        raise ValueError("gemma4 needs a sliding_window")
    if g.shared_kv_layers:
        start = spec.n_layers - g.shared_kv_layers
        if start < 2 or g.swa_pattern[start - 1] or not g.swa_pattern[start - 2]:
            raise ValueError("gemma4's KV sharing needs the last own-KV layer full and the one before it SWA")
    if spec.n_expert and not 0 < spec.n_expert_used <= spec.n_expert:
        raise ValueError("gemma4 needs 0 < n_expert_used <= n_expert")


def tensors(spec, mat, vec, bank, raw) -> None:
    """Every tensor, in load order: mat(name, rows, cols), vec(name, n, kind), bank(name, E, rows, cols),
    raw(name, shape, kind)."""
    g, e, L = spec.gemma4, spec.n_embd, spec.n_layers
    mat("token_embd.weight", spec.n_vocab, e)
    if g.per_layer_input:
        mat("per_layer_token_embd.weight", spec.n_vocab, g.per_layer_input * L)
        raw("per_layer_model_proj.weight", (g.per_layer_input * L, e), "matrix")
        vec("per_layer_proj_norm.weight", g.per_layer_input, "norm")
    vec("output_norm.weight", e, "final_norm")
    if not all(g.swa_pattern):
        vec("rope_freqs.weight", spec.head_dim // 2, "g4_rope_freqs")
    for i in range(L):
        p, d = f"blk.{i}.", head_dim(spec, i)
        kv = g.swa_kv_heads if g.swa_pattern[i] else spec.n_kv_heads
        vec(p + "attn_norm.weight", e, "norm")
        mat(p + "attn_q.weight", spec.n_heads * d, e)
        if own_kv(spec, i):
            mat(p + "attn_k.weight", kv * d, e)
        if has_v(spec, i):
            mat(p + "attn_v.weight", kv * d, e)
        mat(p + "attn_output.weight", e, spec.n_heads * d)
        vec(p + "attn_q_norm.weight", d, "qk_norm")
        if own_kv(spec, i):
            vec(p + "attn_k_norm.weight", d, "qk_norm")
        vec(p + "post_attention_norm.weight", e, "norm")
        if g.output_scale:
            vec(p + "layer_output_scale.weight", 1, "out_scale")
        ff = n_ff(spec, i)
        vec(p + "ffn_norm.weight", e, "norm")
        mat(p + "ffn_gate.weight", ff, e)
        mat(p + "ffn_up.weight", ff, e)
        mat(p + "ffn_down.weight", e, ff)
        vec(p + "post_ffw_norm.weight", e, "norm")
        if is_moe_layer(spec, i):
            mat(p + "ffn_gate_inp.weight", spec.n_expert, e)
            vec(p + "ffn_gate_inp.scale", e, "router_scale")
            vec(p + "pre_ffw_norm_2.weight", e, "norm")
            vec(p + "post_ffw_norm_1.weight", e, "norm")
            vec(p + "post_ffw_norm_2.weight", e, "norm")
            if g.fused_gate_up:
                bank(p + "ffn_gate_up_exps.weight", spec.n_expert, 2 * spec.n_ff_exp, e)
            else:
                bank(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, e)
                bank(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, e)
            bank(p + "ffn_down_exps.weight", spec.n_expert, e, spec.n_ff_exp)
            if g.expert_scales:
                vec(p + "ffn_down_exps.scale", spec.n_expert, "expert_scale")
        if g.per_layer_input:
            mat(p + "inp_gate.weight", g.per_layer_input, e)
            mat(p + "proj.weight", e, g.per_layer_input)
            vec(p + "post_norm.weight", e, "norm")


def vector_values(spec, name: str, kind: str, n: int, seed: int, uniform) -> np.ndarray:
    """The values of gemma4's vectors of kind `kind` (VECTOR_KINDS); uniform(seed, name, chunk, n, half_width)."""
    g = spec.gemma4
    if kind == "g4_rope_freqs":
        r = int(spec.head_dim * g.partial_rotary) // 2
        return np.array([1.0] * r + [1e30] * (n - r), np.float32)
    if kind == "qk_norm":
        # Attention scale 1.0: with q and k norm weights near 1, random q.k scores have std ~sqrt(d),
        # attention is near one-hot and 1-ulp differences moved tiny-gemma4's probabilities by 3e-4
        # (measured); d^-1/4 (1 +- 0.2) gives the scores of a 1/sqrt(d) scale (5e-5 then).
        return (np.float32(n ** -0.25) * (np.float32(1.0) + uniform(seed, name, 0, n, NORM_SPREAD))).astype(
            np.float32)
    if kind == "final_norm":
        # 0.5 (1 +- 0.2): logits half as wide, so 1-ulp differences (f16 tables, f16 K/V rounding
        # falling the other way) move the oracle's probabilities by ~1e-5, a tenth of its bound (measured)
        return (np.float32(0.5) * (np.float32(1.0) + uniform(seed, name, 0, n, NORM_SPREAD))).astype(np.float32)
    if kind == "out_scale":  # a layer's output scale, 0.5 .. 1
        return (np.float32(0.75) + uniform(seed, name, 0, n, 0.25)).astype(np.float32)
    if kind == "router_scale":  # sqrt(n_embd) * (1 +- 0.2): router logits of order 1 from rms(x) / sqrt(n_embd)
        return (np.float32(math.sqrt(spec.n_embd)) * (np.float32(1.0) + uniform(seed, name, 0, n, 0.2))).astype(
            np.float32)
    if kind == "expert_scale":  # 0.5 .. 1.5
        return (np.float32(1.0) + uniform(seed, name, 0, n, 0.5)).astype(np.float32)
    raise ValueError(f"{name}: unknown gemma4 vector kind {kind!r}")


def add_metadata(w, spec) -> None:
    """gemma4's keys beyond synth's common ones (head_count_kv and feed_forward_length, per layer, and
    key_length, the full layers' head dim, are written there)."""
    if spec.arch != "gemma4":
        return
    g, a = spec.gemma4, spec.arch
    w.add_array(f"{a}.attention.sliding_window_pattern", [bool(v) for v in g.swa_pattern])
    w.add_key_length_swa(g.swa_head_dim)
    w.add_value_length_swa(g.swa_head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_dimension_count_swa(g.swa_head_dim)
    w.add_rope_freq_base_swa(g.rope_theta_swa)
    w.add_embedding_length_per_layer_input(g.per_layer_input)
    if g.shared_kv_layers:
        w.add_shared_kv_layers(g.shared_kv_layers)
    if g.softcap:
        w.add_final_logit_softcapping(g.softcap)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)


def mixed_type(spec, ftype: LlamaFileType, name: str, base: Q, use_more_bits) -> Q | None:
    """llama-quantize's type for a gemma4 tensor where it differs from synth's general rules, else None."""
    if name == "per_layer_model_proj.weight" or name.endswith("ffn_gate_inp.weight"):
        return Q.F32
    if name == "per_layer_token_embd.weight" and spec.tied:
        return Q.Q8_0 if base == Q.Q8_0 else Q.Q6_K
    if name.endswith("attn_v.weight") and ftype in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M):
        with_v = [i for i in range(spec.n_layers) if has_v(spec, i)]
        i = with_v.index(int(name.split(".")[1]))
        return Q.Q6_K if use_more_bits(i, len(with_v)) else base
    return None


def presets(make) -> dict:
    """gemma4's presets, made by make(arch, **fields) (synth.SynthSpec).

    Tiny ones for the llama.cpp oracle (six layers S S F S S F, window 8 so a 40-token prompt crosses
    it, SWA heads 2 x 16 and full heads 1 x 32 with 4 of 16 pairs turning, 4 query heads):
    tiny-gemma4 (31B-style dense: no attn_v on full layers), tiny-gemma4-e2b (PLE of 32, the last 3
    layers KV-shared with a double-wide FFN, attn_v everywhere), tiny-gemma4-moe (26B-style: 8
    experts top-2 beside the dense FFN, fused gate_up, per-expert scales).

    Real shapes: gemma4-26b-a4b from wave2-families.md section 3.1 (DiffusionGemma-26B-A4B's
    backbone as kryptic-sh/infr:docs/diffusion-gemma.md gives it: n_embd 2816, 30 layers, full
    at 5, 11, ..., 29, window 1024, SWA 16 x 256 with 8 KV heads and base 1e4, full 16 x 512 with 2
    KV heads and base 1e6, dense FFN 2112, 128 experts top-8 of 704, vocab 262144, softcap 30, eps
    1e-6, no attn_v on full layers). gemma4-e2b: 35 layers, n_embd 1536, PLE 256, FFN 6144 and
    12288 on the KV-shared layers from section 3.1; its heads (8 of 256 / 512, 1 KV head), window
    512, 20 shared layers, full layers at every 5th, attn_v on every own-KV layer and the context
    are recalled from the Hugging Face config, not checked against a real GGUF (the shared-KV rule
    holds: layer 14 is full, 13 sliding). Both contexts are assumptions; they change no tensor.
    Checked: gemma4-e2b in the Q4_K_M mix with its vocabulary cut to 1024 (1.2 GB) loads in llama.cpp
    build 11434's llama-server and generates; infr's CPU reference gave 3 of its 4 greedy tokens
    teacher-forced, max |dp| 9.8e-4 (Q4_K with llama.cpp's Q8_K activations vs infr's rounding).
    """
    swa6 = (True, True, False, True, True, False)
    tiny = dict(n_layers=6, n_embd=64, n_heads=4, n_kv_heads=1, head_dim=32, n_ff=96, n_vocab=512, ctx=256,
                rope_theta=1_000_000.0, sliding_window=8, tied=True, tokenizer="gpt2")
    g = Gemma4Shape(swa6, swa_head_dim=16, swa_kv_heads=2)
    return {
        "tiny-gemma4": make("gemma4", **tiny, gemma4=g, name="tiny-gemma4"),
        # tiny-gemma4 with Gemma 4's chat template and its markers as control tokens, and room for a
        # tool conversation spelled byte by byte (the server's chat and tool tests); the other
        # presets stay the files llama.cpp's fixtures were made from
        "tiny-gemma4-chat": make("gemma4", **{**tiny, "ctx": 1024}, gemma4=g, name="tiny-gemma4-chat",
                                 chat_template=chat_gemma4.template_source(), special_tokens=CHAT_TOKENS),
        "tiny-gemma4-e2b": make("gemma4", **tiny, name="tiny-gemma4-e2b", gemma4=Gemma4Shape(
            swa6, swa_head_dim=16, swa_kv_heads=2, per_layer_input=32, shared_kv_layers=3, double_wide=True,
            full_v_from_k=False)),
        "tiny-gemma4-moe": make("gemma4", **{**tiny, "n_ff": 64}, n_expert=8, n_expert_used=2, n_ff_exp=32,
                                gemma4=g, name="tiny-gemma4-moe"),
        "gemma4-e2b": make(
            "gemma4", n_layers=35, n_embd=1536, n_heads=8, n_kv_heads=1, head_dim=512, n_ff=6144, n_vocab=262144,
            ctx=131072, rope_theta=1_000_000.0, sliding_window=512, tied=True, name="Gemma-4-E2B (synthetic)",
            gemma4=Gemma4Shape(tuple((i + 1) % 5 != 0 for i in range(35)), swa_head_dim=256, swa_kv_heads=1,
                               per_layer_input=256, shared_kv_layers=20, double_wide=True, full_v_from_k=False)),
        "gemma4-26b-a4b": make(
            "gemma4", n_layers=30, n_embd=2816, n_heads=16, n_kv_heads=2, head_dim=512, n_ff=2112, n_vocab=262144,
            ctx=262144, rope_theta=1_000_000.0, sliding_window=1024, tied=True, n_expert=128, n_expert_used=8,
            n_ff_exp=704, name="Gemma-4-26B-A4B (synthetic)",
            gemma4=Gemma4Shape(tuple((i + 1) % 6 != 0 for i in range(30)), swa_head_dim=256, swa_kv_heads=8)),
    }

"""The qwen35 / qwen35moe part of infr.synth (wave2-families.md section 2): which layers are gated DeltaNet
ones, their tensors, the gated attention's doubled attn_q, and the metadata llama.cpp's loader
requires (rope.dimension_sections, the ssm.* sizes, a layer-pattern key).

Names and shapes as llama.cpp's qwen35 loader reads them (numpy order [out, in]): attn_qkv
[conv_dim, n_embd] (q, k, v rows), attn_gate [H_v * d_v, n_embd], ssm_conv1d [conv_dim, d_conv],
ssm_dt.bias and ssm_a (no .weight) [H_v], ssm_beta and ssm_alpha [H_v, n_embd], ssm_norm [d_v],
ssm_out [n_embd, H_v * d_v]; every layer's FFN pre-norm is post_attention_norm. ssm_a holds
-exp(A_log) as the converter writes it (negative); the conv and ssm_a stay F32.

Checked with llama.cpp build 11434's llama-server (CPU, -nr) on the real-shape presets cut to 4
layers (3 DeltaNet + 1 attention; with fewer, as in a 2-layer cut, there is no attention layer and
llama.cpp aborts, GGML_ASSERT(buffer) in ggml-backend.cpp): qwen35-4b in Q4_K_M and qwen35-35b-a3b
in Q8_0 load and generate, and infr's CPU reference gives the same 4 greedy tokens (on ids whose
llama.cpp top-1 margins are >= 0.1; the 35B-A3B one with llama.cpp's activation rounding,
tests/test_moe_exact.py). qwen35-35b-a3b in Q4_K_M loads and generates too; there 3 of 4 tokens
agree and the other is a near-tie (margin 0.14): random weights over 248320 tokens give flat
logits, and for K-quant weights llama.cpp's CPU rounds activations per 256 (Q8_K) where infr
rounds per 32 (docs/numerics.md), ~0.1-0.3 apart in these log-probabilities.
"""

from __future__ import annotations


def conv_dim(spec) -> int:
    return 2 * spec.ssm_k_heads * spec.ssm_state + spec.ssm_v_heads * spec.ssm_state


def is_recurrent(spec, i: int) -> bool:
    if spec.recurrent_layers is not None:
        return bool(spec.recurrent_layers[i])
    return (i + 1) % spec.full_attention_interval != 0


QWEN35_ARCHS = ("qwen35", "qwen35moe")


def validate(spec) -> None:
    if spec.arch not in QWEN35_ARCHS:
        return
    if min(spec.ssm_state, spec.ssm_k_heads, spec.ssm_v_heads, spec.ssm_conv) <= 0:
        raise ValueError(f"{spec.arch} needs ssm_state, ssm_k_heads, ssm_v_heads and ssm_conv")
    if spec.ssm_v_heads % spec.ssm_k_heads:
        raise ValueError(f"{spec.arch} needs ssm_v_heads a multiple of ssm_k_heads")
    if spec.recurrent_layers is not None and len(spec.recurrent_layers) != spec.n_layers:
        raise ValueError("recurrent_layers needs one flag per layer")
    if not 0 < spec.n_rot <= spec.head_dim or spec.n_rot % 2:
        raise ValueError(f"{spec.arch} needs an even n_rot in 1..head_dim")


def layer_tensors(spec, i: int, mat, vec, raw) -> None:
    """Layer i's norms and mixer tensors (attention or DeltaNet), in load order: mat(name, rows,
    cols) a matrix, vec(name, n, kind) a vector, raw(name, shape, kind) an F32 tensor. The FFN
    (dense, or qwen35moe's experts: infr/synth_moe.py) is the caller's."""
    p, e, hd = f"blk.{i}.", spec.n_embd, spec.head_dim
    vec(p + "attn_norm.weight", e, "norm")
    vec(p + "post_attention_norm.weight", e, "norm")
    if is_recurrent(spec, i):
        inner = spec.ssm_v_heads * spec.ssm_state
        mat(p + "attn_qkv.weight", conv_dim(spec), e)
        mat(p + "attn_gate.weight", inner, e)
        raw(p + "ssm_conv1d.weight", (conv_dim(spec), spec.ssm_conv), "matrix")
        vec(p + "ssm_dt.bias", spec.ssm_v_heads, "bias")
        vec(p + "ssm_a", spec.ssm_v_heads, "ssm_a")
        mat(p + "ssm_beta.weight", spec.ssm_v_heads, e)
        mat(p + "ssm_alpha.weight", spec.ssm_v_heads, e)
        vec(p + "ssm_norm.weight", spec.ssm_state, "norm")
        mat(p + "ssm_out.weight", e, inner)
    else:
        mat(p + "attn_q.weight", 2 * spec.n_heads * hd, e)  # per head [q_h | gate_h]
        mat(p + "attn_k.weight", spec.n_kv_heads * hd, e)
        mat(p + "attn_v.weight", spec.n_kv_heads * hd, e)
        mat(p + "attn_output.weight", e, spec.n_heads * hd)
        vec(p + "attn_q_norm.weight", hd, "norm")
        vec(p + "attn_k_norm.weight", hd, "norm")


def add_metadata(w, spec) -> None:
    if spec.arch not in QWEN35_ARCHS:
        return
    a = spec.arch
    w.add_rope_dimension_count(spec.n_rot)
    half = spec.n_rot // 2  # pairs; text uses the first three sections alike
    w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    w.add_ssm_conv_kernel(spec.ssm_conv)
    w.add_ssm_inner_size(spec.ssm_v_heads * spec.ssm_state)
    w.add_ssm_state_size(spec.ssm_state)
    w.add_ssm_time_step_rank(spec.ssm_v_heads)
    w.add_ssm_group_count(spec.ssm_k_heads)
    if spec.recurrent_layers is not None:
        w.add_array(f"{a}.attention.recurrent_layers", [bool(v) for v in spec.recurrent_layers])
    else:
        w.add_full_attention_interval(spec.full_attention_interval)


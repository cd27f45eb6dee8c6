"""infr.synth's presets: tiny shapes for the llama.cpp oracle and real shapes for benchmarks
(re-exported as synth.PRESETS and synth.preset)."""

from __future__ import annotations

from dataclasses import replace

from infr import synth_gemma4
from infr.synth_spec import Llama3Rope, SynthSpec


PRESETS: dict[str, SynthSpec] = {
    # Tiny shapes for the llama.cpp oracle: fast on a CPU, yet every feature of
    # the family is present (GQA, untied head, Llama 3 rope_freqs, QKV bias,
    # q/k heads wider than n_embd, a global gemma3 layer between local ones).
    "tiny-llama": SynthSpec(
        "llama", n_layers=3, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=128, n_vocab=512,
        ctx=256, rope_theta=500000.0, tied=False, norm_eps=1e-5,
        rope_scaling=Llama3Rope(factor=8.0, original_context=64), name="tiny-llama",
    ),
    "tiny-qwen2": SynthSpec(
        "qwen2", n_layers=3, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=160, n_vocab=600,
        ctx=256, rope_theta=1000000.0, qkv_bias=True, name="tiny-qwen2",
    ),
    "tiny-qwen3": SynthSpec(
        "qwen3", n_layers=3, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=32, n_ff=192, n_vocab=700,
        ctx=256, rope_theta=1000000.0, name="tiny-qwen3",
    ),
    "tiny-gemma3": SynthSpec(
        "gemma3", n_layers=7, n_embd=64, n_heads=2, n_kv_heads=1, head_dim=64, n_ff=128, n_vocab=512,
        ctx=256, rope_theta=1000000.0, sliding_window=8, name="tiny-gemma3",
    ),
    # MoE: a non-power-of-two expert count, top-2 of softmax (qwen3moe); top-1 of raw logits with
    # sigmoid weights before the expert, a shared expert, dense and MoE layers, four layers so the
    # last one is NoPE with the query temperature, rope_freqs (llama4).
    "tiny-qwen3moe": SynthSpec(
        "qwen3moe", n_layers=3, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=32, n_ff=192, n_vocab=512,
        ctx=256, rope_theta=1000000.0, tied=False, n_expert=6, n_expert_used=2, n_ff_exp=64,
        name="tiny-qwen3moe", tokenizer="gpt2",
    ),
    "tiny-llama4": SynthSpec(
        "llama4", n_layers=4, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=96, n_vocab=512,
        ctx=16384, rope_theta=500000.0, tied=False, norm_eps=1e-5, n_expert=5, n_expert_used=1, n_ff_exp=64,
        moe_step=2, rope_scaling=Llama3Rope(factor=8.0, original_context=64), name="tiny-llama4",
        tokenizer="gpt2",
    ),
    # qwen35: DeltaNet and gated attention layers alternating (full_attention_interval 2), 4 V-heads
    # on 2 K-heads, rope over 8 of 32 dims, a conv of 4 taps.
    "tiny-qwen35": SynthSpec(
        "qwen35", n_layers=4, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=32, n_ff=96, n_vocab=512,
        ctx=256, rope_theta=10000000.0, tied=False, ssm_state=16, ssm_k_heads=2, ssm_v_heads=4, ssm_conv=4,
        full_attention_interval=2, n_rot=8, name="tiny-qwen35", tokenizer="gpt2",
    ),
    # qwen35 with the attention.recurrent_layers array instead of the interval, in a pattern no interval
    # gives (attention first, then at layer 3 of 5), 6 V-heads on 2 K-heads (3 per K-head), rope over
    # 12 of 16 dims, a conv of 3 taps.
    "tiny-qwen35-rl": SynthSpec(
        "qwen35", n_layers=5, n_embd=64, n_heads=4, n_kv_heads=1, head_dim=16, n_ff=64, n_vocab=384,
        ctx=256, rope_theta=1000000.0, tied=False, ssm_state=16, ssm_k_heads=2, ssm_v_heads=6, ssm_conv=3,
        recurrent_layers=(False, True, True, False, True), n_rot=12, name="tiny-qwen35-rl", tokenizer="gpt2",
    ),
    # qwen35moe: qwen35's trunk (DeltaNet layers 0-2, attention at 3: the default interval 4) with 6
    # experts, top-2, 32 wide, and a shared expert 96 wide behind its sigmoid gate.
    "tiny-qwen35moe": SynthSpec(
        "qwen35moe", n_layers=4, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=32, n_ff=96, n_vocab=512,
        ctx=256, rope_theta=10000000.0, tied=False, ssm_state=16, ssm_k_heads=2, ssm_v_heads=4, ssm_conv=4,
        n_rot=8, n_expert=6, n_expert_used=2, n_ff_exp=32, name="tiny-qwen35moe", tokenizer="gpt2",
    ),
    # Real shapes, from each model's published config.json.
    "llama-3.2-1b": SynthSpec(
        "llama", n_layers=16, n_embd=2048, n_heads=32, n_kv_heads=8, head_dim=64, n_ff=8192, n_vocab=128256,
        ctx=131072, rope_theta=500000.0, tied=True, norm_eps=1e-5,
        rope_scaling=Llama3Rope(factor=32.0), name="Llama-3.2-1B (synthetic)",
    ),
    "llama-3.1-8b": SynthSpec(
        "llama", n_layers=32, n_embd=4096, n_heads=32, n_kv_heads=8, head_dim=128, n_ff=14336, n_vocab=128256,
        ctx=131072, rope_theta=500000.0, tied=False, norm_eps=1e-5,
        rope_scaling=Llama3Rope(factor=8.0), name="Llama-3.1-8B (synthetic)",
    ),
    "qwen3-0.6b": SynthSpec(
        "qwen3", n_layers=28, n_embd=1024, n_heads=16, n_kv_heads=8, head_dim=128, n_ff=3072, n_vocab=151936,
        ctx=40960, rope_theta=1000000.0, tied=True, name="Qwen3-0.6B (synthetic)",
    ),
    "qwen2.5-0.5b": SynthSpec(
        "qwen2", n_layers=24, n_embd=896, n_heads=14, n_kv_heads=2, head_dim=64, n_ff=4864, n_vocab=151936,
        ctx=32768, rope_theta=1000000.0, qkv_bias=True, tied=True, name="Qwen2.5-0.5B (synthetic)",
    ),
    # Qwen3-30B-A3B: 128 experts, 8 used, 768 wide; untied head.
    "qwen3-30b-a3b": SynthSpec(
        "qwen3moe", n_layers=48, n_embd=2048, n_heads=32, n_kv_heads=4, head_dim=128, n_ff=6144, n_vocab=151936,
        ctx=40960, rope_theta=1000000.0, tied=False, n_expert=128, n_expert_used=8, n_ff_exp=768,
        name="Qwen3-30B-A3B (synthetic)",
    ),
    # Llama-4-Scout-17B-16E: 16 experts top-1 and a shared expert on every layer (step 1), 8192 wide.
    # rope_scaling: llama3 type, factor 16, low = high frequency factor 1 (as recalled from the
    # published config; it changes only rope_freqs' values, not any shape).
    "llama-4-scout": SynthSpec(
        "llama4", n_layers=48, n_embd=5120, n_heads=40, n_kv_heads=8, head_dim=128, n_ff=16384, n_vocab=202048,
        ctx=10485760, rope_theta=500000.0, tied=False, norm_eps=1e-5, n_expert=16, n_expert_used=1,
        n_ff_exp=8192, moe_step=1, rope_scaling=Llama3Rope(factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0),
        name="Llama-4-Scout-17B-16E (synthetic)",
    ),
    # Qwen3.5-4B (text tower): 32 layers, attention every 4th (full_attention_interval 4), 16 query /
    # 4 KV heads of 256 with rope over 64 dims (partial_rotary_factor 0.25), DeltaNet 16 K-heads / 32
    # V-heads of 128 and a conv of 4, SwiGLU 9216 wide, tied head. From Qwen/Qwen3.5-4B's config.json
    # as published (text_config; the DeltaNet and rope fields are Qwen3.5's shared defaults, also in
    # wave2-families.md section 2.1).
    "qwen35-4b": SynthSpec(
        "qwen35", n_layers=32, n_embd=2560, n_heads=16, n_kv_heads=4, head_dim=256, n_ff=9216, n_vocab=248320,
        ctx=262144, rope_theta=10000000.0, tied=True, ssm_state=128, ssm_k_heads=16, ssm_v_heads=32, ssm_conv=4,
        full_attention_interval=4, n_rot=64, name="Qwen3.5-4B (synthetic)",
    ),
    # Qwen3.5-35B-A3B (text tower): 40 layers, attention every 4th, 16 query / 2 KV heads of 256, rope
    # over 64 dims, DeltaNet 16 K-heads / 32 V-heads of 128; 256 experts, 8 used, 512 wide, and a shared
    # expert 512 wide (n_ff); untied head. From Qwen/Qwen3.5-35B-A3B's published config.json (text_config).
    "qwen35-35b-a3b": SynthSpec(
        "qwen35moe", n_layers=40, n_embd=2048, n_heads=16, n_kv_heads=2, head_dim=256, n_ff=512, n_vocab=248320,
        ctx=262144, rope_theta=10000000.0, tied=False, n_expert=256, n_expert_used=8, n_ff_exp=512,
        ssm_state=128, ssm_k_heads=16, ssm_v_heads=32, ssm_conv=4, full_attention_interval=4, n_rot=64,
        name="Qwen3.5-35B-A3B (synthetic)",
    ),
    # From the metadata of the real gemma-3-270m GGUF.
    "gemma3-270m": SynthSpec(
        "gemma3", n_layers=18, n_embd=640, n_heads=4, n_kv_heads=1, head_dim=256, n_ff=2048, n_vocab=262144,
        ctx=32768, rope_theta=1000000.0, sliding_window=512, tied=True, name="Gemma-3-270M (synthetic)",
    ),
}
PRESETS.update(synth_gemma4.presets(SynthSpec))  # tiny-gemma4*, gemma4-e2b, gemma4-26b-a4b


def preset(name: str, **changes) -> SynthSpec:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)

"""Synthetic GGUF models: a family's real tensor names and metadata, random weights.

They serve two purposes. Tiny ones (F32) run through llama.cpp and infr alike
and make an exact oracle for families with no small real model (qwen3).
Full-size ones (the real shapes of Llama 3, Qwen 2.5/3, Qwen3-30B-A3B, Llama-4-Scout)
with quantized matrices feed benchmarks without downloading gigabytes. The MoE families'
experts, router and rules live in infr/synth_moe.py.

`write_gguf(spec, path, seed)` is deterministic: the same spec and seed give
the same bytes (tests compare sha256 against fixtures made by llama.cpp).
Every tensor draws from its own generator seeded by (seed, tensor name, row
chunk), so a tensor's values do not depend on the tensors around it, on the
weight type, or on memory: an F32 and a Q4_K file hold the same weights up to
quantization. Values are uniform draws, not normal ones, because uniform
float32 draws are a fixed bit transform of the generator's output, which is
the part of numpy's streams least likely to change between versions.

Weight types are llama-quantize's file types with its per-tensor mixes
(Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS, ...: the files people download),
"NAME-pure" for every matrix in one type, and Q4_K / Q5_K for all-Q4_K / all-Q5_K.

The tokenizer is llama.cpp's `test` model: it needs only
`tokenizer.ggml.tokens` (no merges, scores or types); callers feed token ids.

    python -m infr.synth tiny-qwen3 /tmp/q3.gguf
    python -m infr.synth qwen3-0.6b /tmp/q3.gguf --type Q4_K_M --seed 1
    python -m infr.synth llama-3.1-8b /tmp/8b-iq4.gguf --type IQ4_XS
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES

from infr import synth_gemma4, synth_moe, synth_qwen35
from infr.synth_gemma4 import Gemma4Shape
from infr.synth_encode import encode

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", *synth_moe.MOE_ARCHS, "qwen35", "gemma4")
CHUNK_ELEMENTS = 1 << 22  # rows are generated this many values at a time
BIAS_STD = 0.2
NORM_SPREAD = 0.2  # norm weights are uniform in 1 +- this


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3 long-context RoPE: per-frequency divisors stored as rope_freqs.weight."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192

    def freq_factors(self, theta: float, n_rot: int) -> np.ndarray:
        # Same rule as the Hugging Face -> GGUF converter: high frequencies
        # keep their speed, low ones slow by `factor`, a smooth ramp between.
        inv = theta ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        wavelen = 2 * math.pi / inv
        low_wavelen = self.original_context / self.low_freq_factor
        high_wavelen = self.original_context / self.high_freq_factor
        with np.errstate(divide="ignore", invalid="ignore"):  # low == high: no ramp (Llama 4)
            smooth = (self.original_context / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            ramp = 1.0 / ((1.0 - smooth) / self.factor + smooth)
        out = np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, self.factor, ramp))
        return out.astype(np.float32)


@dataclass(frozen=True)
class SynthSpec:
    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ff: int
    n_vocab: int
    ctx: int = 2048  # {arch}.context_length
    rope_theta: float = 10000.0
    sliding_window: int | None = None  # gemma3 local layers; required there
    qkv_bias: bool = False  # real qwen2 models always have it
    tied: bool = True  # no output.weight: the head reuses token_embd
    weight_type: str = "F32"  # a WEIGHT_TYPES name; norms, biases and rope_freqs stay F32
    norm_eps: float = 1e-6
    rope_scaling: Llama3Rope | None = None  # llama only
    name: str = "synthetic"
    tokenizer: str = "test"  # "test" (llama-cpp-python) or "gpt2" (llama-server builds without `test`)
    # mixture of experts (qwen3moe, llama4: infr/synth_moe.py)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # each expert's width (llama4's shared expert too)
    moe_step: int = 1  # llama4: every moe_step-th layer is MoE, the others dense (n_ff)
    # qwen35's gated DeltaNet layers (infr/synth_qwen35.py): d_k = d_v, heads, conv taps, pattern
    ssm_state: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_conv: int = 4
    full_attention_interval: int = 4
    recurrent_layers: tuple[bool, ...] | None = None  # written as attention.recurrent_layers instead
    n_rot: int = 0  # qwen35's rope.dimension_count (partial rotary)
    gemma4: Gemma4Shape | None = None  # gemma4's layer kinds, PLE, KV sharing (infr/synth_gemma4.py)

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3", "qwen3moe", "qwen35", "gemma4")

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; expected one of {', '.join(ARCHS)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if self.arch == "qwen2" and self.n_heads * self.head_dim != self.n_embd:
            # llama.cpp's qwen2 graph sizes attn_output as n_embd x n_embd
            raise ValueError("qwen2 needs n_heads * head_dim == n_embd")
        if self.arch == "gemma3" and not self.sliding_window:
            raise ValueError("gemma3 needs a sliding_window")
        if self.arch not in ("gemma3", "gemma4") and self.sliding_window:
            raise ValueError(f"{self.arch} has no sliding window")
        if self.rope_scaling is not None and self.arch not in ("llama", "llama4"):
            raise ValueError("rope_scaling (Llama 3 rope_freqs) is for llama and llama4 only")
        synth_moe.validate(self)
        synth_qwen35.validate(self)
        synth_gemma4.validate(self)
        if self.weight_type not in WEIGHT_TYPES:
            raise ValueError(f"unknown weight_type {self.weight_type!r}; expected one of {', '.join(WEIGHT_TYPES)}")


# --- presets -----------------------------------------------------------------------------------

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


# --- weight types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightType:
    """What `SynthSpec.weight_type` names: the file's general.file_type, the
    matrices' default type, and whether llama.cpp's per-tensor mix applies."""

    ftype: LlamaFileType
    base: Q
    mixed: bool


# Facts from llama.cpp, src/llama-quant.cpp (llama_ftype_get_default_type,
# llama_tensor_get_type_impl, tensor_type_fallback) and tools/quantize/quantize.cpp
# (QUANT_OPTIONS), for llama-quantize without an importance matrix:
# - every quantized file type has a default matrix type: Q4_0, Q4_1, Q5_0, Q5_1,
#   Q8_0 theirs; Q4_K_M -> Q4_K, Q5_K_M -> Q5_K, Q6_K -> Q6_K, IQ4_XS -> IQ4_XS.
# - the head (output.weight, or token_embd.weight in a model without output.weight)
#   stays Q8_0 in a Q8_0 file and is Q6_K in every other one here (Q8_0 when the
#   row length does not fit the block). An untied token_embd keeps the default.
# - attn_v: Q4_K_M and Q5_K_M give it Q6_K in the use_more_bits layers; IQ4_XS
#   gives it Q5_K in every layer when n_head / n_head_kv >= 4.
# - ffn_down: Q4_K_M and Q5_K_M give it Q6_K in the use_more_bits layers; IQ4_XS
#   gives it Q5_K in layers below n_layer / 8 (only without an imatrix: with one,
#   IQ4_XS leaves them be and Q4_0 makes them Q4_1).
# - use_more_bits(i, n): i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2. The loader
#   sorts tensors by layer, so its attn_v counter is the layer index.
# - rows not a multiple of 256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL.
# - general.file_type is the file type's number (Q4_0 2, Q8_0 7, Q4_K_M 15,
#   Q5_K_M 17, Q6_K 18, IQ4_XS 30); `--pure` keeps it and drops the mix (not the
#   row-length fallback). Norms, biases and rope_freqs (1-D) are never quantized.
# So a Q6_K file is all Q6_K and a Q8_0 file all Q8_0; Q4_0's head is Q6_K.
# llama-quantize also takes Q4_K and Q5_K as aliases of Q4_K_M and Q5_K_M; here
# they keep meaning every matrix in that one type (no file is published under
# those names, and kernel tests rely on single-type files). "NAME-pure" is a
# file type with every matrix in its default type, as `--pure` writes it.
_F = LlamaFileType
WEIGHT_TYPE_INFO: dict[str, WeightType] = {
    "F32": WeightType(_F.ALL_F32, Q.F32, False),
    "F16": WeightType(_F.MOSTLY_F16, Q.F16, False),
    "BF16": WeightType(_F.MOSTLY_BF16, Q.BF16, False),
    "Q4_K": WeightType(_F.MOSTLY_Q4_K_S, Q.Q4_K, False),
    "Q5_K": WeightType(_F.MOSTLY_Q5_K_S, Q.Q5_K, False),
    # llama-quantize's file types, with their mixes
    "Q4_0": WeightType(_F.MOSTLY_Q4_0, Q.Q4_0, True),
    "Q4_1": WeightType(_F.MOSTLY_Q4_1, Q.Q4_1, True),
    "Q5_0": WeightType(_F.MOSTLY_Q5_0, Q.Q5_0, True),
    "Q5_1": WeightType(_F.MOSTLY_Q5_1, Q.Q5_1, True),
    "Q8_0": WeightType(_F.MOSTLY_Q8_0, Q.Q8_0, True),
    "Q4_K_M": WeightType(_F.MOSTLY_Q4_K_M, Q.Q4_K, True),
    "Q5_K_M": WeightType(_F.MOSTLY_Q5_K_M, Q.Q5_K, True),
    "Q6_K": WeightType(_F.MOSTLY_Q6_K, Q.Q6_K, True),
    "IQ4_XS": WeightType(_F.MOSTLY_IQ4_XS, Q.IQ4_XS, True),
}
WEIGHT_TYPE_INFO.update({f"{name}-pure": replace(wt, mixed=False)
                         for name, wt in list(WEIGHT_TYPE_INFO.items()) if wt.mixed})
WEIGHT_TYPES = tuple(WEIGHT_TYPE_INFO)
FILE_TYPES = {name: wt.ftype for name, wt in WEIGHT_TYPE_INFO.items()}
# What benchmarks use when a preset comes without a type: the file most users download.
DEFAULT_MIX = "Q4_K_M"

# llama.cpp's substitutes when a row length is not a multiple of 256.
K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}


def _use_more_bits(i: int, n: int) -> bool:
    # The layers whose attn_v and ffn_down Q4_K_M and Q5_K_M give 6 bits.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _mixed_type(spec: SynthSpec, wt: WeightType, name: str) -> Q:
    """llama.cpp's choice for one matrix of a file type (the facts above)."""
    if spec.arch == "gemma4" and name == "per_layer_token_embd.weight":
        return synth_gemma4.mixed_type(spec, wt.ftype, name, wt.base, _use_more_bits) or wt.base
    if name == "output.weight" or (spec.tied and name == "token_embd.weight"):
        return Q.Q8_0 if wt.base == Q.Q8_0 else Q.Q6_K
    if not name.startswith("blk."):
        return wt.base
    g4 = synth_gemma4.mixed_type(spec, wt.ftype, name, wt.base, _use_more_bits) if spec.arch == "gemma4" else None
    moe = synth_moe.mixed_type(spec, wt.ftype, name, wt.base) if spec.n_expert else None
    if g4 is not None or moe is not None:
        return g4 if g4 is not None else moe
    layer, n = int(name.split(".")[1]), spec.n_layers
    k_mix = wt.ftype in (_F.MOSTLY_Q4_K_M, _F.MOSTLY_Q5_K_M)
    if name.endswith("attn_v.weight"):
        if k_mix and _use_more_bits(layer, n):
            return Q.Q6_K
        if wt.ftype == _F.MOSTLY_IQ4_XS and spec.n_heads // spec.n_kv_heads >= 4:
            return Q.Q5_K
    elif "ffn_down" in name:  # ffn_down, ffn_down_exps, ffn_down_shexp: one category, layer from the name
        if k_mix and _use_more_bits(layer, n):
            return Q.Q6_K
        if wt.ftype == _F.MOSTLY_IQ4_XS and layer < n // 8:
            return Q.Q5_K
    return wt.base


def matrix_type(spec: SynthSpec, name: str, n_cols: int) -> Q:
    """The GGML type of one matrix under spec.weight_type."""
    wt = WEIGHT_TYPE_INFO[spec.weight_type]
    if name.endswith("ffn_gate_inp.weight") and wt.base != Q.F32:
        return Q.F32  # the router is never quantized, even with --pure
    qtype = _mixed_type(spec, wt, name) if wt.mixed else wt.base
    if qtype in K_FALLBACK and n_cols % 256:
        qtype = K_FALLBACK[qtype]
    block = GGML_QUANT_SIZES[qtype][0]
    if n_cols % block:
        raise ValueError(f"{name}: row length {n_cols} is not a multiple of {qtype.name}'s block of {block}")
    return qtype


# --- tensors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TensorPlan:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols), or (n_expert, rows, cols) for an expert bank
    kind: str  # "matrix", "norm", "bias", "rope_freqs"
    qtype: Q


def tensor_plans(spec: SynthSpec) -> list[_TensorPlan]:
    """Every tensor of the model, in file order, with names as llama.cpp expects them."""
    e, hd, ff = spec.n_embd, spec.head_dim, spec.n_ff
    q_out, kv_out = spec.n_heads * hd, spec.n_kv_heads * hd
    out: list[_TensorPlan] = []

    def mat(name: str, rows: int, cols: int) -> None:
        out.append(_TensorPlan(name, (rows, cols), "matrix", matrix_type(spec, name, cols)))

    def vec(name: str, n: int, kind: str) -> None:
        out.append(_TensorPlan(name, (n,), kind, Q.F32))

    def bank(name: str, n_expert: int, rows: int, cols: int) -> None:
        out.append(_TensorPlan(name, (n_expert, rows, cols), "matrix", matrix_type(spec, name, cols)))

    def raw(name: str, shape: tuple[int, ...], kind: str) -> None:
        out.append(_TensorPlan(name, shape, kind, Q.F32))

    if spec.arch == "gemma4":
        synth_gemma4.tensors(spec, mat, vec, bank, raw)
        return out
    mat("token_embd.weight", spec.n_vocab, e)
    if spec.rope_scaling is not None:
        vec("rope_freqs.weight", hd // 2, "rope_freqs")
    for i in range(spec.n_layers):
        if spec.arch == "qwen35":
            synth_qwen35.layer_tensors(spec, i, mat, vec, raw)
            continue
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", e, "norm")
        mat(p + "attn_q.weight", q_out, e)
        mat(p + "attn_k.weight", kv_out, e)
        mat(p + "attn_v.weight", kv_out, e)
        if spec.qkv_bias:
            vec(p + "attn_q.bias", q_out, "bias")
            vec(p + "attn_k.bias", kv_out, "bias")
            vec(p + "attn_v.bias", kv_out, "bias")
        if spec.qk_norm:
            vec(p + "attn_q_norm.weight", hd, "norm")
            vec(p + "attn_k_norm.weight", hd, "norm")
        mat(p + "attn_output.weight", e, q_out)
        if spec.arch == "gemma3":
            vec(p + "post_attention_norm.weight", e, "norm")
        vec(p + "ffn_norm.weight", e, "norm")
        if synth_moe.is_moe_layer(spec, i):
            synth_moe.ffn_tensors(spec, i, mat, bank)
        else:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
        if spec.arch == "gemma3":
            vec(p + "post_ffw_norm.weight", e, "norm")
    vec("output_norm.weight", e, "norm")
    if not spec.tied:
        mat("output.weight", spec.n_vocab, e)
    return out


def _uniform(seed: int, name: str, chunk: int, n: int, half_width: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])
    u = rng.random(n, dtype=np.float32)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(half_width)


def _vector_values(spec: SynthSpec, t: _TensorPlan, seed: int) -> np.ndarray:
    n = t.shape[0]
    if t.kind in synth_gemma4.VECTOR_KINDS:
        return synth_gemma4.vector_values(spec, t.name, t.kind, n, seed, _uniform)
    if t.kind == "rope_freqs":
        assert spec.rope_scaling is not None
        return spec.rope_scaling.freq_factors(spec.rope_theta, spec.head_dim)
    if t.kind == "norm":
        return np.float32(1.0) + _uniform(seed, t.name, 0, n, NORM_SPREAD)
    if t.kind == "ssm_a":  # -exp(A_log), A_log uniform in -1..1
        return (-np.exp(_uniform(seed, t.name, 0, n, 1.0))).astype(np.float32)
    return _uniform(seed, t.name, 0, n, BIAS_STD * math.sqrt(3.0))


def _chunk_bounds(t: _TensorPlan) -> list[tuple[int, int]]:
    """(chunk number, rows) of each fixed row chunk of a matrix (an expert bank's rows run on
    from one expert to the next)."""
    rows, cols = int(np.prod(t.shape[:-1])), t.shape[-1]
    per_chunk = max(1, CHUNK_ELEMENTS // cols)
    return [(c, min(per_chunk, rows - start)) for c, start in enumerate(range(0, rows, per_chunk))]


def _chunk_values(t: _TensorPlan, seed: int, c: int, n: int) -> np.ndarray:
    cols = t.shape[-1]
    return _uniform(seed, t.name, c, n * cols, math.sqrt(3.0 / cols)).reshape(n, cols)


def _matrix_chunks(t: _TensorPlan, seed: int) -> Iterator[np.ndarray]:
    """Rows in fixed chunks; each value has std 1/sqrt(row length), so every
    matmul keeps its input's scale and activations stay O(1) in any depth."""
    for c, n in _chunk_bounds(t):
        yield _chunk_values(t, seed, c, n)


def _encoded_chunk(job: tuple) -> bytes:
    t, seed, c, n = job
    return np.ascontiguousarray(encode(_chunk_values(t, seed, c, n), t.qtype)).tobytes()


class _StreamedTensor:
    """Quacks like the ndarray GGUFWriter.write_tensor_data expects (nbytes,
    tofile) but encodes one row chunk at a time, so an 8B model never sits in
    memory as float32."""

    def __init__(self, t: _TensorPlan, seed: int, pool=None):
        self.t, self.seed, self.pool = t, seed, pool
        self.nbytes = tensor_nbytes(t)

    def tofile(self, f) -> None:
        jobs = [(self.t, self.seed, c, n) for c, n in _chunk_bounds(self.t)]
        # Chunks are independent (each seeds its own generator): encoded in
        # parallel where there are cores, written in order, same bytes.
        for data in (self.pool.map(_encoded_chunk, jobs) if self.pool else map(_encoded_chunk, jobs)):
            f.write(data)


def tensor_nbytes(t: _TensorPlan) -> int:
    block, size = GGML_QUANT_SIZES[t.qtype]
    n = int(np.prod(t.shape))
    return n // block * size


def _payload_dtype(qtype: Q) -> np.dtype:
    return {Q.F32: np.dtype(np.float32), Q.F16: np.dtype(np.float16)}.get(qtype, np.dtype(np.uint8))


def _byte_shape(t: _TensorPlan) -> tuple[int, ...]:
    if t.qtype in (Q.F32, Q.F16):
        return t.shape
    return (*t.shape[:-1], tensor_nbytes(t) // int(np.prod(t.shape[:-1])))


# --- the file ----------------------------------------------------------------------------------


def _add_metadata(w: GGUFWriter, spec: SynthSpec) -> None:
    w.add_name(spec.name)
    w.add_context_length(spec.ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layers)
    w.add_feed_forward_length(synth_gemma4.n_ff(spec))
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(synth_gemma4.kv_heads(spec))
    # Converters write key/value lengths when they differ from n_embd / n_heads
    # (and always for qwen3 and gemma3, whose configs carry head_dim).
    if spec.qk_norm or spec.head_dim * spec.n_heads != spec.n_embd:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.norm_eps)
    if spec.arch in ("llama", "llama4"):
        w.add_rope_dimension_count(spec.head_dim)
        w.add_vocab_size(spec.n_vocab)
    synth_moe.add_metadata(w, spec)
    synth_qwen35.add_metadata(w, spec)
    synth_gemma4.add_metadata(w, spec)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    w.add_file_type(int(FILE_TYPES[spec.weight_type]))
    if spec.weight_type not in ("F32", "F16", "BF16"):
        w.add_quantization_version(2)
    if spec.tokenizer == "gpt2":
        # A byte-level BPE vocabulary: GPT-2's 256 byte symbols, then fillers;
        # llama.cpp insists on a merges list, so give it one.
        byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [
            chr(c) for c in range(174, 256)]
        byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
        tokens = byte_chars + [f"t{i}" for i in range(spec.n_vocab - len(byte_chars))]
        # Bytes >= 128 alone are not UTF-8: as control tokens they print nothing,
        # so random greedy output never trips a server's text handling.
        non_ascii = set(range(94, 188)) | {i for i in range(188, 256) if not (i - 188 <= 32 or i - 188 == 33)}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if i in non_ascii else 1 for i in range(spec.n_vocab)])
        w.add_token_merges(["t 0"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        return
    w.add_tokenizer_model("test")
    # llama.cpp's test tokenizer prints a token as its id in hex; name tokens so.
    w.add_token_list([f"{i:x}" for i in range(spec.n_vocab)])


def write_gguf(spec: SynthSpec, path: str | Path, seed: int = 0) -> Path:
    """Write `spec` with weights drawn from `seed`; same inputs, same bytes."""
    spec.validate()
    path = Path(path)
    plans = tensor_plans(spec)
    w = GGUFWriter(path, spec.arch)
    pool = _pool() if sum(tensor_nbytes(t) for t in plans) > 1 << 28 else None
    try:
        _add_metadata(w, spec)
        for t in plans:
            w.add_tensor_info(t.name, _byte_shape(t), _payload_dtype(t.qtype), tensor_nbytes(t), raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in plans:
            if t.kind == "matrix":
                data = _StreamedTensor(t, seed, pool)
            else:
                data = _vector_values(spec, t, seed)
            w.write_tensor_data(data, tensor_endianess=GGUFEndian.LITTLE)  # type: ignore[arg-type]
    finally:
        w.close()
        if pool is not None:
            pool.shutdown()
    return path


def _pool():
    """Worker processes for encoding big models (the H200 host has 16 cores), or None."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n < 4 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"))


def reference_weights(spec: SynthSpec, name: str, seed: int = 0) -> np.ndarray:
    """The float32 values `write_gguf` draws for one tensor, before quantization."""
    for t in tensor_plans(spec):
        if t.name == name:
            if t.kind == "matrix":
                return np.concatenate(list(_matrix_chunks(t, seed))).reshape(t.shape)
            return _vector_values(spec, t, seed)
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infr.synth", description="Write a random-weight GGUF model.")
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default=None, choices=WEIGHT_TYPES,
                    help="a llama-quantize file type (with its per-tensor mix), NAME-pure, Q4_K or Q5_K "
                         "(default: the preset's, F32)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    spec = PRESETS[args.preset]
    if args.type:
        spec = replace(spec, weight_type=args.type)
    try:
        path = write_gguf(spec, args.out, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {spec.arch} {spec.n_layers} layers, d={spec.n_embd}, {spec.weight_type}, "
          f"{path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

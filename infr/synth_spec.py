"""infr.synth's model description: SynthSpec (a family's shape and options), Llama 3's RoPE
scaling, and the weight types a synthetic file can have (llama-quantize's file types and their
default matrix types). infr.synth re-exports all of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType

from infr import synth_gemma4, synth_moe, synth_qwen35
from infr.synth_gemma4 import Gemma4Shape

# qwen35moe is both: a MoE arch and a hybrid DeltaNet one
ARCHS = tuple(dict.fromkeys(("llama", "qwen2", "qwen3", "gemma3", *synth_moe.MOE_ARCHS, *synth_qwen35.QWEN35_ARCHS, "gemma4")))


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
    n_ff_exp: int = 0  # each expert's width (llama4's shared expert too; qwen35moe's shared expert is n_ff wide)
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
    chat_template: str | None = None  # tokenizer.chat_template, for chat and tool tests through the server
    # gpt2 tokenizer only: vocabulary entries (the last ones) that become control tokens,
    # so a template's markers tokenize as one token each, as in the real model
    special_tokens: tuple[str, ...] = ()

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3", "qwen3moe", *synth_qwen35.QWEN35_ARCHS, "gemma4")

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
# - attn_v (and attn_qkv, qwen35's DeltaNet input: tensor_get_category puts it in attn_v's
#   category, one per layer, so the counter is still the layer): Q4_K_M and Q5_K_M give it Q6_K in
#   the use_more_bits layers; IQ4_XS
#   gives it Q5_K in every layer when n_head / n_head_kv >= 4.
# - ffn_down: Q4_K_M and Q5_K_M give it Q6_K in the use_more_bits layers; IQ4_XS
#   gives it Q5_K in layers below n_layer / 8 (only without an imatrix: with one,
#   IQ4_XS leaves them be and Q4_0 makes them Q4_1).
# - use_more_bits(i, n): i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2. The loader
#   sorts tensors by layer, so its attn_v counter is the layer index.
# - rows not a multiple of 256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL.
# - general.file_type is the file type's number (Q4_0 2, Q8_0 7, Q4_K_M 15,
#   Q5_K_M 17, Q6_K 18, IQ4_XS 30); `--pure` keeps it and drops the mix (not the
#   row-length fallback). Norms, biases and rope_freqs (1-D) are never quantized, nor ssm_conv1d
#   (by name); attn_gate, ssm_alpha, ssm_beta and ssm_out are in no category: the default type.
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

"""The mixture-of-experts part of infr.synth: which layers are MoE, their tensors, their
metadata and llama-quantize's rules for them (a module of its own so synth.py stays readable).

Facts from llama.cpp (src/llama-quant.cpp, src/models/{qwen3moe,llama4,qwen35moe}.cpp):
- the router `ffn_gate_inp.weight` is never quantized (tensor_allows_quantization); 1-D
  tensors never are;
- expert banks are 3-D tensors [n_expert, out, in] (ggml {in, out, n_expert}) quantized row by
  row like any matrix, in the category their name gives: `ffn_down_exps` and `ffn_down_shexp`
  are "ffn_down" (Q4_K_M / Q5_K_M: Q6_K in the use_more_bits layers, the layer read from the
  tensor's name when n_expert > 1), gate/up banks "ffn_gate"/"ffn_up" (the default type);
- with exactly 8 experts (Mixtral) attn_v and attn_k are Q8_0 and, in Q4_K_M, attn_output Q5_K
  (attn_qkv, qwen35moe's DeltaNet input, is in attn_v's category);
- llama4: every interleave_moe_layer_step-th layer ((il + 1) % step == 0) is MoE with a shared
  expert of the experts' width; the others have a dense FFN of feed_forward_length;
- qwen35moe: every layer is MoE (softmax, top-k, renormalised) plus a shared expert of
  expert_shared_feed_forward_length (here n_ff) scaled by sigmoid(ffn_gate_inp_shexp . x), that
  gate a 1-D {n_embd} tensor (so never quantized).

Checked with llama.cpp build 11434's llama-server (CPU, -nr): qwen3-30b-a3b cut to 2 layers and
llama-4-scout cut to 4, both Q4_K_M, load and generate; on the Qwen3 one infr's CPU reference
gives the same 4 greedy tokens. A llama4 file of fewer than 4 layers has no NoPE layer, and
llama.cpp then aborts on its unused temperature input ("tensor buffer not set"): cut llama4
presets to 4 layers or more.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType

MOE_ARCHS = ("qwen3moe", "llama4", "qwen35moe")


def is_moe_layer(spec, i: int) -> bool:
    if spec.arch == "llama4":
        return spec.moe_step > 0 and (i + 1) % spec.moe_step == 0
    return spec.arch in MOE_ARCHS


def validate(spec) -> None:
    if spec.arch in MOE_ARCHS:
        if not 0 < spec.n_expert_used <= spec.n_expert:
            raise ValueError(f"{spec.arch} needs 0 < n_expert_used ({spec.n_expert_used}) <= n_expert ({spec.n_expert})")
        if spec.n_ff_exp <= 0:
            raise ValueError(f"{spec.arch} needs n_ff_exp")
    elif spec.n_expert and spec.arch != "gemma4":  # gemma4's experts: infr/synth_gemma4.py
        raise ValueError(f"{spec.arch} has no experts")


def ffn_tensors(spec, i: int, mat, bank, vec) -> None:
    """The MoE FFN tensors of layer i, in llama.cpp's load order: mat(name, rows, cols) for a
    matrix, bank(name, n_expert, rows, cols) for an expert bank, vec(name, n, kind) for a vector."""
    p, e, ff = f"blk.{i}.", spec.n_embd, spec.n_ff_exp
    mat(p + "ffn_gate_inp.weight", spec.n_expert, e)
    bank(p + "ffn_gate_exps.weight", spec.n_expert, ff, e)
    bank(p + "ffn_down_exps.weight", spec.n_expert, e, ff)
    bank(p + "ffn_up_exps.weight", spec.n_expert, ff, e)
    if spec.arch == "llama4":  # the shared expert, as wide as one expert
        mat(p + "ffn_gate_shexp.weight", ff, e)
        mat(p + "ffn_down_shexp.weight", e, ff)
        mat(p + "ffn_up_shexp.weight", ff, e)
    if spec.arch == "qwen35moe":  # a shared expert n_ff wide, scaled by sigmoid(ffn_gate_inp_shexp . x)
        vec(p + "ffn_gate_inp_shexp.weight", e, "row")
        mat(p + "ffn_gate_shexp.weight", spec.n_ff, e)
        mat(p + "ffn_up_shexp.weight", spec.n_ff, e)
        mat(p + "ffn_down_shexp.weight", e, spec.n_ff)


def add_metadata(w, spec) -> None:
    if spec.arch not in MOE_ARCHS:
        return
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.arch == "llama4":
        w.add_interleave_moe_layer_step(spec.moe_step)
    if spec.arch == "qwen35moe":
        w.add_expert_shared_feed_forward_length(spec.n_ff)


def mixed_type(spec, ftype: LlamaFileType, name: str, default: Q) -> Q | None:
    """llama-quantize's type for an MoE model's tensor where its rules differ from a dense model's,
    else None (the caller's rules apply)."""
    if name.endswith("ffn_gate_inp.weight"):
        return Q.F32
    if spec.n_expert == 8:
        if name.endswith(("attn_v.weight", "attn_qkv.weight", "attn_k.weight")):
            return Q.Q8_0
        if name.endswith("attn_output.weight") and ftype == LlamaFileType.MOSTLY_Q4_K_M:
            return Q.Q5_K
    return None

"""Qwen3.5 / Qwen3.6 MoE (`qwen35moe`: 35B-A3B, 122B-A10B, 397B-A17B), wave2-families.md section 2:
qwen35's trunk (gated DeltaNet and gated attention layers, infr/models/qwen35.py) with a mixture
of experts on every layer: softmax over all experts, the top expert_used_count, their weights
renormalised, SiLU-gated experts, plus a shared expert scaled per token by
sigmoid(ffn_gate_inp_shexp . x) (a 1-D {n_embd} gate), added to the experts' sum.

Widths as llama.cpp's loader reads them: expert_feed_forward_length, else feed_forward_length /
expert_used_count; expert_shared_feed_forward_length, else feed_forward_length. The gate and up
banks are ffn_gate_exps + ffn_up_exps or one fused ffn_gate_up_exps.
"""

from __future__ import annotations

from infr.errors import GGUFError
from infr.gguf_file import GGUFFile
from infr.models.hparams import expert_counts, read_hparams
from infr.models.qwen35 import hybrid_spec
from infr.models.spec import Activation, Gating, ModelSpec, MoESpec, SharedExpert


def build(gf: GGUFFile) -> ModelSpec:
    hp = read_hparams(gf)
    n_expert, n_used = expert_counts(gf)
    hidden = int(gf.arch_key("expert_feed_forward_length", 0)) or hp.n_ff // n_used
    shared = int(gf.arch_key("expert_shared_feed_forward_length", 0)) or hp.n_ff
    if hidden <= 0 or shared <= 0:
        raise GGUFError(f"{gf.path.name}: qwen35moe needs expert_feed_forward_length and "
                        f"expert_shared_feed_forward_length (or feed_forward_length)")
    moe = MoESpec(n_expert, n_used, hidden, Activation.SILU, Gating.SOFTMAX, norm_weights=True,
                  fused_gate_up=gf.has_tensor("blk.0.ffn_gate_up_exps.weight"),
                  shared=SharedExpert(shared, Activation.SILU, gated=True))
    return hybrid_spec(gf, hp, moe)

"""The CPU reference for the ops of the newer layer kinds: the MoE FFN (infr/cpu/moe.py), the
shared expert's sigmoid gate, llama4's query temperature and its weightless q/k norm, qwen35's
gated attention (the [q | gate] split, the sigmoid output gate) and its DeltaNet mixer
(infr/cpu/deltanet.py, with the per-sequence state the backend keeps), gemma4's per-layer embeddings
and scaled values.
CPUBackend._compile asks here first; None means an op it implements itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from infr.cpu import ops as F
from infr.cpu.deltanet import RecurrentStore, deltanet_forward
from infr.cpu.moe import ExpertBank, ExpertCache, moe_forward, sigmoid
from infr.ops import DeltaNet, HeadSlice, MoE, Mul, PerLayerInputs, PLEGate, QueryTemp, RMSNorm, SigmoidGate, SigmoidMul

ONE = np.float32(1.0)


def compile_op(be, op) -> Callable | None:
    """op as a function of (env, ids, rows), or None for the ops CPUBackend runs itself."""
    if isinstance(op, MoE):
        cache = be.__dict__.setdefault("expert_cache", ExpertCache())
        banks = [ExpertBank(be.gf.tensor(name), cache) for name in op.banks]
        be.__dict__.setdefault("expert_banks", {}).update({b.name: b for b in banks})
        q8 = op.q8 if op.q8 is not None else (False,) * len(banks)
        rounding = be.plan.q8_rounding
        scales = be.w[op.scales] if op.scales else None

        def moe(env, ids, ctx):
            env[op.dst] = moe_forward(env[op.src], env[op.logits], op.spec, banks, q8, rounding, scales)
        return moe
    if isinstance(op, Mul):
        wv, scale = be.w[op.weight], np.float32(op.scale)
        return lambda env, ids, ctx: env.__setitem__(op.buf, (env[op.buf] * scale) * wv)
    if isinstance(op, PerLayerInputs):
        return _per_layer_inputs(be, op)
    if isinstance(op, PLEGate):
        lo, hi = op.layer * op.width, (op.layer + 1) * op.width

        def ple_gate(env, ids, ctx):
            env[op.buf] = F.gated_act(env[op.buf], env[op.ple][:, lo:hi], op.act)
        return ple_gate
    if isinstance(op, SigmoidGate):
        wv = be.w[op.weight]

        def gate(env, ids, ctx):
            x = env[op.src]
            logit = (x * wv).sum(axis=-1, dtype=np.float32)  # one row's sum: independent of the others
            env[op.buf] = env[op.buf] * sigmoid(logit)[:, None]
        return gate
    if isinstance(op, QueryTemp):

        def temp(env, ids, ctx):
            env[op.buf] = env[op.buf] * op.temp.factor(ctx.pos)[:, None]
        return temp
    if isinstance(op, HeadSlice):
        lo, hi = op.part * op.head_dim, (op.part + 1) * op.head_dim

        def head_slice(env, ids, ctx):
            x = env[op.src]
            env[op.dst] = np.ascontiguousarray(x.reshape(len(x), op.n_heads, 2 * op.head_dim)[:, :, lo:hi]).reshape(
                len(x), op.n_heads * op.head_dim)
        return head_slice
    if isinstance(op, SigmoidMul):
        return lambda env, ids, ctx: env.__setitem__(op.buf, env[op.buf] * sigmoid(env[op.gate]))
    if isinstance(op, DeltaNet):
        store: RecurrentStore = be.recurrent
        conv, dt_bias, a, norm = (be.w[name] for name in op.tensors)

        def deltanet(env, ids, ctx):
            env[op.dst] = deltanet_forward(op.spec, env[op.qkv], env[op.z], env[op.beta], env[op.alpha], ctx.pos,
                                           ctx.slots, store, op.layer, conv, dt_bias, a, norm, op.eps)
        return deltanet
    if isinstance(op, RMSNorm) and op.weight is None:
        return lambda env, ids, ctx: env.__setitem__(op.dst, F.rms_norm(env[op.src], ONE, op.eps, op.group))
    return None


def _per_layer_inputs(be, op: PerLayerInputs) -> Callable:
    """gemma4's per-layer inputs (ops.PerLayerInputs): the table's rows gathered from the file's blocks
    (WeightStore.rows; the table is never expanded), in llama.cpp's order of scalings."""
    norm = be.w[op.norm]
    proj_scale = np.float32(1.0) / np.sqrt(np.float32(op.n_embd))
    row_scale = np.sqrt(np.float32(op.width))
    half = np.float32(1.0) / np.sqrt(np.float32(2.0))

    def ple(env, ids, ctx):
        pj = F.rms_norm(env[op.proj] * proj_scale, norm, op.eps, op.width)
        pl = be.w.rows(op.table, ids) * row_scale
        env[op.dst] = ((pj + pl) * half).astype(np.float32, copy=False)
    return ple

"""Executes a plan with numpy: batched prefill and one-token decode.

The KV cache is static ([n_ctx, kv_heads, head_dim] per layer) and float16,
as llama.cpp's default cache is, so rounding matches the oracle.
"""

from __future__ import annotations

import numpy as np

from infr.cpu import ops as F
from infr.cpu.weights import WeightStore, check_supported
from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.ops import Add, Attention, Embed, GatedAct, MatMul, RMSNorm, Rope, Softcap, StoreKV
from infr.plan import Plan


class ContextFullError(InfrError):
    pass


class CPUBackend:
    name = "cpu"

    def __init__(self, gf: GGUFFile, plan: Plan, n_ctx: int):
        self.gf, self.plan, self.n_ctx = gf, plan, n_ctx
        for name in plan.weights():
            check_supported(gf.tensor(name))  # missing tensor / unsupported type fail at load
        self.w = WeightStore(gf)
        # The embedding table is gathered row by row unless the head needs it whole.
        embed_table = plan.embed[0].table
        self.w.load_all(plan.weights(), skip=frozenset() if plan.spec.tied_embeddings else {embed_table})
        self.k_cache: dict[int, np.ndarray] = {}
        self.v_cache: dict[int, np.ndarray] = {}
        for layer in plan.spec.layers:
            a = layer.attention
            self.k_cache[layer.index] = np.zeros((n_ctx, a.n_kv_heads, a.head_dim), np.float16)
            self.v_cache[layer.index] = np.zeros((n_ctx, a.n_kv_heads, a.v_head_dim), np.float16)

    def forward(self, tokens: list[int] | np.ndarray, start: int, n_logits: int = 1) -> np.ndarray:
        """Run tokens at positions start..; logits [n_logits, vocab] of the last rows."""
        ids = np.asarray(tokens, dtype=np.int64)
        if start + len(ids) > self.n_ctx:
            raise ContextFullError(
                f"context full: {start + len(ids)} tokens do not fit in a context of {self.n_ctx}"
            )
        if len(ids) and (ids.min() < 0 or ids.max() >= self.plan.spec.n_vocab):
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")
        env: dict[str, np.ndarray] = {}
        pos = np.arange(start, start + len(ids))
        for op in self.plan.embed + self.plan.layers:
            self._run(op, env, ids, pos)
        env["x"] = env["x"][-n_logits:] if n_logits > 0 else env["x"]
        for op in self.plan.head:
            self._run(op, env, ids, pos)
        return env["logits"]

    def _run(self, op, env: dict[str, np.ndarray], ids: np.ndarray, pos: np.ndarray) -> None:
        w = self.w
        if isinstance(op, MatMul):
            y = F.matmul_input(env[op.src], self.gf.tensor(op.weight).qtype) @ w[op.weight].T
            if op.bias:
                y += w[op.bias]
            env[op.dst] = y
        elif isinstance(op, RMSNorm):
            env[op.dst] = F.rms_norm(env[op.src], w[op.weight], op.eps, op.group)
        elif isinstance(op, Rope):
            ff = w[op.rope.freq_factors] if op.rope.freq_factors else None
            angles = F.rope_angles(pos, op.rope, ff)
            env[op.buf] = F.rope(env[op.buf], op.n_heads, op.head_dim, angles, op.rope.style)
        elif isinstance(op, StoreKV):
            kc, vc = self.k_cache[op.layer], self.v_cache[op.layer]
            kc[pos] = env[op.k].reshape(len(pos), kc.shape[1], kc.shape[2])
            vc[pos] = env[op.v].reshape(len(pos), vc.shape[1], vc.shape[2])
        elif isinstance(op, Attention):
            a = op.spec
            env[op.dst] = F.attention(
                env[op.q], self.k_cache[op.layer], self.v_cache[op.layer], pos, int(pos[-1]) + 1,
                a.n_heads, a.scale, a.sliding_window, a.softcap,
            )
        elif isinstance(op, GatedAct):
            env[op.dst] = F.gated_act(env[op.gate], env[op.up], op.act)
        elif isinstance(op, Add):
            env[op.dst] = env[op.a] + env[op.b]
        elif isinstance(op, Embed):
            env[op.dst] = w.rows(op.table, ids) * np.float32(op.scale)
        elif isinstance(op, Softcap):
            env[op.buf] = np.tanh(env[op.buf] / op.cap) * np.float32(op.cap)
        else:  # a new op kind must be implemented here before a plan may use it
            raise NotImplementedError(type(op).__name__)

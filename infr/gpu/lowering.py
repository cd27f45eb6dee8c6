"""Lowering: a plan's ops into the dispatches of one batch shape (GPUBackend._graph).

Which kernel each matmul takes (GEMV, int8 GEMV, f32 GEMM, int8 GEMM), stacked
q|k|v, fused gate||up, rope + KV store, residual epilogues, the norms and the
attention kernels, and which half of a ping-pong pair holds each named value;
the plan names the runs to fuse (Plan.groups, infr/fusion.py) and this takes
them where a kernel applies (docs/gpu_kernels.md). Kept apart from backend.py, which loads weights, owns
the buffers and KV store and runs the graphs this builds.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING

import numpy as np

from infr import fusion
from infr.gguf_file import GGUFFile
from infr.gpu import host_moe as HM
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_deltanet as KDN
from infr.gpu import kernels_embed as KE
from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_gemma4 as KG4
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_moe as KMoE
from infr.gpu import kernels_norm_in as KN
from infr.gpu import kernels_q8 as KQ
from infr.gpu import kernels_qkv_rope as KQR
from infr.gpu import tuning as TU
from infr.gpu.runtime import Dispatch
from infr.models.spec import RopeSpec, RopeStyle
from infr.ops import (Add, Attention, DeltaNet, Embed, GatedAct, HeadSlice, MatMul, MoE, Mul, PerLayerInputs, PLEGate,
                      QueryTemp, RMSNorm, Rope, SigmoidGate, SigmoidMul, Softcap, StoreKV)
from infr.plan import Plan

if TYPE_CHECKING:
    from infr.gpu.backend import GPUBackend


class Lowering:
    """Turns plan ops into dispatches for one batch shape, tracking which
    physical buffer holds each named value."""

    def __init__(self, be: GPUBackend, T: int, far: bool = False, decode: bool = False):
        self.be, self.k, self.rows = be, be.kern, T
        self.span = "far" if far else "near"  # which attention a "switch" layer keeps
        self.decode = decode  # a batched decode step: per-row attention kernels (attention_mode)
        self.phys = {name: 0 for name in be.buffers}
        self.external: dict[str, object] = {}
        self.ahead = None  # the next plan op (a norm feeding a Q4_K GEMV also rounds its output)
        self.ahead2 = None  # and the one after (a MoE's experts read the norm past its router)
        self.q8 = None  # (buffer, K, scratch): whose rounded rows the q8 scratch holds (kernels_q8), or a
        # kernels_norm_in.NormIn for the scratch: a norm the GEMV reading it runs in its prologue
        self.after: tuple[list, int] | None = None  # (ops, i): the op lowered alone is ops[i] (what reads its output)

    def current(self, name: str):
        if name in self.external:
            return self.external[name]
        return self.be.buffers[name][self.phys[name]]

    def bind_external(self, name: str, buf) -> None:
        self.external[name] = buf

    def target(self, name: str, *reads: str):
        """The buffer to write `name` into; the other half of its pair if the op also reads it."""
        self.external.pop(name, None)
        pair = self.be.buffers[name]
        if name in reads:
            self.phys[name] ^= 1
            if len(pair) == 1:  # the second half, made the first time a shape needs it
                pair.append(self.be._activation(name, 1))
        if self.q8 is not None and self.q8[0] is pair[self.phys[name]]:
            self.q8 = None  # overwritten: its rounded rows are stale
        return pair[self.phys[name]]

    def q8_input(self, x, K: int, fuse: tuple | None = None) -> tuple[list[Dispatch], object]:
        """x rounded for the Q4_K GEMV: the q8 scratch when it already holds x
        (q, k, v or gate, up after one norm), else a quantize dispatch first. A norm put off
        (norm_in) comes back as its NormIn where `fuse` = (rows, workgroup bytes, storage buffers, rows a
        workgroup) of the GEMV asking lets it norm its input itself (kernels_norm_in.takes), else as its
        rmsnorm_q8."""
        if self.q8 is not None and self.q8[0] is x and self.q8[1] == K:
            xq = self.q8[2]
            if isinstance(xq, KN.NormIn) and not (fuse and KN.takes(self.be.dev, K, fuse[0], self.rows, *fuse[1:])):
                d, xq = KQ.rmsnorm_q8_dispatch(self.k, xq.x, xq.g, x, K, xq.eps, self.rows)
                self.q8 = (x, K, xq)
                return [d], xq
            return [], xq
        d, xq = KQ.quantize_dispatch(self.k, x, K, self.rows)
        self.q8 = (x, K, xq)
        return [d], xq

    def _gemv_q8(self, t, x, q8: bool, fuse: tuple | None = None) -> tuple[list[Dispatch], object]:
        """([], None) unless weight t (of a matmul marked q8, MatMul.q8) runs the int8 GEMV on this
        graph's batches; `fuse` as q8_input's."""
        if KG.use_gemm(self.rows, self.be.dev) or not _reads_q8(t, q8):
            return [], None
        return self.q8_input(x, int(t.shape[-1]), fuse)

    def norm_in(self, norm: RMSNorm, x, g, y) -> bool:
        """Whether the norm (y = rmsnorm(x) * g, feeding the int8 GEMV) is put off into the GEMVs that read
        it (kernels_norm_in): one row a step on the GEMV, and the ops that read the output before it is
        rewritten are the matmuls right after the norm, each reading it rounded by the int8 GEMV over rows
        of its width and none writing x (the q8 scratch holds one value: any op between them may
        replace it, and an unwritten y would then be read)."""
        width = self.be.widths[norm.src]
        if (self.rows != 1 or not KM.GemvTuning.for_device(self.be.dev).NORM or width % 256 or self.after is None
                or KG.use_gemm(self.rows, self.be.dev) or norm.dst in self.be.plan.carried):
            return False
        ops, i = self.after
        readers, next_to = 0, True  # matmuls of y so far; whether they all came right after the norm
        for op in ops[i + 1:]:
            names = [getattr(op, f.name) for f in fields(op)]
            if isinstance(op, MatMul) and op.src == norm.dst:
                t = self.be.gf.tensor(op.weight)
                if not (next_to and op.dst != norm.src and _reads_q8(t, op.q8) and KM.has_gemv(t.qtype, width)
                        and int(t.shape[-1]) == width):
                    return False
                readers += 1
            elif norm.dst in names:
                if getattr(op, "dst", None) != norm.dst or names.count(norm.dst) > 1:
                    return False  # read as floats
                break  # rewritten
            else:
                if next_to and getattr(op, "dst", None) == norm.src:
                    return False  # the op right after the readers (a pair's activation, in its GEMV) writes x
                next_to = False
        if not readers:
            return False
        self.q8 = (y, width, KN.NormIn(x, g, width, norm.eps))
        return True

    def _mmq(self, t, x, q8: bool):
        """(quantize dispatches, rounded x) when weight t (of a matmul marked q8) runs the int8 GEMM
        (kernels_mmq) on this graph's batches, else None."""
        if not KMQ.use_mmq(self.rows, self.be.dev, t, q8):
            return None
        return self.q8_input(x, int(t.shape[-1]))

    def _matmul(self, t, chunks, x, y, bias, q8: bool, resid=None) -> list[Dispatch]:
        """y = W·x (+ bias) (+ resid) by the kernel this batch takes for weight t."""
        if (mq := self._mmq(t, x, q8)) is not None:  # batches: int8 tiled GEMM
            return mq[0] + KMQ.mmq_dispatches(self.k, t, chunks, mq[1], y, bias, self.rows, resid=resid)
        if KG.use_gemm(self.rows, self.be.dev):  # batches: tiled GEMM
            return KG.gemm_dispatches(self.k, t, chunks, x, y, bias, self.rows, resid=resid)
        fuse = (int(t.shape[0]), *KM.gemv_needs(self.be.dev)) if KM.has_gemv(t.qtype, int(t.shape[-1])) else None
        pre, xq = self._gemv_q8(t, x, q8, fuse)
        return pre + KM.matmul_dispatches(self.k, t, chunks, x, y, bias, self.rows, resid=resid, xq=xq)

    def residual(self, op: MatMul | MoE, add: Add) -> list[Dispatch]:
        """A residual group: the matmul's kernel adds into x, or the MoE's combine does (its
        experts on the host: the two ops alone)."""
        if isinstance(op, MatMul):
            return self.matmul_residual(op, add)
        if op.layer in self.be.host_moe:
            return self.op(op) + self.op(add)
        return KMoE.moe_dispatches(self, op, add)

    def norm_residual(self, norm: RMSNorm, add: Add, *rest: Mul | RMSNorm) -> list[Dispatch]:
        """x = x + rmsnorm(o) (then * the Mul's scale and weight) in one rmsnorm_add dispatch; a
        norm_residual_norm group's next norm of x (rest[-1]) apart. Where the int8 GEMV reads that norm's
        output (or x itself) next, one rmsnorm_add_q8 dispatch writes it rounded too, the norm included."""
        be, w = self.be, self.be.widths
        mul = next((op for op in rest if isinstance(op, Mul)), None)
        norm2 = rest[-1] if rest and isinstance(rest[-1], RMSNorm) else None
        width = w[norm.src]
        o, resid = self.current(norm.src), self.current(add.dst)
        y = self.target(add.dst, add.dst)
        g = be.weights[norm.weight][0] if norm.weight else _ones(be, width)
        extra = {}
        if mul is not None:
            extra = dict(w=be.weights[mul.weight][0], w_width=math.prod(be.gf.tensor(mul.weight).shape),
                         scale=mul.scale)
        rounds = self._feeds_gemv_q8(norm2.dst if norm2 else add.dst, width)
        if not rounds:
            ds = [KS.rmsnorm_add_dispatch(self.k, o, g, resid, y, width, norm.eps, self.rows, **extra)]
            return ds + (self.op(norm2) if norm2 else [])
        if norm2:
            g2 = be.weights[norm2.weight][0] if norm2.weight else _ones(be, width)
            z = self.target(norm2.dst, norm2.src)
            extra["norm2"] = (g2, z, norm2.eps)
        d, xq = KQ.rmsnorm_add_q8_dispatch(self.k, o, g, resid, y, width, norm.eps, self.rows, **extra)
        self.q8 = (z if norm2 else y, width, xq)
        return [d]

    def matmul_residual(self, mm: MatMul, add: Add) -> list[Dispatch]:
        be = self.be
        x = self.current(mm.src)
        resid = self.current(add.dst)
        y = self.target(add.dst, add.dst)  # the other half of the pair: y never aliases resid
        bias = be.weights[mm.bias][0] if mm.bias else None
        return self._matmul(be.gf.tensor(mm.weight), be.weights[mm.weight], x, y, bias, mm.q8, resid=resid)

    def stacked(self, mms: list[MatMul], names: tuple) -> list[Dispatch]:
        """q|k|v as one stacked product, by the kernel this batch takes."""
        be = self.be
        x = self.current(mms[0].src)
        ys = [self.target(m.dst, m.src) for m in mms]
        tensors = [be.gf.tensor(n) for n in names]
        mixed = KM.is_mixed(tensors)
        mmq = [KMQ.use_mmq(self.rows, be.dev, t, m.q8) for m, t in zip(mms, tensors)]
        if mixed and all(mmq) and KMQ.mixed_tile(self.k, tensors, self.rows) is not None:
            # A batch over a mixed stack (Q4_K q, k and Q6_K v) on a tile copying f16 weight rows: one product,
            # each matrix dequantized by its own type's pass (kernels_mmq.mixed_tile).
            pre, xq = self.q8_input(x, int(tensors[0].shape[-1]))
            return pre + KMQ.stacked_dispatches(self.k, tensors, be.weights[names], xq, ys, be.stack_bias.get(names),
                                                self.rows)
        if mixed and any(mmq):
            # Elsewhere each matrix its own kernel, on a view of its rows.
            parts = KM.stack_parts(tensors, be.weights[names])
            return [d for m, t, part, y in zip(mms, tensors, parts, ys)
                    for d in self._matmul(t, part, x, y, be.weights[m.bias][0] if m.bias else None, m.q8)]
        if not mixed and (mq := self._mmq(tensors[0], x, mms[0].q8)) is not None:
            return mq[0] + KMQ.stacked_dispatches(self.k, tensors, be.weights[names], mq[1], ys,
                                                  be.stack_bias.get(names), self.rows)
        if KG.use_gemm(self.rows, self.be.dev):
            return KG.stacked_gemm_dispatches(self.k, tensors, be.weights[names], x, ys, be.stack_bias.get(names),
                                              self.rows)
        fuse = (sum(int(t.shape[0]) for t in tensors), *KM.gemv_needs(be.dev, split=True))
        pre, xq = self._gemv_q8(tensors[0], x, mms[0].q8, fuse)
        return pre + KM.stacked_dispatches(self.k, tensors, be.weights[names], x, ys, be.stack_bias.get(names),
                                           self.rows, xq=xq)

    def stacked_rope(self, mms: list[MatMul], names: tuple, rq: Rope, rk: Rope, st: StoreKV) -> list[Dispatch] | None:
        """A qkv_rope_store group: the stacked int8 GEMV rotating q, k and storing k, v too
        (kernels_qkv_rope), or None where it does not (the caller runs the stack and rope_kv)."""
        be, r = self.be, rq.rope
        a = be.plan.spec.layers[st.layer].attention
        tensors = [be.gf.tensor(n) for n in names]
        K = int(tensors[0].shape[-1])
        if (any(KMQ.use_mmq(self.rows, be.dev, t, m.q8) for m, t in zip(mms, tensors)) or KG.use_gemm(self.rows, be.dev)
                or not all(KM.has_gemv(t.qtype, K) for t in tensors)
                or not KQR.takes(be.dev, _style(r), rq.n_heads, rk.n_heads, a.head_dim, a.v_head_dim, r.n_rot)):
            return None  # the stack is no int8 GEMV here, or its rope is not the epilogue's
        x = self.current(mms[0].src)
        ys = [self.target(m.dst, m.src) for m in mms]
        factors = be.weights[r.freq_factors][0] if r.freq_factors else None
        rope = KQR.StackRope(be.k_cache[st.layer], be.v_cache[st.layer], be.kv.paging_of(st.layer), rq.n_heads,
                             rk.n_heads, a.head_dim, a.v_head_dim, r.n_rot, r.theta, r.freq_scale, factors)
        fuse = (sum(int(t.shape[0]) for t in tensors), *KM.gemv_needs(be.dev, split=True, rope=True))
        pre, xq = self._gemv_q8(tensors[0], x, mms[0].q8, fuse)
        return pre + KM.stacked_dispatches(self.k, tensors, be.weights[names], x, ys, be.stack_bias.get(names),
                                           self.rows, xq=xq, rope=rope)

    def gate_up(self, mg: MatMul, mu: MatMul, act: GatedAct) -> list[Dispatch] | None:
        be = self.be
        x = self.current(mg.src)
        tg, tu = be.gf.tensor(mg.weight), be.gf.tensor(mu.weight)
        chunks_g, chunks_u = be.weights[mg.weight], be.weights[mu.weight]
        if KMQ.use_mmq(self.rows, be.dev, tg, mg.q8, pair=True) and KM.can_fuse_gate_up(tg, tu, chunks_g, chunks_u):
            if KMQ.pairs_act(self.k, tg, chunks_g, self.rows, act.act):
                y = self.target(act.dst, mg.src)
                pre, xq = self.q8_input(x, int(tg.shape[-1]))
                return pre + KMQ.gate_up_dispatches(self.k, tg, tu, chunks_g, chunks_u, xq, y, act.act, self.rows)
            if not KMA.keeps_gemv(be.dev, self.rows):
                return None  # the tensor cores' pair takes no table GELU by default: gate, up, then gated_gelu_f16
            # a batched decode step's rows: the GEMV's pair below takes the table GELU
        # Batches: None, so gate and up run as two GEMMs and the activation as its own dispatch
        # (as do a pair of two types where the int8 GEMM takes either).
        mmq_either = KMQ.use_mmq(self.rows, be.dev, tg, mg.q8) or KMQ.use_mmq(self.rows, be.dev, tu, mu.q8)
        if KG.use_gemm(self.rows, self.be.dev) or not KM.can_pair(tg, tu, chunks_g, chunks_u) or mmq_either:
            return None  # checked before target() so a refusal leaves the buffer tracking untouched
        y = self.target(act.dst, mg.src)
        # The int8 GEMV of down reads y rounded next (self.ahead: the op after the group): the pair
        # writes that too, into the second scratch (it reads the first), and down needs no quantize.
        N = int(tg.shape[0])
        rounds = (_reads_q8(tg, mg.q8) and self._feeds_gemv_q8(act.dst, N, KM.GEMV_K)
                  and KM.pair_rounds(be.dev, N, chunks_g, self.rows))
        # the pair that rounds its output never takes its input norm (kernels_norm_in: it lost there)
        fuse = None if rounds else (N, *KM.gemv_needs(be.dev, pair=True, table=getattr(act.act, "value", act.act) == "gelu_f16"))
        pre, xq = self._gemv_q8(tg, x, mg.q8, fuse)
        yq = KQ.scratch_out(self.k, N, self.rows) if rounds and xq is not None else None
        ds = KM.gate_up_dispatches(self.k, tg, tu, chunks_g, chunks_u, x, y, act.act, self.rows, xq=xq, yq=yq)
        if yq is not None:
            self.q8 = (y, N, yq)
        return pre + ds

    def rope_store(self, rq: Rope, rk: Rope, st: StoreKV) -> list[Dispatch]:
        be, r = self.be, rq.rope
        a = be.plan.spec.layers[st.layer].attention
        factors = be.weights[r.freq_factors][0] if r.freq_factors else None
        return [KA.rope_kv_dispatch(self.k, self.current(rq.buf), self.current(rk.buf), self.current(st.v),
                                    be.k_cache[st.layer], be.v_cache[st.layer], be.kv.paging_of(st.layer), rq.n_heads,
                                    rk.n_heads, a.head_dim, a.v_head_dim, r.n_rot, r.theta, r.freq_scale, _style(r),
                                    self.rows, factors=factors)]

    def norm_rope_store(self, ops) -> list[Dispatch]:
        """A norm_rope_store group in one rope_kv dispatch (the norms fused); where a norm is not
        one per head of its buffer, the norms one by one and the rope_store dispatch (or, norms
        after the ropes, every op alone)."""
        norms, after, (rq, rk, st) = fusion.split_norm_rope_store(ops)
        be, r = self.be, rq.rope
        a = be.plan.spec.layers[st.layer].attention
        dims = {rq.buf: a.head_dim, rk.buf: a.head_dim, st.v: a.v_head_dim}
        if any(n.group != dims[n.dst] for n in norms):
            if after:
                return [d for op in ops for d in self.op(op)]
            return [d for op in norms for d in self.op(op)] + self.rope_store(rq, rk, st)
        w = {n.dst: be.weights[n.weight][0] if n.weight else _ones(be, n.group) for n in norms}
        hn = KA.HeadNorms(w.get(rq.buf), w.get(rk.buf), w.get(st.v), norms[0].eps, after)
        factors = be.weights[r.freq_factors][0] if r.freq_factors else None
        return [KA.rope_kv_dispatch(self.k, self.current(rq.buf), self.current(rk.buf), self.current(st.v),
                                    be.k_cache[st.layer], be.v_cache[st.layer], be.kv.paging_of(st.layer), rq.n_heads,
                                    rk.n_heads, a.head_dim, a.v_head_dim, r.n_rot, r.theta, r.freq_scale, _style(r),
                                    self.rows, factors=factors, norms=hn)]

    def norm_twins(self, a: RMSNorm, b: RMSNorm, mul: Mul | None = None) -> list[Dispatch] | None:
        """A norm_twins group in one rmsnorm_q8 dispatch (wgsl/rmsnorm_twin_on.wgsl): a's output and its
        rounded copy for the GEMV that reads it (a MoE's experts, past its router), b's with the Mul;
        None where a's output feeds no such GEMV (the ops then run one by one)."""
        be = self.be
        width = be.widths[a.src]
        if not self._feeds_gemv_q8(a.dst, width):
            return None
        x = self.current(a.src)
        ya, yb = self.target(a.dst, a.src), self.target(b.dst, b.src)
        ga = be.weights[a.weight][0] if a.weight else _ones(be, width)
        gb = be.weights[b.weight][0] if b.weight else _ones(be, width)
        if mul is not None:
            w2, scale, w2_width = be.weights[mul.weight][0], mul.scale, int(np.prod(be.gf.tensor(mul.weight).shape))
        else:
            w2, scale, w2_width = _ones(be, 1), 1.0, 1
        d, xq = KQ.rmsnorm_q8_dispatch(self.k, x, ga, ya, width, a.eps, self.rows, twin=(gb, yb, scale, w2, w2_width))
        self.q8 = (ya, width, xq)
        return [d]

    def moe_post_norms(self, moe: MoE, nm: RMSNorm, nf: RMSNorm, add: Add) -> list[Dispatch] | None:
        """A moe_post_norms group: the MoE, its combine doing both norms and the add
        (kernels_moe.PostNorms); None with its experts on the host (the ops one by one)."""
        be = self.be
        D = be.widths[moe.dst]
        if moe.layer in be.host_moe or D % 4:
            return None
        gm = be.weights[nm.weight][0] if nm.weight else _ones(be, D)
        gf = be.weights[nf.weight][0] if nf.weight else _ones(be, D)
        return KMoE.moe_dispatches(self, moe, post=KMoE.PostNorms(gm, nm.eps, nf.dst, gf, nf.eps))

    def moe_residual_norm(self, moe: MoE, add: Add, norm: RMSNorm) -> list[Dispatch] | None:
        """A moe_residual_norm group: the MoE, its combine adding into x and doing the next norm of x too,
        written rounded for the int8 GEMV that reads it (kernels_moe.NextNorm); None where that GEMV does not
        read it, the experts are on the host, the batch is a prompt's (each of a row's workgroups would read
        every pair's row again for its sum: the dispatch saved is worth that in decode steps) or the tuning says
        not (INFR_MOE_COMBINE_NORM=0): the residual group, then the norm alone. Set ahead to the ops after
        the norm first."""
        be = self.be
        D = be.widths[add.dst]
        if (not TU.current().moe_combine_norm or moe.layer in be.host_moe or KMQ.use_mmq(self.rows, be.dev)
                or not self._feeds_gemv_q8(norm.dst, D)):
            return None
        g = be.weights[norm.weight][0] if norm.weight else _ones(be, D)
        return KMoE.moe_dispatches(self, moe, add, norm=KMoE.NextNorm(g, norm.eps, norm.dst, norm.src))

    def _feeds_gemv_q8(self, name: str, width: int, unit: int = 256) -> bool:
        """Whether the next op multiplies value `name` (width values a token) in
        the Q4_K GEMV: its producer then writes it rounded too (width % unit == 0: the norms' kernels
        take whole 256-value blocks). A MoE counts past its router (an f32 matmul of the same rows,
        or of gemma4's router input): its experts read them rounded."""
        nxt = self.ahead
        if (isinstance(nxt, MatMul) and not nxt.q8 and isinstance(self.ahead2, MoE) and nxt.dst == self.ahead2.logits
                and not KM.has_gemv(self.be.gf.tensor(nxt.weight).qtype, width)):
            # the router (reading name, or gemma4's other norm of the stream), on no int8 GEMV of its
            # own: it leaves the q8 scratch, so the experts read the rounded rows written here
            nxt = self.ahead2
        if width % unit or (KG.use_gemm(self.rows, self.be.dev) and not KMQ.use_mmq(self.rows, self.be.dev)):
            return False
        if isinstance(nxt, MoE):
            return nxt.src == name and KMoE.reads_q8(self.be, nxt)
        return isinstance(nxt, MatMul) and nxt.src == name and _reads_q8(self.be.gf.tensor(nxt.weight), nxt.q8)

    def op(self, op) -> list[Dispatch]:
        be, T = self.be, self.rows
        w = be.widths
        if isinstance(op, MatMul):
            x = self.current(op.src)
            bias = be.weights[op.bias][0] if op.bias else None
            t = be.gf.tensor(op.weight)
            y = self.target(op.dst, op.src)
            return self._matmul(t, be.weights[op.weight], x, y, bias, op.q8)
        if isinstance(op, RMSNorm):
            x = self.current(op.src)
            y = self.target(op.dst, op.src)
            g = be.weights[op.weight][0] if op.weight else _ones(be, op.group or w[op.src])
            if op.group in (None, w[op.src]) and self._feeds_gemv_q8(op.dst, w[op.src]):  # also rounded
                if self.norm_in(op, x, g, y):
                    return []  # the GEMV reading y norms x itself
                d, xq = KQ.rmsnorm_q8_dispatch(self.k, x, g, y, w[op.src], op.eps, T)
                self.q8 = (y, w[op.src], xq)
                return [d]
            return [KS.rmsnorm_dispatch(self.k, x, g, y, w[op.src], op.group, op.eps, T)]
        if isinstance(op, Rope):
            r = op.rope
            factors = be.weights[r.freq_factors][0] if r.freq_factors else None
            x = self.current(op.buf)
            return [KS.rope_dispatch(self.k, x, be.paging, op.n_heads, op.head_dim, r.n_rot, r.theta,
                                     r.freq_scale, _style(r), T, factors=factors)]
        if isinstance(op, StoreKV):
            a = be.plan.spec.layers[op.layer].attention
            return [KS.kv_store_dispatch(self.k, self.current(op.k), self.current(op.v), be.k_cache[op.layer],
                                         be.v_cache[op.layer], be.kv.paging_of(op.layer), a.n_kv_heads, a.head_dim,
                                         a.v_head_dim, T)]
        if isinstance(op, Attention):
            a = op.spec
            q = self.current(op.q)
            out = self.target(op.dst, op.q)
            layers = [la.attention for la in be.plan.spec.layers]
            # Scores are kept by position: the scratch spans a sequence's longest, blocks_per_seq * BS.
            scratch = lambda: KA.scratch_for(be, self.k, T, be.blocks_per_seq * be.block_size, max(x.n_heads for x in layers),
                                             max(x.v_head_dim for x in layers))
            K = a.n_heads * a.v_head_dim
            fuse = KS.can_round_output(a.n_heads, a.v_head_dim) and self._feeds_gemv_q8(op.dst, K)
            xq = KQ.scratch(self.k, K, T) if fuse else None
            ds = KA.attention_dispatches(self.k, q, be.k_cache[op.layer], be.v_cache[op.layer], out,
                                         be.kv.paging_of(op.layer), scratch, a.n_heads, a.n_kv_heads, a.head_dim,
                                         a.v_head_dim, a.scale, a.sliding_window, a.softcap, T, n_ctx=be.n_ctx,
                                         xq=xq, span=self.span, decode=self.decode, chunk=a.chunk)
            if xq is not None:
                self.q8 = (out, K, xq)  # the o projection reads the rounded copy
            return ds
        if isinstance(op, GatedAct):
            g, u = self.current(op.gate), self.current(op.up)
            y = self.target(op.dst, op.gate, op.up)
            return [KS.gated_dispatch(self.k, g, u, y, T * w[op.gate], op.act)]
        if isinstance(op, Add):
            a, b = self.current(op.a), self.current(op.b)
            y = self.target(op.dst, op.a, op.b)
            return [KS.add_dispatch(self.k, a, b, y, T * w[op.a])]
        if isinstance(op, Embed):
            t = be.gf.tensor(op.table)
            y = self.target(op.dst)
            return KE.embed_dispatches(self.k, t, be.weights[op.table], be.ids, y, op.scale, T)
        if isinstance(op, MoE):
            if op.layer in be.host_moe:  # cpu_moe: the experts run on the host (infr/gpu/host_moe.py)
                return [HM.HostMoE(self, op)]
            return KMoE.moe_dispatches(self, op)
        if isinstance(op, SigmoidGate):
            return KMoE.sigmoid_gate(self, op)
        if isinstance(op, QueryTemp):
            n_pos = be.blocks_per_seq * be.block_size  # every position a row can hold
            tau = be.__dict__.setdefault("_query_temp", {})
            if op.temp not in tau:  # one table per temperature, made with the decode graph at load
                tau[op.temp] = KS.query_temp_table(self.k, op.temp, n_pos)
            return [KS.query_temp_dispatch(self.k, self.current(op.buf), tau[op.temp], be.rows, w[op.buf], n_pos, T)]
        if isinstance(op, Softcap):
            return [KS.softcap_dispatch(self.k, self.current(op.buf), T * w[op.buf], op.cap)]
        if isinstance(op, HeadSlice):
            return KDN.lower_head_slice(self, op)
        if isinstance(op, SigmoidMul):
            return KDN.lower_sigmoid_mul(self, op)
        if isinstance(op, DeltaNet):
            return KDN.deltanet_dispatches(self, op)
        if isinstance(op, Mul):
            return KG4.lower_mul(self, op)
        if isinstance(op, PerLayerInputs):
            return KG4.lower_per_layer_inputs(self, op)
        if isinstance(op, PLEGate):
            return KG4.lower_ple_gate(self, op)
        raise NotImplementedError(type(op).__name__)


def _style(r: RopeSpec) -> str:
    """The rope kernels' style for r: IMROPE turns every pair of a text token by its one position
    (sections [p, p, p, 0]), which is NEOX over the first n_rot dims."""
    return "neox" if r.style is RopeStyle.IMROPE else r.style.value


def _ones(be: GPUBackend, n: int):
    """The weight of a weightless norm over groups of n values (llama4's q/k norm), one per width."""
    cache = be.__dict__.setdefault("_ones", {})
    if n not in cache:
        cache[n] = KS.ones(be.kern, n)
    return cache[n]


def _reads_q8(t, q8: bool) -> bool:
    """Whether a matmul marked q8 (MatMul.q8) over weight t reads the q8 scratch: K whole 64-value
    groups of its layout (kernels_q8.words; other K round inside the f32 GEMM, as KQ.takes_q8)."""
    return bool(q8) and int(t.shape[-1]) % 64 == 0


def find_stacks(plan: Plan, gf: GGUFFile, max_binding: int) -> dict[tuple, tuple]:
    """The plan's qkv groups that one buffer can hold: weight-name tuple -> bias names. A plan
    with ops that have no GPU kernels yet (Plan.cpu_only) is refused here, when the backend is made."""
    if plan.cpu_only:
        from infr.errors import UnsupportedError

        what = ", ".join(plan.cpu_only)
        raise UnsupportedError(f"{plan.spec.arch}: {what} {'has' if len(plan.cpu_only) == 1 else 'have'} "
                               f"no GPU kernels yet (run it with --backend cpu)")
    out = {}
    for g in plan.groups:
        mms = g.stack()
        if mms and KM.can_stack([gf.tensor(m.weight) for m in mms], max_binding):
            out[tuple(m.weight for m in mms)] = tuple(m.bias for m in mms)
    return out

"""The mixture-of-experts FFN on the GPU (the MoE op; CPU reference infr/cpu/moe.py).

Per step, with A = T * n_used (token, slot) pairs, a = t * n_used + s:
1. the router's logits (an ordinary MatMul before the op) -> wgsl/moe_route.wgsl: each row's
   chosen experts and weights into `ids` / `wts` buffers; nothing comes back to the host;
2. llama4 (weight before the expert): each pair's input h[t] * wts[a] (moe_combine scale_rows);
3. gate and up of every pair: the dense GEMV kernels (gemv.wgsl int8, gemv_float.wgsl F32 / F16 /
   BF16, matmul.wgsl the rest) with expert_on.wgsl, whose rows start at the pair's expert (read
   from `ids` on the GPU), so only the chosen experts' blocks are read; the fused gate||up pair
   where both banks allow it;
4. down of every pair, the same way, into [A, n_embd];
5. the weighted sum in selection order (moe_combine combine) into the op's output.

Small batches run the same kernels, a workgroup per pair (each reads its own expert's rows).
Batches that the dense matmuls run as int8 GEMMs (kernels_mmq.use_mmq) group the pairs by expert
on the GPU (wgsl/moe_group.wgsl: a count and a scatter) and run one tiled GEMM per bank over all
groups (gemm_mmq.wgsl with mmq_expert_on.wgsl; on tensor-core devices gemm_mma.wgsl with the same
expert tiles, kernels_mma.expert_tile_for), llama.cpp's MUL_MAT_ID; each output row is still
computed alone, so a row's result does not depend on which rows share its expert. Banks are uploaded by
expert ranges that each fit one storage binding (upload_bank); a kernel runs once per range,
its pairs routed elsewhere leaving at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infr.errors import UnsupportedError
from infr.gpu import kernels_gemv_float as KGF
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.models.spec import Activation, Gating, MoESpec
from infr.ops import Add, MoE, SigmoidGate

ROUTE_MAX_E, ROUTE_MAX_K = 1024, 64  # moe_route.wgsl's MAX_E and its `picked` array
COMBINE_WG = 256  # moe_combine.wgsl's


def expert_bytes(t) -> int:
    """Bytes of one expert's [out, in] slice of bank t ([n_expert, out, in])."""
    return int(t.shape[1]) * KM.row_bytes(t.qtype, int(t.shape[-1]))


def upload_bank(dev, t, max_binding: int | None = None, label: str | None = None) -> list[tuple]:
    """An expert bank's raw GGUF bytes as expert ranges: [(buffer, e0, count)], each range
    whole experts within one storage binding (with the weights' tail)."""
    KM.as_qtype(t.qtype)
    n_exp = int(t.shape[0])
    eb = expert_bytes(t)
    raw = np.ascontiguousarray(t.raw).view(np.uint8).reshape(-1)
    if raw.size != n_exp * eb:
        raise UnsupportedError(f"{t.name}: {raw.size} bytes, expected {n_exp} experts of {eb}")
    limit = dev.max_binding if max_binding is None else int(max_binding)
    per = (limit - KM.WEIGHT_TAIL) // 16 * 16 // eb
    if per < 1:
        raise UnsupportedError(f"{t.name}: one expert ({eb} bytes) exceeds the storage binding limit {limit}")
    name = label or t.name
    return [(storage(dev, raw[e0 * eb : (e0 + n) * eb], label=f"{name}[e{e0}:{e0 + n}]", tail=KM.WEIGHT_TAIL), e0, n)
            for e0 in range(0, n_exp, per) for n in (min(per, n_exp - e0),)]


def _experts(kernels: Kernels, e0: int, count: int, stride: int, stride2: int, base: int, base2: int, x_div: int):
    data = KS._pack([("e0", "u32", e0), ("count", "u32", count), ("stride", "u32", stride),
                     ("stride2", "u32", stride2), ("base", "u32", base), ("base2", "u32", base2),
                     ("x_div", "u32", x_div), ("pad", "u32", 0)])
    return storage(kernels.dev, np.frombuffer(data, np.uint8), label="experts.params", uniform=True)


def route_dispatch(kernels: Kernels, logits, ids, wts, m: MoESpec, T: int) -> Dispatch:
    """ids / wts [T * n_used] from the router's logits [T, n_expert] (wgsl/moe_route.wgsl)."""
    if m.gating not in (Gating.SOFTMAX, Gating.SIGMOID):
        raise UnsupportedError(f"MoE gating {m.gating} has no GPU kernel")
    if m.n_expert > ROUTE_MAX_E or m.n_used > ROUTE_MAX_K:
        raise UnsupportedError(f"MoE router: {m.n_expert} experts, {m.n_used} used; the GPU kernel takes at most "
                               f"{ROUTE_MAX_E} and {ROUTE_MAX_K}")
    if T > 65535:  # one workgroup per row, along x
        raise UnsupportedError(f"MoE router: {T} rows in one step; the GPU kernel takes at most 65535")
    scaled = m.weight_scale not in (None, 0.0, 1.0)
    flags = ((m.gating is Gating.SIGMOID) | m.select_on_logits << 1 | m.norm_weights << 2 | scaled << 3)
    data = KS._pack([("E", "u32", m.n_expert), ("K", "u32", m.n_used), ("T", "u32", T), ("flags", "u32", flags),
                     ("scale", "f32", m.weight_scale if scaled else 1.0)])
    pipe = kernels.pipeline("moe_route", "main")
    p = KS._params(kernels, data, None, "moe_route")
    return Dispatch(pipe, kernels.bind(pipe, [p, logits, ids, wts]), (T, 1, 1),
                    f"moe_route {m.n_expert}x{m.n_used}")


def _rows_dispatch(kernels: Kernels, entry: str, src, wts, dst, D: int, K: int, rows: int, weighted: bool,
                  resid=None, scales=None) -> Dispatch:
    pipe = kernels.pipeline("moe_combine", entry)
    p = KS._params(kernels, KS._pack([("D", "u32", D), ("K", "u32", K), ("T", "u32", rows),
                                      ("weighted", "u32", int(weighted)), ("resid", "u32", int(resid is not None)),
                                      ("scaled", "u32", int(scales is not None))]), None, f"moe_{entry}")
    res = [p, src, wts, dst]
    if entry == "combine":
        dummy = KS._dummy(kernels)
        sc, ids = scales if scales is not None else (dummy, dummy)
        res += [resid if resid is not None else dummy, sc, ids]
    return Dispatch(pipe, kernels.bind(pipe, res), (-(-D // COMBINE_WG), rows, 1), f"moe_{entry} {D}")


def combine_dispatch(kernels: Kernels, ys, wts, y, D: int, K: int, T: int, weighted: bool, resid=None,
                     scales=None) -> Dispatch:
    """y[t] = sum_s ys[t * K + s] (* scales[ids[t * K + s]]) (* wts[t * K + s]), s in selection order
    (+ resid[t]: the residual add). scales: (per-expert scales, ids) or None."""
    return _rows_dispatch(kernels, "combine", ys, wts, y, D, K, T, weighted, resid, scales)


@dataclass(frozen=True)
class NextNorm:
    """The RMSNorm of the new stream after a MoE's residual add (fusion.py's moe_residual_norm), done by the
    combine: its weight and eps, and the plan's names of its output and input; the combine also writes the
    output rounded (kernels_q8's layout) for the int8 GEMV that reads it next."""

    g: object
    eps: float
    dst: str
    src: str


def combine_q8_dispatch(kernels: Kernels, ys, wts, y, resid, z, D: int, K: int, T: int, weighted: bool,
                        norm: NextNorm, scales=None) -> tuple[Dispatch, object]:
    """y[t] = resid[t] + combine(ys)[t], then z[t] = rmsnorm(y[t]) * g, written and rounded
    (wgsl/moe_combine_q8.wgsl): combine_dispatch then rmsnorm_q8_dispatch's floats in one dispatch, and
    the rounded rows' buffer. D % 256 == 0."""
    if D % 256:
        raise ValueError(f"moe_combine_q8 needs D % 256 == 0, got {D}")
    xq = KQ._buffer(kernels, "q8", 4 * T * KQ.words(D))
    pipe = kernels.pipeline("moe_combine_q8", "main")
    p = KS._params(kernels, KS._pack([("D", "u32", D), ("K", "u32", K), ("T", "u32", T),
                                      ("weighted", "u32", int(weighted)), ("scaled", "u32", int(scales is not None)),
                                      ("eps", "f32", norm.eps), ("q_stride", "u32", KQ.words(D))]), None,
                   "moe_combine_q8")
    dummy = KS._dummy(kernels)
    sc, ids = scales if scales is not None else (dummy, dummy)
    res = [p, ys, wts, y, resid, sc, ids, norm.g, z, xq]
    return Dispatch(pipe, kernels.bind(pipe, res), (-(-D // 1024), T, 1), f"moe_combine_q8 {D}"), xq


@dataclass(frozen=True)
class PostNorms:
    """gemma4's end of a MoE block done by its combine (fusion.py's moe_post_norms): the sum's RMSNorm
    (weight gm), the dense FFN's output f normed (gf), and f + the normed sum into f."""

    gm: object
    eps_m: float
    f: str  # the plan's name of the dense FFN's output
    gf: object
    eps_f: float


def combine_norms_dispatch(kernels: Kernels, ys, wts, y, f, D: int, K: int, T: int, weighted: bool, post: PostNorms,
                           scales=None) -> Dispatch:
    """y[t] = rmsnorm(f[t]) * gf + rmsnorm(combine(ys)[t]) * gm (wgsl/moe_combine_norms.wgsl); D % 4 == 0."""
    if D % 4:
        raise ValueError(f"moe_combine_norms needs rows of whole vec4, got {D}")
    pipe = kernels.pipeline("moe_combine_norms", "main")
    p = KS._params(kernels, KS._pack([("D", "u32", D), ("K", "u32", K), ("T", "u32", T),
                                      ("weighted", "u32", int(weighted)), ("scaled", "u32", int(scales is not None)),
                                      ("eps_m", "f32", post.eps_m), ("eps_f", "f32", post.eps_f)]), None,
                   "moe_combine_norms")
    dummy = KS._dummy(kernels)
    sc, ids = scales if scales is not None else (dummy, dummy)
    return Dispatch(pipe, kernels.bind(pipe, [p, ys, wts, y, f, sc, ids, post.gm, post.gf]),
                    (-(-D // 1024), T, 1), f"moe_combine_norms {D}")


def _combine(lower, op: MoE, ys, wts, ids, add: Add | None, post: PostNorms | None,
             norm: NextNorm | None = None) -> Dispatch:
    """The experts' sum: into the MoE's output (with the residual add: into x; with `norm` the next norm
    of x too, rounded), or with `post` the block's post-norms and the add into f in the same dispatch."""
    m, T, D = op.spec, lower.rows, lower.be.widths[op.src]
    # gemma4: each pair's output times its expert's scale, before the router's weight
    scales = (lower.be.weights[op.scales][0], ids) if op.scales else None
    if post is not None:
        f = lower.current(post.f)
        y = lower.target(post.f, post.f)
        return combine_norms_dispatch(lower.k, ys, wts, y, f, D, m.n_used, T, not m.weight_before, post, scales)
    y, resid = _output(lower, op, add)
    if norm is not None and resid is not None:
        z = lower.target(norm.dst, norm.src)  # after the add's target: z aliases neither x
        d, xq = combine_q8_dispatch(lower.k, ys, wts, y, resid, z, D, m.n_used, T, not m.weight_before, norm, scales)
        lower.q8 = (z, D, xq)  # the GEMV after it reads the rounded rows
        return d
    return combine_dispatch(lower.k, ys, wts, y, D, m.n_used, T, weighted=not m.weight_before, resid=resid,
                            scales=scales)


def _output(lower, op: MoE, add: Add | None):
    """(y, resid): the buffer the combine writes, and the residual stream it adds (None: no add).
    With the plan's residual add fused (fusion.is_residual), the sum goes straight into x."""
    if add is None:
        return lower.target(op.dst, op.src), None
    resid = lower.current(add.dst)
    return lower.target(add.dst, add.dst), resid


def scale_rows_dispatch(kernels: Kernels, x, wts, xs, D: int, K: int, T: int) -> Dispatch:
    """xs[a] = x[a // K] * wts[a] for the T * K pairs (the weight before the expert)."""
    return _rows_dispatch(kernels, "scale_rows", x, wts, xs, D, K, T * K, True)


def sigmoid_gate_dispatch(kernels: Kernels, buf, src, weight, y, D: int, T: int) -> Dispatch:
    """y[t] = buf[t] * sigmoid(src[t] . weight) (wgsl/moe_gate.wgsl)."""
    pipe = kernels.pipeline("moe_gate", "main")
    p = KS._params(kernels, KS._pack([("D", "u32", D), ("T", "u32", T)]), None, "moe_gate")
    return Dispatch(pipe, kernels.bind(pipe, [p, buf, src, weight, y]), (T, 1, 1), f"moe_gate {D}")


def f32_pipeline(kernels: Kernels, qtype, N: int = 1, K: int = 0, A: int = 1):
    """The kernel over an expert bank of a type without an int8 GEMV, for N x K experts and A pairs:
    the float GEMV (F32, F16, BF16), else matmul.wgsl; its rows per workgroup."""
    q = KM.as_qtype(qtype)
    if q in KGF.FLOAT_GEMV:
        pipe, rows_wg, _ = KGF.float_gemv_pipeline(kernels, q, N, K, A, expert=True)
        return pipe, rows_wg
    rows_wg = KM.rows_per_workgroup(q)
    return kernels.pipeline("matmul", "main", QTYPE=KM.wgsl_name(q), WG=KM.MATMUL_WG, ROWS=rows_wg,
                            EXPERT=KM.expert_include(True)), rows_wg


def expert_matmul(kernels: Kernels, qtype, K: int, N: int, chunks, x, y, A: int, ids, x_div: int = 1,
                  stride: int | None = None, base: int = 0) -> list[Dispatch]:
    """y[a] = W_{ids[a]} @ x[a // x_div] for the A pairs, W_e the N x K rows of expert e of a bank
    (upload_bank's `chunks`; an expert's rows at base + e * stride bytes, stride default N rows).
    Types with an int8 GEMV take x already rounded (kernels_q8: a buffer of words(K) words per
    row); the others x in f32 (matmul.wgsl)."""
    q = KM.as_qtype(qtype)
    rb = KM.row_bytes(q, K)
    stride = N * rb if stride is None else stride
    none = KM._no_bias(kernels)
    if KM.has_gemv(q, K):
        pipe, rows_wg, _ = KM.gemv_pipeline(kernels, q, expert=True)
        x_stride, label = KQ.words(K) // 4, f"gemv_{KM.wgsl_name(q)}_expert"
    elif q in KM.GEMV_FAMILY:
        raise UnsupportedError(f"{q.name} expert banks need rows of whole 64-value groups, not {K}")
    else:
        pipe, rows_wg = f32_pipeline(kernels, q, N, K, A)
        kind = "gemv" if q in KGF.FLOAT_GEMV else "matmul"
        x_stride, label = K, f"{kind}_{KM.wgsl_name(q)}_expert"
    p = storage(kernels.dev, KM.params_matmul(K, N, 0, rb, x_stride, N, False, A), label="expert.params", uniform=True)
    out = []
    for buf, e0, n in chunks:
        ep = _experts(kernels, e0, n, stride, stride, base, base, x_div)
        res = [p, buf, x, y, none, none, None, None, ep, ids]  # 6, 7: the pair's and split's, unused
        out.append(Dispatch(pipe, kernels.bind(pipe, res), (-(-N // rows_wg), A, 1), f"{label} {N}x{K}", N * rb))
    return out


def expert_pair(kernels: Kernels, qg, qu, K: int, N: int, chunks_g, chunks_u, xq, y, act, A: int, ids,
                x_div: int = 1, fused: bool = False, yq=None) -> list[Dispatch]:
    """y[a] = act(G_e @ x) * (U_e @ x), e = ids[a], x = xq[a // x_div] rounded: the GEMV's gate||up
    pair over two banks of one expert chunking, or over one fused gate_up bank (`fused`: each
    expert's N gate rows, then its N up rows). `yq` (where KM.pair_rounds): y rounded too, as
    quantize_q8 writes it (the down bank's GEMV input)."""
    qg, qu = KM.as_qtype(qg), KM.as_qtype(qu)
    rb, rb2 = KM.row_bytes(qg, K), KM.row_bytes(qu, K)
    pipe, rows_wg, _ = KM.gemv_pipeline(kernels, (qg, qu), pair_act=getattr(act, "value", act), expert=True,
                                        q8_out=yq is not None)
    p = storage(kernels.dev, KM.params_matmul(K, N, 0, rb, KQ.words(K) // 4, N, False, A, row_bytes2=rb2),
                label="expert_pair.params", uniform=True)
    stride, stride2, base2 = (2 * N * rb, 2 * N * rb, N * rb) if fused else (N * rb, N * rb2, 0)
    none = KM._no_bias(kernels)
    out = []
    for (bg, e0, n), (bu, _, _) in zip(chunks_g, chunks_u):
        ep = _experts(kernels, e0, n, stride, stride2, 0, base2, x_div)
        bind = kernels.bind(pipe, KM.pair_resources(kernels, [p, bg, xq, y, none, none, bu, yq, ep, ids], act))
        label = f"gemv_{KM.wgsl_name(qg)}_expert_gate_up{'_q8' if yq is not None else ''} {N}x{K}"
        out.append(Dispatch(pipe, bind, (-(-N // rows_wg), A, 1), label, N * (rb + rb2)))
    return out


# --- prompt batches: pairs grouped by expert, one int8 tiled GEMM over every group

def group_dispatch(kernels: Kernels, ids, g: "Groups", E: int, A: int) -> Dispatch:
    """The pairs' order by expert and the tile list (wgsl/moe_group.wgsl) into g's buffers."""
    pipe = kernels.pipeline("moe_group", "main")
    p = KS._params(kernels, KS._pack([("E", "u32", E), ("A", "u32", A), ("BT", "u32", g.bt),
                                      ("max_tiles", "u32", g.max_tiles)]), None, "moe_group")
    return Dispatch(pipe, kernels.bind(pipe, [p, ids, g.order, g.tiles]), (1, 1, 1), f"moe_group {E}")


class Groups:
    """Buffers of one grouping (order per pair, tiles of at most bt pairs)."""

    def __init__(self, scratch, E: int, A: int, bt: int):
        self.bt, self.max_tiles = bt, -(-A // bt) + E
        self.order = scratch(f"order{bt}", 4 * A)
        self.tiles = scratch(f"tiles{bt}", 16 * self.max_tiles)


def grouped_tile(kernels: Kernels, q, N: int, A: int, pair: bool = False,
                 E: int | None = None) -> KMQ.MmqTile | KMA.MmaTile:
    """The grouped product's tile: the tensor cores' where the device has them and the tuning takes
    expert products there (kernels_mma.expert_tile_for), their token tile padding an expert's share
    of the A pairs (A / E: a tile holds one expert's) least; else the int8 GEMM's (MmqTuning.expert_tile_for)."""
    mma = KMA.expert_tile_for(kernels.dev, N, -(-A // (E or 1)), KMQ.READERS[KM.as_qtype(q)], pair,
                              qtype=KM.wgsl_name(q))
    if mma is not None:
        return mma
    return KMQ.device_tuning(kernels.dev).expert_tile_for(kernels.dev, q, N, A, E or 1, pair)


def grouped_matmul(kernels: Kernels, qtype, K: int, N: int, chunks, xq, y, A: int, g: Groups, tile,
                   x_div: int = 1, act=None, chunks2=None, fused: bool = False, half: int | None = None) -> list[Dispatch]:
    """y[a] = W_e @ x[a // x_div] for the pairs a of every tile of expert e (g, by group_dispatch),
    x rounded in xq; with `act`, the gate||up pair act(G_e x) * (U_e x) over chunks and chunks2
    (or one fused gate_up bank); with `half` (0 gate, 1 up) and no act, that half of a fused bank
    alone. One dispatch per expert range, ceil(N / rows) x max_tiles workgroups, the tiles past the
    last leaving at once."""
    q = KM.as_qtype(qtype)
    rb = KM.row_bytes(q, K)
    pair = act is not None
    pipe, rows_wg, bt = KMQ.mmq_pipeline(kernels, q, tile, pair_act=getattr(act, "value", act), expert=True, K=K)
    assert bt == g.bt, (bt, g.bt)
    p = storage(kernels.dev, KM.params_matmul(K, N, 0, rb, KQ.words(K) // 4, N, False, A), label="mmq_expert.params",
                uniform=True)
    stride, base2 = (2 * N * rb, N * rb) if fused or half is not None else (N * rb, 0)
    base = 0 if half is None else half * N * rb
    none = KM._no_bias(kernels)
    out = []
    for i, (buf, e0, n) in enumerate(chunks):
        w2 = (buf if fused else chunks2[i][0]) if pair else None
        ep = _experts(kernels, e0, n, stride, stride, base, base2, x_div)
        res = [p, buf, xq, y, none, none, w2, None, ep, g.order, g.tiles]
        bind = kernels.bind(pipe, KM.pair_resources(kernels, res, act) if pair else res)
        groups = (-(-N // rows_wg), g.max_tiles, 1)
        label = f"mmq_{KM.wgsl_name(q)}_expert{'_gate_up' if pair else ''} {N}x{K}"
        out.append(Dispatch(pipe, bind, groups, label, N * rb * (2 if pair else 1)))
    return out


def _grouped(kernels: Kernels, T: int, op: MoE, tensors, chunks) -> bool:
    """Whether this batch runs the experts as grouped GEMMs: a batch the dense matmuls would take
    the int8 GEMM for, banks the kernel reads (one gate/up type), the gate||up pair possible."""
    if op.q8 is None or not all(op.q8) or not all(KMQ.applies(t) for t in tensors):
        return False
    if not KMQ.use_mmq(T, kernels.dev):
        return False
    if op.spec.fused_gate_up:
        return True
    return KM.as_qtype(tensors[0].qtype) == KM.as_qtype(tensors[1].qtype) and _same_ranges(chunks[0], chunks[1])


def _table_act(m: MoESpec) -> bool:
    """gemma4's table GELU (numerics.gelu_f16_table), which the pair kernels bind as one more buffer."""
    return m.activation is Activation.GELU_F16


# The grouped gate||up pair with the table GELU reads w, xq, y, bias, resid, w2, order, tiles and
# the table: a device allowing fewer storage buffers a stage (WebGPU's default is 8) runs gate and
# up as two grouped products and gated_gelu_f16.
TABLE_PAIR_BUFFERS = 9


def _pair_tile(kernels: Kernels, m: MoESpec, q, H: int, A: int, E: int):
    """The grouped gate||up product's tile, or None where gate and up run apart: the table GELU on a
    device short of storage bindings. The table GELU's pair takes the int8 GEMM's tile where the tensor
    cores' would be chosen (their table GELU, INFR_MMA_TABLE_PAIR, is dense only): the pair stages the
    tokens' rows once for both halves and needs no gated_gelu_f16 pass (Gemma 4 26B-A4B: 1.270 against
    2.125 ms apart, perf/README.md stop 31)."""
    if _table_act(m):
        limit = int(kernels.dev.limits.get("max-storage-buffers-per-shader-stage", 8))
        if limit < TABLE_PAIR_BUFFERS:
            return None
    tile = grouped_tile(kernels, q, H, A, pair=True, E=E)
    if _table_act(m) and isinstance(tile, KMA.MmaTile):
        return KMQ.device_tuning(kernels.dev).expert_tile_for(kernels.dev, q, H, A, E, True)
    return tile


def _same_ranges(a, b) -> bool:
    return [(e0, n) for _, e0, n in a] == [(e0, n) for _, e0, n in b]


class Scratch:
    """The MoE kernels' intermediate buffers, one of each kind per backend, grown when a larger
    batch needs more (graphs built for smaller ones keep the buffers they bound)."""

    def __init__(self, dev):
        self.dev, self.bufs = dev, {}

    def __call__(self, kind: str, nbytes: int):
        buf = self.bufs.get(kind)
        if buf is None or buf.size < nbytes:
            buf = self.bufs[kind] = storage(self.dev, max(nbytes, 256), label=f"moe_{kind}")
        return buf


def reads_q8(be, op: MoE) -> bool:
    """Whether moe_dispatches reads the op's input rounded to 8 bits (lower.q8_input): experts on the
    GPU whose gate/up banks take the int8 GEMV, fed the rows themselves (not llama4's scaled copies)."""
    if op.layer in be.host_moe or op.spec.weight_before:
        return False
    n_in = be.widths[op.src]
    return any(KM.has_gemv(be.gf.tensor(b).qtype, n_in) for b in op.banks[:-1])


def moe_dispatches(lower, op: MoE, add: Add | None = None, post: PostNorms | None = None,
                   norm: NextNorm | None = None) -> list[Dispatch]:
    """The MoE op for the lowering's batch of T rows (module docstring); with `add`, the plan's
    residual add after it too (x += the MoE's output, in the combine), and with `norm` the next norm of x
    (moe_combine_q8); with `post`, gemma4's post-norms and their add (moe_combine_norms)."""
    be, k = lower.be, lower.k
    m, T = op.spec, lower.rows
    scratch = be.__dict__.setdefault("_moe_scratch", Scratch(be.dev))
    n_in, H, K = be.widths[op.src], m.hidden, m.n_used
    A = T * K
    tensors = [be.gf.tensor(b) for b in op.banks]
    chunks = [be.weights[b] for b in op.banks]
    q8 = op.q8 or (False,) * len(op.banks)
    for t, r in zip(tensors, q8):
        if r and not KM.has_gemv(t.qtype, int(t.shape[-1])):
            raise UnsupportedError(f"{t.name}: {t.qtype.name} expert banks need rows of whole 64-value groups "
                                   "on the GPU")
    h = lower.current(op.src)
    ids, wts = scratch("ids", 4 * A), scratch("wts", 4 * A)
    ds = [route_dispatch(k, lower.current(op.logits), ids, wts, m, T)]
    if m.weight_before:  # llama4: each pair's input is its token's row times its weight
        x, x_div = scratch("xs", 4 * A * n_in), 1
        ds.append(scale_rows_dispatch(k, h, wts, x, n_in, K, T))
    else:
        x, x_div = h, K
    up, down = tensors[:-1], tensors[-1]
    gemv_up = any(KM.has_gemv(t.qtype, n_in) for t in up)
    xq = None
    if gemv_up:
        if x is h:  # the scratch may already hold h rounded (or keeps it for the shared expert's GEMVs)
            pre, xq = lower.q8_input(h, n_in)
            ds += pre
        else:
            d, xq = KQ.quantize_dispatch(k, x, n_in, A, into=scratch("xs_q8", 4 * A * KQ.words(n_in)))
            ds.append(d)
    act = scratch("act", 4 * A * H)
    fused = m.fused_gate_up
    if xq is not None and _grouped(k, T, op, tensors, chunks):  # prompt batches: MUL_MAT_ID
        return ds + _grouped_experts(lower, op, scratch, ids, wts, xq, x_div, act, tensors, chunks, add, post, norm)
    qg, qu = up[0].qtype, up[-1].qtype
    ain = act
    if KM.has_gemv(qg, n_in) and KM.has_gemv(qu, n_in) and (fused or _same_ranges(chunks[0], chunks[1])):
        # the down bank's int8 GEMV reads act rounded: the pair writes that too (no quantize dispatch)
        if KM.has_gemv(down.qtype, H) and KM.pair_rounds(k.dev, H, [(None, 0, H)], 1):
            ain = scratch("act_q8", 4 * A * KQ.words(H))
        ds += expert_pair(k, qg, qu, n_in, H, chunks[0], chunks[0] if fused else chunks[1], xq, act, m.activation,
                          A, ids, x_div, fused, yq=None if ain is act else ain)
    else:
        g, u = scratch("g", 4 * A * H), scratch("u", 4 * A * H)
        rb = KM.row_bytes(qg, n_in)
        for i, dst in enumerate((g, u)):
            t = up[0] if fused else up[i]
            xin = xq if KM.has_gemv(t.qtype, n_in) else x
            if fused:
                ds += expert_matmul(k, t.qtype, n_in, H, chunks[0], xin, dst, A, ids, x_div, 2 * H * rb, i * H * rb)
            else:
                ds += expert_matmul(k, t.qtype, n_in, H, chunks[i], xin, dst, A, ids, x_div)
        ds.append(KS.gated_dispatch(k, g, u, act, A * H, m.activation))
    if KM.has_gemv(down.qtype, H) and ain is act:
        d, ain = KQ.quantize_dispatch(k, act, H, A, into=scratch("act_q8", 4 * A * KQ.words(H)))
        ds.append(d)
    ys = scratch("ys", 4 * A * n_in)
    ds += expert_matmul(k, down.qtype, H, n_in, chunks[-1], ain, ys, A, ids)
    return ds + [_combine(lower, op, ys, wts, ids, add, post, norm)]


def _grouped_experts(lower, op: MoE, scratch, ids, wts, xq, x_div: int, act, tensors, chunks,
                     add: Add | None, post: PostNorms | None, norm: NextNorm | None = None) -> list[Dispatch]:
    """Gate||up and down of every pair as int8 GEMMs over the pairs grouped by expert, then the sum."""
    k, m, T = lower.k, op.spec, lower.rows
    n_in, H, K = lower.be.widths[op.src], m.hidden, m.n_used
    A = T * K
    E = m.n_expert
    tile_pair = _pair_tile(k, m, tensors[0].qtype, H, A, E)
    # else gate and up apart (one tile's BT groups both), then gated_gelu_f16
    tile_up = tile_pair or grouped_tile(k, tensors[0].qtype, H, A, E=E)
    tile_down = grouped_tile(k, tensors[-1].qtype, n_in, A, E=E)
    groups = {bt: Groups(scratch, m.n_expert, A, bt) for bt in {tile_up.BT, tile_down.BT}}
    ds = [group_dispatch(k, ids, g, m.n_expert, A) for g in groups.values()]
    if tile_pair is None:
        g, u = scratch("g", 4 * A * H), scratch("u", 4 * A * H)
        for i, dst in enumerate((g, u)):
            bank = chunks[0] if m.fused_gate_up else chunks[i]
            ds += grouped_matmul(k, tensors[0 if m.fused_gate_up else i].qtype, n_in, H, bank, xq, dst, A,
                                 groups[tile_up.BT], tile_up, x_div, half=i if m.fused_gate_up else None)
        ds.append(KS.gated_dispatch(k, g, u, act, A * H, m.activation))
    else:
        ds += grouped_matmul(k, tensors[0].qtype, n_in, H, chunks[0], xq, act, A, groups[tile_up.BT], tile_up,
                             x_div, act=m.activation, chunks2=None if m.fused_gate_up else chunks[1],
                             fused=m.fused_gate_up)
    d, aq = KQ.quantize_dispatch(k, act, H, A, into=scratch("act_q8", 4 * A * KQ.words(H)))
    ys = scratch("ys", 4 * A * n_in)
    ds += [d] + grouped_matmul(k, tensors[-1].qtype, H, n_in, chunks[-1], aq, ys, A, groups[tile_down.BT], tile_down)
    return ds + [_combine(lower, op, ys, wts, ids, add, post, norm)]


def sigmoid_gate(lower, op: SigmoidGate) -> list[Dispatch]:
    be = lower.be
    buf, src = lower.current(op.buf), lower.current(op.src)
    y = lower.target(op.buf, op.buf, op.src)
    D = be.widths[op.buf]
    if be.widths[op.src] != D:
        raise UnsupportedError(f"{op.weight}: a shared expert's gate over a row of another width")
    return [sigmoid_gate_dispatch(lower.k, buf, src, be.weights[op.weight][0], y, D, lower.rows)]

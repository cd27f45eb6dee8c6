"""Dispatch builders for attention and the fused RoPE + KV store.

Attention is lowered one of three ways, fixed when a graph is built for a
batch shape (T rows) and reused at every position: each row's position and
sequence slot live in the GPU `rows` buffer and its keys in the paged KV cache
through the block table (kernels_misc.Paging, docs/gpu_kernels.md):

- split-K decode (T <= SPLIT_MAX_T, or up to DECODE_MAX_T rows of a batched
  decode step whose sequences each have few rows; more than SPLIT_FROM keys):
  the keys in chunks of `chunk` positions,
  workgroups per (HG query heads of one kv head) each taking every P-th chunk
  (split_parallel). Three dispatches:
  `attn_scores` (scores to a scratch buffer, per-chunk max and sum),
  `attn_values` (global max and sum from the chunk stats, f16(p) . V per
  chunk), `attn_combine` (add the chunks). Only chunks up to each row's
  length are visited, so one graph serves every length up to n_ctx.
- tiled prefill (`attn_tiled2`, on Dawn): the query heads of one kv head for a block
  of rows per workgroup sharing K/V tiles in workgroup memory, each invocation
  a register micro-tile of scores and outputs (one walk over the keys per
  sequence among the block's rows: fast when they share one); the earlier
  `attn_tiled` (16 queries of one head per workgroup, 8 past head dim 256, one
  score per invocation) on wgpu-native, where attn_tiled2 is slower (tiled_kernel),
  where attn_tiled2's workgroup memory does not fit, and for head dims 264-512
  with INFR_ATTN_WIDE=1 (attn_tiled2 takes <= 256); INFR_ATTN_TILED=1|2; with
  INFR_ATTN_TILED=3 `attn_mma` (kernels_attn_mma: the same walk on the tensor
  cores, Dawn's subgroup matrices; not yet the default: it has not run on a GPU);
- the original one-workgroup-per-(head, token) kernel (kernels_misc) for
  decode in short contexts and for shapes the two above do not take (head
  dims not multiples of 8, over 512, or over 256 without INFR_ATTN_WIDE=1;
  tiles past the device's workgroup memory).

The normalised probabilities are rounded to f16 before they multiply V, as
the reference does (infr/cpu/ops.py attention); that needs the final max and
sum first, hence a scores/stats pass ahead of the V pass in both kernels.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from infr.gpu import tuning as TU
from infr.gpu import kernels_attn_mma as KAM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import Dispatch, Kernels, storage

SPLIT_MAX_T = TU.AttentionTuning.split_t  # (4) batches up to this many tokens use split-K; longer ones the tiled kernel
# A batched decode step (one or a few rows for each of many sequences) keeps
# split-K / one-pass attention up to this many rows: each row reads its own
# sequence's keys, which the tiled kernel could only share between rows of one
# sequence. The split-K grid grows with the rows (P shrinks to 1 at 64 rows of 8 head groups).
DECODE_MAX_T = 64
# Decode batches whose last token sees at most this many keys run the one-pass
# kernel, longer ones split-K: on the H200 the one dispatch beat split-K's three
# at depth 128 (17 vs 43 µs a layer, profiled), and split-K pays where there are
# thousands of keys (tg64 at depth 4096: 156 vs 66 t/s on the 8B shape). Both
# are in the graph; each reads the lengths from `rows` and one of them idles per row.
# Where they part: on an H100 (Dawn, 8B, a 4096-key context) one stream decoding from 400 keys ran
# 258 t/s with split-K from 256 keys against 249 from 512, and from 139 keys 279 either way, while
# split-K from 128 keys lost there (257): perf/h200/split-from-2026-12-05-h100.txt.
# INFR_ATTN_SPLIT_FROM overrides (0: split-K at every length).
SPLIT_FROM = TU.AttentionTuning.split_from  # 256
# A graph for a context of at most this many keys holds the one-pass kernel
# alone: the idle split-K dispatches cost ~7.5 µs a layer on the H200 (8B tg128
# 205 vs 216 t/s), more than one-pass loses in the last few hundred positions.
# INFR_ATTN_ONE_PASS_CTX overrides.
ONE_PASS_CTX = TU.AttentionTuning.one_pass_ctx  # 1024
SPLIT_WG = 128       # invocations of attn_scores / attn_values
TILED_MAX_DIM = 512   # attn_tiled's head dims (workgroup memory: q block + one K/V tile; tiled_rows)
TILED2_MAX_DIM = 512  # attn_tiled2's (past 256 only its 16- or 8-slot tilings fit: default_tiling)
WIDE_DIM = 256        # prefill past this head dim takes the tiled kernels only with INFR_ATTN_WIDE=1
MAX_HG = 8           # query heads per split-K workgroup (registers per invocation)
SPLIT_TARGET_WGS = TU.AttentionTuning.wgs  # (512) split-K workgroups per dispatch at full depth (INFR_ATTN_WGS overrides)


def pack_rope_kv(n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, n_rot: int, theta: float,
                 freq_scale: float, has_factors: bool, blocks_per_seq: int = 1, eps: float = 0.0) -> bytes:
    return KS._pack([
        ("n_heads", "u32", n_heads), ("kv_heads", "u32", kv_heads), ("head_dim", "u32", head_dim),
        ("v_head_dim", "u32", v_head_dim), ("n_rot", "u32", n_rot), ("theta", "f32", theta),
        ("freq_scale", "f32", freq_scale), ("has_factors", "u32", int(has_factors)),
        ("blocks_per_seq", "u32", blocks_per_seq), ("eps", "f32", eps),
    ])


@dataclass(frozen=True)
class HeadNorms:
    """The per-head RMSNorms rope_kv applies too (fusion.py's norm_rope_store): each weight
    buffer or None (that norm absent; a weightless norm passes ones), before or after the rotation."""
    q: object = None
    k: object = None
    v: object = None
    eps: float = 0.0
    after: bool = False


def chunk_size(n_ctx: int) -> int:
    """Keys per split-K chunk: 128 (many workgroups at moderate depth) unless the
    context is so long that the per-chunk scratch and the stats merge grow past
    ~1024 chunks. INFR_ATTN_CHUNK (a multiple of 128, at most 512; tuning.AttentionTuning) overrides."""
    if TU.current().attention.chunk:
        return TU.current().attention.chunk
    c = SPLIT_WG
    while c < 512 and -(-n_ctx // c) > 1024:
        c *= 2
    return c


def split_parallel(max_chunks: int, head_groups: int, T: int) -> int:
    """Workgroups per (head group, token) along the chunks: each takes every P-th
    chunk the query sees, so a long n_ctx does not launch thousands of idle
    workgroups at short depth, and a deep context still fills the GPU."""
    target = TU.current().attention.wgs
    return max(1, min(max_chunks, -(-target // (head_groups * T))))


def heads_per_group(n_heads: int, kv_heads: int) -> int:
    """The largest divisor of the GQA group size that is at most MAX_HG."""
    group = n_heads // kv_heads
    return max(d for d in range(1, min(group, MAX_HG) + 1) if group % d == 0)


@dataclass
class SplitScratch:
    """Buffers the split-K passes share across layers (the layers run one after another)."""

    scores: object  # f32 [T, n_heads, n_ctx]
    stats: object   # vec2<f32> [T, n_heads, max_chunks]
    part: object    # vec4<f32> [T, n_heads, max_chunks, v_head_dim / 4]
    n_ctx: int
    chunk: int

    @property
    def max_chunks(self) -> int:
        return -(-self.n_ctx // self.chunk)


def split_scratch(kernels: Kernels, T: int, n_ctx: int, max_heads: int, max_v_dim: int,
                  chunk: int | None = None) -> SplitScratch:
    chunk = chunk or chunk_size(n_ctx)
    if chunk % SPLIT_WG:
        raise ValueError(f"split-K chunk {chunk} is not a multiple of {SPLIT_WG}")
    mc = -(-n_ctx // chunk)
    sizes = (T * max_heads * n_ctx * 4, T * max_heads * mc * 8, T * max_heads * mc * max_v_dim * 4)
    if max(sizes) > kernels.dev.max_binding:
        raise ValueError(f"split-K attention scratch of {max(sizes)} bytes exceeds the storage binding limit")
    dev = kernels.dev
    return SplitScratch(storage(dev, sizes[0], label="attn.scores"), storage(dev, sizes[1], label="attn.stats"),
                        storage(dev, sizes[2], label="attn.part"), n_ctx, chunk)


_scratch: weakref.WeakKeyDictionary[object, dict] = weakref.WeakKeyDictionary()


def scratch_for(owner, kernels: Kernels, T: int, n_ctx: int, max_heads: int, max_v_dim: int) -> SplitScratch:
    """One SplitScratch per (owner, T): a backend's graphs for one batch shape share it."""
    per = _scratch.setdefault(owner, {})
    key = (T, n_ctx, max_heads, max_v_dim, chunk_size(n_ctx))
    if key not in per:
        per[key] = split_scratch(kernels, T, n_ctx, max_heads, max_v_dim)
    return per[key]


def _check(n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int) -> None:
    if n_heads % kv_heads:
        raise ValueError(f"{n_heads} query heads do not share {kv_heads} kv heads evenly")
    if head_dim % 8 or v_head_dim % 4 or max(head_dim, v_head_dim) > KS.ATTN_MAX_HEAD_DIM:
        raise ValueError(
            f"attention needs head_dim % 8 == 0, v_head_dim % 4 == 0, both at most {KS.ATTN_MAX_HEAD_DIM}")


def split_dispatches(
    kernels: Kernels, q, kcache, vcache, out, pg: KS.Paging, scratch: SplitScratch, n_heads: int, kv_heads: int,
    head_dim: int, v_head_dim: int, scale: float, window: int | None, softcap: float | None, T: int,
    parallel: int | None = None, kv_min: int = 0, xq=None, chunk: int | None = None,
) -> list[Dispatch]:
    """Split-K attention for T rows, each at its own position of its own sequence
    (pg; positions below scratch.n_ctx); `parallel` workgroups along the chunks
    (default split_parallel); `xq`: the combine pass also writes the output rounded there."""
    _check(n_heads, kv_heads, head_dim, v_head_dim)
    if v_head_dim > 4 * SPLIT_WG:
        raise ValueError(f"split-K attention needs v_head_dim <= {4 * SPLIT_WG}")
    hg, C, mc = heads_per_group(n_heads, kv_heads), scratch.chunk, scratch.max_chunks
    data = KS.pack_attention(n_heads, kv_heads, head_dim, v_head_dim, scale, window, softcap, scratch.n_ctx, mc,
                             pg.blocks_per_seq, chunk)
    p = storage(kernels.dev, np.frombuffer(data, np.uint8), label="attn.params", uniform=True)
    P = parallel or split_parallel(mc, n_heads // hg, T)
    grid = (min(P, mc), n_heads // hg, T)
    bs = pg.block_size
    s = kernels.pipeline("attn_scores", "main", WG=SPLIT_WG, C=C, HG=hg, HD=head_dim, KV_MIN=kv_min, BS=bs)
    v = kernels.pipeline("attn_values", "main", WG=SPLIT_WG, C=C, HG=hg, VD=v_head_dim, KV_MIN=kv_min, BS=bs)
    c = kernels.pipeline("attn_combine", "main", C=C, KV_MIN=kv_min, **KS.q8_out_consts(xq, n_heads, v_head_dim, 5))
    shape = f"{n_heads}/{kv_heads}x{head_dim}"
    paged = [pg.state, pg.rows, pg.table]
    return [
        Dispatch(s, kernels.bind(s, [p, q, kcache, scratch.scores, scratch.stats] + paged), grid,
                 f"attn_scores {shape} c{C}x{grid[0]}"),
        Dispatch(v, kernels.bind(v, [p, scratch.scores, scratch.stats, vcache, scratch.part] + paged), grid,
                 f"attn_values {shape} c{C}x{grid[0]}"),
        Dispatch(c, kernels.bind(c, [p, scratch.part, out, pg.state, pg.rows] + ([xq] if xq is not None else [])),
                 (n_heads, T, 1), "attn_combine"),
    ]


@dataclass(frozen=True)
class Tiled2:
    """attn_tiled2's tiling: M query slots (HG heads x M / HG rows) per workgroup of
    WG = M / QPI * 16 invocations, each QPI slots x KPI keys of a 16 KPI-key tile."""

    M: int
    HG: int
    QPI: int
    KPI: int = 2

    @property
    def WG(self) -> int:
        return self.M // self.QPI * 16

    @property
    def R(self) -> int:
        return self.M // self.HG

    @property
    def BK(self) -> int:
        return 16 * self.KPI

    def consts(self, head_dim: int, v_head_dim: int) -> dict:
        kvw = max(head_dim, v_head_dim) // 2 + 1
        return dict(WG=self.WG, M=self.M, HG=self.HG, QPI=self.QPI, KPI=self.KPI, HD=head_dim, VD=v_head_dim,
                    KVW=kvw, KVN=max(self.BK * kvw, self.M * 32))

    def workgroup_bytes(self, head_dim: int, v_head_dim: int) -> int:
        kvn = self.consts(head_dim, v_head_dim)["KVN"]
        return 4 * (self.M * (head_dim // 2 + 1) + kvn + self.M * (self.BK // 2 + 1))


TILED2_MIN_WGS = 128  # below this many workgroups (a short batch) attn_tiled2 takes its 16-slot tiling
TILED2_SMALL = (16, 2, 2)


def tiled2_shape(n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
                 tiling: tuple[int, int, int] | None = None, T: int | None = None) -> Tiled2:
    """(M, QPI, KPI) = `tiling`, else INFR_ATTN_TILED2="M,QPI,KPI" (for tuning), else 64 slots
    of 4 by 2 keys up to head dim 128 (29 KiB of workgroup memory at 128), past it 16 slots of 2
    by 2 keys (a 256-dim 32-key tile alone is 16 KiB); and 16 slots where the 64-slot tiling
    would give a batch of T rows fewer than TILED2_MIN_WGS workgroups (more, smaller ones keep
    more of the GPU busy). HG: the largest power of two dividing the GQA group, at most 8 and M
    (the rows of a block share the kv head's tiles)."""
    if tiling is None:
        tiling = TU.current().attention.tiled2
    if tiling is None:
        tiling = (64, 4, 2) if max(head_dim, v_head_dim) <= 128 else TILED2_SMALL
        if T is not None and tiling != TILED2_SMALL:
            t = tiled2_shape(n_heads, kv_heads, head_dim, v_head_dim, tiling)
            if n_heads // t.HG * -(-T // t.R) < TILED2_MIN_WGS:
                tiling = TILED2_SMALL
    M, QPI, KPI = tiling
    if M % QPI or KPI % 2 or M & (M - 1):
        raise ValueError(f"attn_tiled2 tiling M={M} QPI={QPI} KPI={KPI}: M a power of two, QPI | M, KPI even")
    group = n_heads // kv_heads
    hg = 1
    while hg < min(8, M) and group % (2 * hg) == 0:
        hg *= 2
    return Tiled2(M, hg, QPI, KPI)


def _workgroup_mem(kernels: Kernels) -> int:
    return int(kernels.dev.limits.get("max-compute-workgroup-storage-size", 16384))


def tiled_kernel(kernels: Kernels, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
                 tiling: tuple[int, int, int] | None = None, T: int | None = None) -> int:
    """Which tiled prefill kernel takes a shape: 2 (attn_tiled2) on Dawn where the device's
    workgroup memory holds its tiles, else 1 (attn_tiled) where it holds attn_tiled's (tiled_bytes),
    else 0 (neither: the one-pass kernel). INFR_ATTN_TILED=1 / 2 forces one (still only where it
    fits). Measured on an H100 at T = 512 (perf/attn_prefill_time.py,
    8B shape): through Dawn attn_tiled2 223 µs against attn_tiled's 346; through wgpu-native
    (naga) 2458 against 1047, so wgpu-native keeps attn_tiled until attn_tiled2 is made fast
    there (its register arrays indexed in loops are the suspect). 3 (attn_mma, the tensor cores) only with
    INFR_ATTN_TILED=3, where the device has the subgroup matrices and the head dims suit them
    (kernels_attn_mma.takes), elsewhere the device's choice: on an H100 it was no faster than attn_tiled2
    (kernels_attn_mma). `tiling`:
    attn_tiled2's (M, QPI, KPI), or attn_mma's (M, BK) with INFR_ATTN_TILED=3."""
    if TU.current().attention.tiled == 3:
        if (tiling is None or len(tiling) == 2) and KAM.takes_shape(kernels.dev, n_heads, kv_heads, head_dim,
                                                                    v_head_dim, tiling):
            return 3
        tiling = None  # not attn_mma's: the device's choice below
    if _tiled2_takes(kernels, n_heads, kv_heads, head_dim, v_head_dim, tiling, T):
        return 2
    return 1 if tiled_bytes(head_dim, v_head_dim) <= _workgroup_mem(kernels) else 0


def _tiled2_takes(kernels: Kernels, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
                  tiling: tuple[int, int, int] | None, T: int | None) -> bool:
    force = TU.current().attention.tiled
    if force == 1 or head_dim % 8 or v_head_dim % 4 or max(head_dim, v_head_dim) > TILED2_MAX_DIM:
        return False
    if force != 2 and not kernels.dev.dawn:
        return False
    if tiling is not None and len(tiling) != 3:
        tiling = None
    t = tiled2_shape(n_heads, kv_heads, head_dim, v_head_dim, tiling or default_tiling(kernels, head_dim, v_head_dim), T)
    inv = int(kernels.dev.limits.get("max-compute-invocations-per-workgroup", 256))
    return t.workgroup_bytes(head_dim, v_head_dim) <= _workgroup_mem(kernels) and t.WG <= inv


def default_tiling(kernels: Kernels, head_dim: int, v_head_dim: int) -> tuple[int, int, int] | None:
    """Past head dim 128, 32 slots of 2 where workgroup memory holds them (35 KiB at 256: NVIDIA's
    48 KiB; on the H100 through Dawn 251 µs against 363 for 16 slots, 16/8 x 256 at T = 512);
    past 256 the first of 16 and 8 slots that fits (at 512: 50 and 42 KiB; not yet timed on a GPU,
    INFR_ATTN_WIDE); None (tiled2_shape's choice) elsewhere."""
    if max(head_dim, v_head_dim) <= 128 or TU.current().attention.tiled2:
        return None
    mem = _workgroup_mem(kernels)
    for tiling in ((32, 2, 2), (16, 2, 2), (8, 2, 2)) if max(head_dim, v_head_dim) > 256 else ((32, 2, 2),):
        if Tiled2(tiling[0], 1, tiling[1], tiling[2]).workgroup_bytes(head_dim, v_head_dim) <= mem:
            return tiling
    return None


def tiled_dispatch(
    kernels: Kernels, q, kcache, vcache, out, pg: KS.Paging, n_heads: int, kv_heads: int, head_dim: int,
    v_head_dim: int, scale: float, window: int | None, softcap: float | None, T: int, chunk: int | None = None,
    kernel: int | None = None, tiling: tuple[int, int, int] | None = None,
) -> Dispatch:
    """Prefill attention for T rows (any rows; a block of rows of one sequence walks its keys
    once). `kernel` 2: attn_tiled2, the query heads of a kv head and a block of rows per
    workgroup, register-blocked; 1: attn_tiled, 16 queries of one head per workgroup (8 past head dim 256);
    3: attn_mma, attn_tiled2's walk on the tensor cores; None: tiled_kernel's choice. `tiling`: attn_tiled2's
    (M, QPI, KPI) (tiled2_shape), attn_mma's (M, BK) (kernels_attn_mma.shape)."""
    _check(n_heads, kv_heads, head_dim, v_head_dim)
    widest = {2: TILED2_MAX_DIM, 3: KAM.MAX_DIM}.get(kernel, TILED_MAX_DIM)
    if max(head_dim, v_head_dim) > widest:
        raise ValueError(f"tiled attention needs head dims <= {widest}")
    data = KS.pack_attention(n_heads, kv_heads, head_dim, v_head_dim, scale, window, softcap,
                             blocks_per_seq=pg.blocks_per_seq, chunk=chunk)
    p = storage(kernels.dev, np.frombuffer(data, np.uint8), label="attn.params", uniform=True)
    kernel = kernel or tiled_kernel(kernels, n_heads, kv_heads, head_dim, v_head_dim, tiling, T)
    if not kernel:
        raise ValueError(f"no tiled attention kernel fits head dims {head_dim}/{v_head_dim} in this device's "
                         f"{_workgroup_mem(kernels)} bytes of workgroup memory")
    if kernel == 2 and tiling is None and T is not None:
        tiling = default_tiling(kernels, head_dim, v_head_dim)
    pipe = tiled_pipeline(kernels, n_heads, kv_heads, head_dim, v_head_dim, pg.block_size, kernel, tiling, T)
    binds = kernels.bind(pipe, [p, q, kcache, vcache, out, pg.state, pg.rows, pg.table])
    if kernel == 2:
        t = tiled2_shape(n_heads, kv_heads, head_dim, v_head_dim, tiling, T)
        return Dispatch(pipe, binds, (n_heads // t.HG, -(-T // t.R), 1), f"attn_tiled2 {n_heads}/{kv_heads}x{head_dim}")
    if kernel == 3:
        t = KAM.shape(n_heads, kv_heads, tiling)
        return Dispatch(pipe, binds, (n_heads // t.HG, -(-T // t.R), 1), f"attn_mma {n_heads}/{kv_heads}x{head_dim}")
    bq = tiled_rows(head_dim, v_head_dim)
    return Dispatch(pipe, binds, (n_heads, -(-T // bq), 1), f"attn_tiled {n_heads}/{kv_heads}x{head_dim}")


def tiled_rows(head_dim: int, v_head_dim: int) -> int:
    """attn_tiled's query rows a block: 16, or 8 past head dim 256 (Gemma 4's full-attention layers, 512:
    26 KiB of workgroup memory, where 16 rows would need 36 KiB and lavapipe allows 32)."""
    return 16 if max(head_dim, v_head_dim) <= 256 else 8


def tiled_bytes(head_dim: int, v_head_dim: int) -> int:
    """attn_tiled's workgroup memory: the q block, one K/V tile, probabilities and (max, sum) pairs."""
    bq = tiled_rows(head_dim, v_head_dim)
    return 4 * (bq * (head_dim // 2 + 1) + 16 * (max(head_dim, v_head_dim) // 2 + 1)) + 12 * bq * 16


def tiled_pipeline(kernels: Kernels, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, block_size: int,
                   kernel: int, tiling: tuple[int, int, int] | None = None, T: int | None = None):
    """The pipeline of tiled prefill kernel `kernel` (3: attn_mma, 2: attn_tiled2, 1: attn_tiled) for a shape
    (and attn_tiled2's tiling for T rows: tiled2_shape)."""
    if kernel == 2:
        t = tiled2_shape(n_heads, kv_heads, head_dim, v_head_dim, tiling, T)
        return kernels.pipeline("attn_tiled2", "main", BS=block_size, **t.consts(head_dim, v_head_dim))
    if kernel == 3:
        return KAM.pipeline(kernels, n_heads, kv_heads, head_dim, v_head_dim, block_size, tiling)
    return kernels.pipeline("attn_tiled", "main", HD=head_dim, VD=v_head_dim, BQ=tiled_rows(head_dim, v_head_dim),
                            KVW=max(head_dim, v_head_dim) // 2 + 1, BS=block_size)


def split_from() -> int:
    """Keys (of a batch's last token) up to which decode takes the one-pass kernel."""
    return TU.current().attention.split_from


def attention_mode(T: int, head_dim: int, v_head_dim: int, n_ctx: int | None = None, decode: bool = False) -> str:
    """How attention for a batch of T rows in a context of n_ctx (None: long)
    is lowered: "one_pass", "split" (split-K only), "switch" (one-pass up to
    split_from() keys, split-K past them), "tiled" or "fallback" (the one-pass
    kernel for shapes the others do not take). `decode`: a batched decode step
    (rows of many sequences), which keeps the per-row kernels up to DECODE_MAX_T rows."""
    fits = head_dim % 8 == 0 and v_head_dim % 4 == 0
    # the largest batch split-K takes (INFR_ATTN_SPLIT_T; its scratch grows with T * n_ctx)
    split_t = TU.current().attention.split_t
    if decode:
        split_t = max(split_t, DECODE_MAX_T)
    near = split_from()
    one_pass_ctx = max(near, TU.current().attention.one_pass_ctx)
    if fits and T <= split_t and n_ctx is not None and near and n_ctx <= one_pass_ctx:
        return "one_pass"
    if fits and T <= split_t and v_head_dim <= 4 * SPLIT_WG:
        return "split" if not near or max(head_dim, v_head_dim) > KS.ATTN_MAX_HEAD_DIM else "switch"
    widest = TILED_MAX_DIM if TU.current().attention.wide else WIDE_DIM
    if fits and max(head_dim, v_head_dim) <= widest:
        return "tiled"
    return "fallback"


def attention_dispatches(
    kernels: Kernels, q, kcache, vcache, out, pg: KS.Paging, scratch_of, n_heads: int, kv_heads: int,
    head_dim: int, v_head_dim: int, scale: float, window: int | None, softcap: float | None, T: int,
    n_ctx: int | None = None, xq=None, span: str | None = None, decode: bool = False, chunk: int | None = None,
) -> list[Dispatch]:
    """The attention lowering for a batch of T rows in a context of n_ctx
    (None: long; `decode`: see attention_mode). `scratch_of()` returns the
    SplitScratch for this T (called only when split-K is chosen). `xq` (where KS.can_round_output): the output
    is also written there rounded to 8 bits for the Q4_K GEMV of the o
    projection, by the decode kernels themselves (saving a quantize dispatch
    per layer), or by a quantize dispatch after the tiled prefill kernel.

    Where the mode is "switch", `span` says which keys the graph will meet:
    "near" (every row sees at most split_from() keys: the one-pass kernel
    alone), "far" (some row sees more: split-K alone), or None (either: both
    kernels, and each row's length in `rows` idles one of them for that row,
    ~7.5 µs a layer on the H200). The backend knows each step's length on the host and keeps one graph
    per span; either graph is right at any length, only slower. `chunk`: chunked attention (llama4),
    every kernel masking the keys before the row's chunk."""
    args = (n_heads, kv_heads, head_dim, v_head_dim, scale, window, softcap, T)
    mode = attention_mode(T, head_dim, v_head_dim, n_ctx, decode)
    if mode == "switch" and span is not None:
        mode = "one_pass" if span == "near" else "split"
    if mode == "one_pass":
        return [KS.attention_dispatch(kernels, q, kcache, vcache, out, pg, *args, xq=xq, chunk=chunk)]
    if mode == "split":
        return split_dispatches(kernels, q, kcache, vcache, out, pg, scratch_of(), *args, xq=xq, chunk=chunk)
    if mode == "switch":
        near = split_from()
        split = split_dispatches(kernels, q, kcache, vcache, out, pg, scratch_of(), *args, kv_min=near, xq=xq,
                                 chunk=chunk)
        return [KS.attention_dispatch(kernels, q, kcache, vcache, out, pg, *args, kv_max=near, xq=xq,
                                      chunk=chunk)] + split
    kernel = tiled_kernel(kernels, n_heads, kv_heads, head_dim, v_head_dim, T=T) if mode == "tiled" else 0
    if kernel:  # else no tiled kernel's tiles fit this device's workgroup memory: the one-pass kernel
        out_d = [tiled_dispatch(kernels, q, kcache, vcache, out, pg, *args, chunk=chunk, kernel=kernel)]
    else:
        out_d = [KS.attention_dispatch(kernels, q, kcache, vcache, out, pg, *args, xq=xq, chunk=chunk)]
        xq = None
    if xq is not None:
        K = n_heads * v_head_dim
        out_d.append(KQ.quantize_dispatch(kernels, out, K, T, into=xq)[0])
    return out_d


def rope_kv_dispatch(
    kernels: Kernels, q, k, v, kcache, vcache, pg: KS.Paging, n_heads: int, kv_heads: int, head_dim: int,
    v_head_dim: int, n_rot: int, theta: float, freq_scale: float, style: str, T: int, factors=None,
    norms: HeadNorms | None = None,
) -> Dispatch:
    """RoPE on q and k (in place) at each row's position and the live rows' k, v
    into the f16 caches at their cache rows (pg's block table), in one dispatch;
    with `norms`, the per-head RMSNorms of q, k, v too (in place, as the unfused ops)."""
    style = getattr(style, "value", style)
    if style not in ("norm", "neox"):
        raise ValueError(f"unknown rope style {style!r}")
    if n_rot % 2 or n_rot > head_dim or head_dim % 2 or v_head_dim % 2 or max(head_dim, v_head_dim) > 512:
        raise ValueError("rope_kv needs even n_rot <= head_dim <= 512, even head dims and v_head_dim <= 512")
    nm = norms or HeadNorms()
    on = {"NQ": nm.q is not None, "NK": nm.k is not None, "NV": nm.v is not None}
    pipe = kernels.pipeline("rope_kv", "main", STYLE=style, BS=pg.block_size, AFTER=_wgsl_bool(nm.after),
                            **{key: _wgsl_bool(v) for key, v in on.items()})
    data = pack_rope_kv(n_heads, kv_heads, head_dim, v_head_dim, n_rot, theta, freq_scale, factors is not None,
                        pg.blocks_per_seq, nm.eps)
    p = storage(kernels.dev, np.frombuffer(data, np.uint8), label="rope_kv.params", uniform=True)
    ff = factors if factors is not None else KS._dummy(kernels)
    ws = [w if w is not None else KS._dummy(kernels) for w in (nm.q, nm.k, nm.v)]
    return Dispatch(pipe, kernels.bind(pipe, [p, q, k, v, kcache, vcache, ff, pg.state, pg.rows, pg.table, *ws]),
                    (n_heads + kv_heads, T, 1), f"rope_kv_{style}")


def _wgsl_bool(b: bool) -> str:
    return "true" if b else "false"

"""The prompt-batch matmul on tensor cores (wgsl/gemm_mma.wgsl): the Dawn tier's mmq.

Dawn exposes the tensor cores to WGSL as subgroup matrices
(`chromium_experimental_subgroup_matrix`; f16 x f16 -> f32 16 x 16 x 16 on
NVIDIA with the toggle `vulkan_enable_f16_on_nvidia`). This kernel takes the
same bindings, params and block readers as the int8 GEMM (kernels_mmq), so
kernels_mmq builds it in place of gemm_mmq wherever a device has the
matrices: every READERS type, the plain product, gate||up and the q|k|v split.
The readers' int8 lanes and scales become f16 weight values in workgroup
memory, the q8 activations f16 values d q; sums are f32.

The result matrices of one subgroup are variables of their own, generated
here: arrays of them indexed in loops stay in memory (perf/README.md,
2026-12-02, the probe's --unrolled sweep).

Knobs (MmaTuning, read once: infr.gpu.tuning): INFR_MMA=0 keeps gemm_mmq
everywhere; INFR_MMA_TILES "BN,BT,SUB,SGR,SGT[,PAD[,XC[,WC[,KP[,VW]]]]] ..." the tiles tried by
grid size as kernels_mmq does (XC / WC: token / weight tiles copied from f16 rows
that a pre-pass writes, q8_f16.wgsl / mma_dequant.wgsl; WC from INFR_MMA_WC_MIN_T
tokens, 256; XC / WC 2 copy them by vec4 words; WC 3 converts its own units, no rows written); a WC 3 tile
(direct_tile: DIRECT_TILE as a VW tile unless INFR_MMA_VW=0, Q6_K's DIRECT_Q6_TILE, DIRECT_FEW_TILE for few
workgroups unless INFR_MMA_DIRECT_FEW=0) comes first for
DIRECT_TYPES unless INFR_MMA_DIRECT=0, then WC_TILE, 128 x 128 copying both by vec4
words, unless INFR_MMA_WC=0. Grouped expert products take EXPERT_DIRECT_TILE unless INFR_MMA_EXPERTS=0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from infr.errors import UnsupportedError
from infr.gpu import kernels_matmul as KM
from infr.gpu import tuning as TU

# The matrix shape and subgroup size this kernel is written for (f16 inputs, f32 results).
SHAPE = (16, 16, 16)
SUBGROUP = 32


@dataclass(frozen=True)
class MmaTile:
    """BN weight rows x BT tokens per workgroup, SUB 32-value sub-blocks per
    stage, SGR x SGT subgroups (each (BN / SGR) x (BT / SGT) of the tile),
    PAD f16 between weight tile rows (bank spreading)."""

    BN: int = 128
    BT: int = 64
    SUB: int = 2
    SGR: int = 4
    SGT: int = 2
    PAD: int = 8
    XC: int = 0  # 1: the token tile copied from f16 rows (q8_f16.wgsl) by matrix loads, not converted here; 2: by
    # vec4 loads into registers a stage ahead and f16 stores (as WC 2)
    WC: int = 0  # 1: the weight tile too, from f16 rows a dequantizing pass writes (mma_dequant.wgsl); 2: those
    # rows copied by vec4 loads into registers a stage ahead and f16 stores, not by matrix loads and stores;
    # 3: no f16 rows: the quantized units fetched a stage ahead turned straight into the tile (DIRECT_TYPES)
    KP: int = 1  # groups of SGR x SGT subgroups, each doing the products of 1 / KP of a stage's values
    VW: int = 0  # 1: the tiles and the epilogue's scratch are views of one workgroup buffer (bufferView; the same
    # bits as VW 0 on an H200 through Dawn's Vulkan backend, stop 43), the scratch reusing the tiles' bytes after the last
    # stage (so 64 x 256 and 128 x 192 fit 48 KiB), the tiles written by 8- and 16-byte stores where VW 0 writes
    # each f16 alone (DIRECT_TILE's two tiles: 16384 2-byte stores a stage). DIRECT_TILE takes it (MmaTuning.vw);
    # 64 x 256 ran at 28-67 TOPS on an H200 (stop 43), far below.

    @property
    def tile_bytes(self) -> int:
        """The workgroup bytes of the weight and token tiles and the epilogue's scratch (VW: shared)."""
        ld = 32 * self.SUB + self.PAD
        tiles, scratch = 2 * ld * (self.BN + self.BT), 4 * 256 * self.KP * self.SGR * self.SGT
        return -(-max(tiles, scratch) // 16) * 16 if self.VW else tiles + scratch

    def groups(self, n_out: int, T: int, pair: bool = False) -> int:
        """Workgroups for n_out rows (a pair's: each tile holds BN / 2 of gate and of up) x T tokens."""
        return -(-n_out // (self.BN // 2 if pair else self.BN)) * -(-T // self.BT)

    @property
    def token_mats(self) -> int:
        """XC: the 16 x 16 token matrices each subgroup copies per stage."""
        return (self.BT // 16) * (2 * self.SUB) // (self.SGR * self.SGT)

    @property
    def weight_mats(self) -> int:
        """WC: the 16 x 16 weight matrices each subgroup copies per stage."""
        return (self.BN // 16) * (2 * self.SUB) // (self.SGR * self.SGT)

    @property
    def TM(self) -> int:
        return self.BN // self.SGR // SHAPE[0]

    @property
    def TN(self) -> int:
        return self.BT // self.SGT // SHAPE[1]

    @property
    def kp_ok(self) -> bool:
        """KP groups take whole 16-value products of each stage and copy no f16 rows (the copies index
        the subgroups of one group)."""
        return self.KP >= 1 and 2 * self.SUB % self.KP == 0 and (self.KP == 1 or not (self.XC or self.WC))

    @property
    def invocations(self) -> int:
        return self.KP * self.SGR * self.SGT * SUBGROUP

    def shared_bytes(self, extra: int = 0) -> int:
        staged = 24 if self.WC else 2 * self.SUB * 16 * self.BN + self.SUB * 8 * self.BN
        return staged + self.tile_bytes + 4 + extra

    def fits(self, dev, extra: int = 0, pair: bool = False) -> bool:
        limits = getattr(dev, "limits", None) or {}
        mem = int(limits.get("max-compute-workgroup-storage-size", 16384))
        inv = int(limits.get("max-compute-invocations-per-workgroup", 256))
        return (
            self.SUB in (2, 4, 8) and self.TM >= 1 and self.TN >= 1 and self.kp_ok
            and self.BN == self.TM * self.SGR * SHAPE[0] and self.BT == self.TN * self.SGT * SHAPE[1]
            and (not pair or self.TM % 2 == 0) and self.invocations <= inv and self.shared_bytes(extra) <= mem
            and self.XC in (0, 1, 2)
            and (self.XC != 1 or (self.token_mats >= 1 and self.token_mats * self.SGR * self.SGT
                                  == (self.BT // 16) * 2 * self.SUB))
            and self.WC in (0, 1, 2, 3) and (not self.WC or 128 % self.BN == 0)
            and self.VW in (0, 1) and (not self.VW or self.PAD % 8 == 0)
            and (self.WC != 1 or (self.weight_mats >= 1 and self.weight_mats * self.SGR * self.SGT
                                  == (self.BN // 16) * 2 * self.SUB))
        )

    @classmethod
    def parse(cls, spec: str) -> MmaTile:
        """'BN,BT,SUB,SGR,SGT[,PAD[,XC[,WC[,KP[,VW]]]]]'."""
        return cls(*map(int, spec.split(",")))

    @property
    def spec(self) -> str:
        return ",".join(map(str, (self.BN, self.BT, self.SUB, self.SGR, self.SGT, self.PAD)
                            + ((self.XC, self.WC, self.KP, self.VW) if self.VW else (self.XC, self.WC, self.KP)
                               if self.KP != 1 else (self.XC, self.WC) if self.WC else (self.XC,) if self.XC else ())))


# Tiles tried in order: the first giving min_groups workgroups; where none does, the
# product stays mmq's (kernels_mmq, which has smaller tiles). min_groups is 1: on the H200 the
# 1B's pp512 ran 24296 t/s with every prompt matmul here (its 2048-row matrices give 128
# workgroups), 23370 with those on mmq, 21302 all mmq. On an H100 (perf/mmq_bench.py
# --flavor dawn --mma ..., T = 512, the 8B's shapes), 64 x 128 with 2 x 4 subgroups of 2 x 2
# matrices: Q4_K 72.9 TOPS, Q6_K 63.4, Q8_0 64.5, against mmq's 60.6 for Q4_K; 128 x 64 with
# 4 x 2: 67.0, 21.7, 19.6; 64 x 64 with 2 x 2: 39.3, 32.7, 34.9 (mmq's 64 x 64 does as well).
# Batched decode steps (T = 16 .. 64 rows: many streams) took the 128-token tile too, so a 32-row
# step did the products of 128 tokens: the 8B served 32 streams at 44 ms a step on an H100
# (perf/h200/serve-8b-dawn-2026-12-06-h100.json). Tiles of 64 and 32 tokens follow; tile_for takes
# the one padding T least. WC_TILE (first after direct_tile's; INFR_MMA_WC=0 leaves it out): from 256 tokens (wc_min_t), 128 x 128
# with 2 x 4 subgroups of 4 x 2 matrices, its weight tile copied from f16 rows that mma_dequant.wgsl writes
# once per product. On an H100 (perf/mmq_bench.py, T = 512, the 8B's Q4_K gate+up / down, the pre-pass
# included) 82.7 / 80.1 TOPS against 76.3 / 67.4 for 64 x 128; 8B pp512 4937.2 against 4644.6 t/s,
# qwen35-4b 5950.1 against 5867.2 (perf/README.md, stop 33). The same tile without the copy needs 55 KB
# of workgroup memory; copying the token tile too by matrix loads (XC 1) was slower: 68.5 / 63.3. Its check against the
# reference (test_mma.py::test_rows_copied_as_f16[...-wc128]) passed on an H100 (stop 34). Its weight tile is
# copied by vec4 words into registers a stage ahead and f16 stores (WC 2), not by matrix loads from the rows
# and matrix stores (WC 1): on an H100 in one call 148.6 / 131.1 TOPS against 80.5 / 76.5, the products with
# that copy alone 232 against 98 (perf/h200/mma-wvec-2026-12-06-h100.json, s35-2026-12-06-h100.txt); 8B pp512
# 7812 t/s against 4869 (test_rows_copied_as_f16[...-words], the same bits as tiles converting their own
# weights, and this tile within the bound, passed there).
# Loading each subgroup's weight matrices straight from the rows (no weight tile) ran 60 / 59.
# Its token tile is copied so too (XC 2: q8_f16.wgsl's f16 rows by vec4 words, not q8 lanes converted in every
# workgroup of a column): on an H100 (stop 36, .../s36-2026-12-06-h100.txt) 8B pp512 8357.2 / 8262.4 / 8395.9 t/s
# against 8167.3 (and noisy first samples) with WC 2 alone, qwen35-4b 8767.0 / 8727.0 against 8671.5 / 8673.3;
# the same bits as the converting tiles (test_rows_copied_as_f16[...-both-words] passed there).
TILES = (MmaTile(64, 128, 2, 2, 4), MmaTile(64, 64, 2, 2, 2), MmaTile(64, 32, 2, 2, 2))
WC_TILE = MmaTile(128, 128, 2, 2, 4, 8, 2, 2)
# WC_TILE's shape without the dequantizing pre-pass (WC 3): each invocation turns its fetched units of the
# weights (the readers' Raw, a stage ahead) straight into f16 values in the tile (mma_direct_TYPE.wgsl),
# with no int8 lanes staged (which made a 128-row tile too big for 48 KiB). Each token tile converts its
# weight tile again, where WC_TILE reads f16 rows written once per product (and streamed from memory
# again per token tile). For the types with a unit_f16 (DIRECT_TYPES; INFR_MMA_DIRECT=0: WC_TILE), but as
# direct_tile picks (Q6_K's plain products take DIRECT_Q6_TILE). On an H100 with
# token tiles first (8B pp512, best of 4, runs alternated; perf/h200/s41-2026-12-07-h100.txt) 8245.0 / 8512.6 t/s
# against 8111.7 / 8281.8 with WC_TILE.
DIRECT_TILE = MmaTile(128, 128, 2, 2, 4, 8, 2, 3)
# The direct tile by type and grid (direct_tile). Q6_K's units convert better on 64 rows x 128 tokens (2 x 4 subgroups of
# 2 x 2 matrices), and where DIRECT_TILE gives fewer than DIRECT_FEW_GROUPS workgroups (the 8B's k or v alone, 1024
# rows where a Q6_K v keeps them apart: 32 at T = 512) 128 x 64 with 2 x 2 subgroups. On an H100 (perf/mmq_bench.py
# --flavor dawn --shapes qo,down,kv,gateup --mma ..., T = 512; perf/h200/mma-direct-sweep-2026-12-07-s42-h100.json),
# TOPS for q/o, gate+up, down, k/v: Q6_K on DIRECT_Q6_TILE 93.8 / 101 / 94.1 / 40.6 against DIRECT_TILE's 67.8 / 85 /
# 81.3 / 18.5; Q4_K's k/v on DIRECT_FEW_TILE 44.7 against 32.7 (DIRECT_TILE stays Q4_K's best on the rest: 106 / 172
# / 155 against 53-113 for the others). DIRECT_Q6_TILE's plain products were checked on an H100 in stop 41
# (test_units_converted_directly's 64 x 128 WC 3 tile, the same bits as the converting tiles); its gate||up pair passed
# test_direct_tiles on an H200 in stop 43 but is untimed, so a Q6_K pair keeps DIRECT_TILE. DIRECT_FEW_TILE's
# products passed test_direct_tiles there too: on by default (INFR_MMA_DIRECT_FEW=0: not).
DIRECT_Q6_TILE = MmaTile(64, 128, 2, 2, 4, 8, 2, 3)
DIRECT_FEW_TILE = MmaTile(128, 64, 2, 2, 2, 8, 2, 3)
DIRECT_FEW_GROUPS = 64
# Grouped expert products (MUL_MAT_ID) on WC 3 tiles: gathered rows need no f16 copies. On an H100 (perf/moe_grouped_time.py
# --flavor dawn --model qwen3-30b-a3b --T 512: 32 pairs an expert) 128 x 64 ran gate||up in 0.527 ms and down in 0.422
# against the int8 GEMM's 0.949 / 0.608 and the converting 64 x 32's 0.999 / 0.668; 128 x 32 0.685 / 0.622.
EXPERT_DIRECT_TILE = MmaTile(128, 64, 2, 4, 2, 8, 0, 3)
# Only from this many pairs an expert (a prompt batch's share: 512 tokens x 8 of 128 experts is 32): below it
# (batched decode steps) the int8 GEMM's tiles for few pairs, as measured before (kernels_mmq.expert_few).
EXPERT_DIRECT_MIN_T = 32
DIRECT_TYPES = ("q4_k", "q6_k", "q8_0", "q5_0")
# KP groups for a batched decode step's plain products (o, down, q|k|v: few row tiles, long K, so one group
# of subgroups a workgroup left the GPU waiting on loads). On an H100 at T = 32 (perf/mmq_bench.py, the 8B's
# Q4_K shapes, perf/h200/mma-kp-T32-2026-12-06-h100.json) 32 x 32 with 4 groups ran q/o 17.2, down 18.5 TOPS
# against the GEMV's 11.1 / 17.0 and 64 x 32's 9.1 / 9.0; the pair keeps 64 x 32 (30.1 against 18.4). From
# 32 rows (PLAIN_TILES, PLAIN_MIN_T) the 8B decoded 32 rows at 1553.9 t/s against 1423.9 with 64 x 32 and the
# GEMV, 48 rows unchanged (perf/h200/s35-2026-12-06-h100.txt). Its reference check
# (test_mma.py::test_stages_split_among_subgroup_groups) passed on an H100.
PLAIN_KP_TILE = MmaTile(32, 32, 4, 1, 2, 8, 0, 0, 4)
PLAIN_TILES = (TILES[0], TILES[1], PLAIN_KP_TILE)  # plain products and the q|k|v split
KP_MAX_T = 64  # KP tiles take no more rows than this (timed at 32; past it they would be taken for padding alone)
# Storage buffers a stage of the kernel with both f16 row copies may bind (the q|k|v split's three outputs,
# or a pair's two weights and the table GELU, beside bindings 12 and 13): a device allowing fewer (WebGPU's
# default is 8) takes the tiles that convert their own rows.
COPY_BUFFERS = 10
PHASES = ("convert", "products")  # both; perf/mmq_bench.py --mma-phases times one alone


# Below this many rows a plain product (not a gate||up pair) keeps the int8 GEMV where the tensor cores
# are: on an H100 at T = 32 (perf/h200/batched-decode-tiles-2026-12-06-h100.txt, the 8B's Q4_K shapes)
# the GEMV took 0.080 / 0.102 / 0.224 ms for q/o, qkv and down against the 64 x 32 tile's 0.112 / 0.114
# / 0.389, while the tile won the gate||up pair, 0.244 against 0.371; PLAIN_KP_TILE beats the GEMV there.
PLAIN_MIN_T = 32
GEMV_MIN_T = 33  # where no KP tile takes the product (keeps_gemv): the GEMV up to 32 rows, as measured above
# And below this many a gate||up pair does too: on an H100 (8B Q4_K_M, perf/batched_bench.py -npl 8,16,32,
# perf/h200/gemv-ub-2026-12-06-h100.txt) 16 rows decoded at 1150 t/s with the GEMV's pair against 1038
# with the tile, while 32 rows took the tile, 1435 against 1268. Rows in between are not measured.
PAIR_MIN_T = 17


@dataclass(frozen=True)
class MmaTuning:
    on: bool = True
    tiles: tuple[MmaTile, ...] = TILES
    # plain products' (and the q|k|v split's) own tiles, where they differ from a gate||up pair's
    # (INFR_MMA_PLAIN_TILES; None: `tiles`, as INFR_MMA_TILES alone sets it)
    plain_tiles: tuple[MmaTile, ...] | None = PLAIN_TILES
    min_groups: int = 1
    plain_min_t: int = PLAIN_MIN_T
    pair_min_t: int = PAIR_MIN_T
    # kernels_moe's grouped expert products here too (expert_tile_for; INFR_MMA_EXPERTS=0: the int8 GEMM's tiles): on
    # EXPERT_DIRECT_TILE Qwen3-30B-A3B's pp512 ran 7372.0 t/s against 5759.5 on an H100 (best of 3, s41-...-h100.txt)
    experts: bool = True
    # gemma4's dense gate||up pair with the table GELU here too (INFR_MMA_TABLE_PAIR=1): written and checked
    # against the reference on lavapipe's Tint only; until a GPU with these tensor cores runs it, gate and
    # up run as two products and gated_gelu_f16 (kernels_mmq.pairs_act)
    table_pair: bool = False
    # WC tiles dequantize the product's whole weight to f16 first: worth it where T tokens share it,
    # not in a batched decode step's few rows (INFR_MMA_WC_MIN_T); and only where that f16 copy, one
    # scratch per device, stays inside what the KV budget leaves the backend (kvpool.KVBudget.RESERVE)
    wc: bool = True  # WC_TILE first (INFR_MMA_WC=0: not at all)
    wc_min_t: int = 256
    wc_max_bytes: int = 256 << 20
    # a Q4_K_M layer's mixed q|k|v (a Q6_K v) as one product on a WC tile (kernels_mmq.mixed_tile;
    # INFR_MMA_MIXED=1); off until a GPU with these tensor cores runs it: a product per matrix
    mixed: bool = False
    direct: bool = True  # direct_tile's first for DIRECT_TYPES (INFR_MMA_DIRECT=0: not)
    # DIRECT_FEW_TILE where DIRECT_TILE gives few workgroups (INFR_MMA_DIRECT_FEW=0: not): 44.7 against 32.7 TOPS
    # on the k/v shape (H100, stop 42); its products passed test_direct_tiles on an H200 (stop 43)
    direct_few: bool = True
    # DIRECT_TILE as a VW tile (INFR_MMA_VW=0: not): its tiles stored by 8- and 16-byte words, the same bits
    # (test_views_give_the_same_bits, H200, stop 43); perf/mmq_bench.py --flavor dawn --types Q4_K, T = 512, H200:
    # q/o 131 against 119 TOPS, gate+up 173 / 170, down 156 / 150 (perf/h200/vw-glance-2026-12-07-s43-h200.json)
    vw: bool = True
    lead: tuple[MmaTile, ...] = ()  # tiles taken first wherever they apply (for_experts: EXPERT_DIRECT_TILE)

    @classmethod
    def from_env(cls, env=None) -> MmaTuning:
        env = os.environ if env is None else env
        t = cls()
        if env.get("INFR_MMA") == "0":
            t = replace(t, on=False)
        if env.get("INFR_MMA_TILES"):
            t = replace(t, tiles=tuple(MmaTile.parse(s) for s in env["INFR_MMA_TILES"].split()), plain_tiles=None)
        if env.get("INFR_MMA_PLAIN_TILES"):
            t = replace(t, plain_tiles=tuple(MmaTile.parse(s) for s in env["INFR_MMA_PLAIN_TILES"].split()))
        if env.get("INFR_MMA_MIN_GROUPS"):
            t = replace(t, min_groups=int(env["INFR_MMA_MIN_GROUPS"]))
        if env.get("INFR_MMA_PLAIN_MIN_T"):
            t = replace(t, plain_min_t=int(env["INFR_MMA_PLAIN_MIN_T"]))
        if env.get("INFR_MMA_PAIR_MIN_T"):
            t = replace(t, pair_min_t=int(env["INFR_MMA_PAIR_MIN_T"]))
        if env.get("INFR_MMA_EXPERTS") in ("0", "1"):
            t = replace(t, experts=env["INFR_MMA_EXPERTS"] == "1")
        if env.get("INFR_MMA_WC") in ("0", "1"):
            t = replace(t, wc=env["INFR_MMA_WC"] == "1")
        if env.get("INFR_MMA_WC_MIN_T"):
            t = replace(t, wc_min_t=int(env["INFR_MMA_WC_MIN_T"]))
        if env.get("INFR_MMA_MIXED") in ("0", "1"):
            t = replace(t, mixed=env["INFR_MMA_MIXED"] == "1")
        if env.get("INFR_MMA_DIRECT") in ("0", "1"):
            t = replace(t, direct=env["INFR_MMA_DIRECT"] == "1")
        if env.get("INFR_MMA_DIRECT_FEW") in ("0", "1"):
            t = replace(t, direct_few=env["INFR_MMA_DIRECT_FEW"] == "1")
        if env.get("INFR_MMA_VW") in ("0", "1"):
            t = replace(t, vw=env["INFR_MMA_VW"] == "1")
        if env.get("INFR_MMA_TABLE_PAIR") in ("0", "1"):
            t = replace(t, table_pair=env["INFR_MMA_TABLE_PAIR"] == "1")
        return t

    def tile_for(self, dev, n_out: int, T: int, extra: int = 0, pair: bool = False,
                 w16_bytes: int = 0, K: int = 0, qtype: str | None = None) -> MmaTile | None:
        """Of the tiles that fit and give min_groups workgroups, the one whose token tiles pad T
        least (the products of padding tokens are work too), the first on a tie; else None. A WC
        tile is taken wherever it may run, however it pads (WC_TILE runs at twice the others' rate:
        T = 480 on 64 x 32 would pad nothing and run at a quarter of it): from wc_min_t tokens, and
        where its f16 weight rows (w16_bytes) fit one binding. Tiles copying f16 rows only where the device
        allows COPY_BUFFERS storage buffers a stage. KP tiles (decode steps' few rows) only
        up to KP_MAX_T tokens. With K (rows of K values), only tiles whose stages divide it. WC 3 tiles only for
        a `qtype` (WGSL name) of DIRECT_TYPES: with `direct`, direct_tile's first, from wc_min_t tokens."""
        limits = getattr(dev, "limits", None) or {}
        binding = min(self.wc_max_bytes, int(limits.get("max-storage-buffer-binding-size", 1 << 27)))
        copies_fit = int(limits.get("max-storage-buffers-per-shader-stage", 8)) >= COPY_BUFFERS
        best, best_pad = None, None
        tiles = self.tiles if pair or self.plain_tiles is None else self.plain_tiles
        direct = self.direct and qtype in DIRECT_TYPES
        big = ((direct_tile(qtype, n_out, T, pair, self.direct_few, self.vw),) if direct else ()) + ((WC_TILE,) if self.wc else ())
        first = self.lead + big
        for n, tile in enumerate(first + tiles):
            rows16 = tile.WC in (1, 2)  # reads f16 weight rows a pass writes (one binding)
            sized = rows16 or len(self.lead) <= n < len(first)  # worth it from wc_min_t tokens
            if ((sized and T < self.wc_min_t) or (rows16 and w16_bytes > binding) or (K and K % (32 * tile.SUB))
                    or ((tile.XC or rows16) and not copies_fit) or (tile.WC == 3 and qtype not in DIRECT_TYPES)
                    or (tile.KP > 1 and T > KP_MAX_T)):
                continue
            groups = tile.groups(n_out, T, pair)
            pad = -(-T // tile.BT) * tile.BT
            if not (tile.fits(dev, extra, pair) and groups >= self.min_groups):
                continue
            if rows16 or n < len(first):
                return tile
            if best_pad is None or pad < best_pad:
                best, best_pad = tile, pad
        return best

    def for_experts(self) -> MmaTuning:
        """The tuning as grouped expert products take it: no tile copying f16 rows (their tiles gather
        rows from a bank), one tile list, EXPERT_DIRECT_TILE first for DIRECT_TYPES."""
        return replace(self, tiles=without_copies(self.tiles), plain_tiles=None, wc=False, direct=False,
                       lead=(EXPERT_DIRECT_TILE,))


def available(dev) -> bool:
    """Whether the device multiplies f16 subgroup matrices of SHAPE into f32 at subgroup size 32
    (Dawn with the feature, and the configuration among the adapter's)."""
    if dev is None or not getattr(dev, "dawn", False) or not dev.has("subgroup-matrix") or not dev.has("shader-f16"):
        return False
    m, n, k = SHAPE
    return any(
        str(c.get("component_type")) == "f16" and str(c.get("result_component_type")) == "f32"
        and (int(c["m"]), int(c["n"]), int(c["k"])) == (m, n, k)
        and int(c.get("min_subgroup_size", 0)) <= SUBGROUP <= int(c.get("max_subgroup_size", 0))
        for c in dev.subgroup_matrix_configs
    )


def keeps_gemv(dev, T: int, pair: bool = False, K: int = 0) -> bool:
    """Whether a plain product (a gate||up `pair`) of T rows of K values stays on the int8 GEMV because
    the device has these tensor cores (MmaTuning.plain_min_t, pair_min_t). A plain product whose K no
    KP tile's stages divide (SmolLM2's 576) keeps it below GEMV_MIN_T too: the tile it would take
    instead pads those rows to 64."""
    t = TU.current().mma
    if not t.on or not available(dev):
        return False
    if pair:
        return T < t.pair_min_t
    kp = any(x.KP > 1 and not (K and K % (32 * x.SUB)) for x in (t.plain_tiles or t.tiles))
    return T < (t.plain_min_t if kp else max(t.plain_min_t, GEMV_MIN_T))


# The grouped expert products (MUL_MAT_ID) on these tiles are checked against the reference on an
# H100 (tests/gpu/test_mma.py::test_grouped_experts_on_the_tensor_cores, ..._convert_units_directly).
# Converting tiles lost to the int8 GEMM's expert tiles end to end (perf/README.md, stop 31); the direct
# EXPERT_DIRECT_TILE wins, so the tensor cores take them by default where it applies (MmaTuning.experts,
# expert_tile_for: DIRECT_TYPES banks, from EXPERT_DIRECT_MIN_T pairs an expert).


def expert_tile_for(dev, n_out: int, T: int, extra: int = 0, pair: bool = False,
                    qtype: str | None = None) -> MmaTile | None:
    """tile_for, for grouped expert products (T: the tokens one expert's tile holds), where the
    tuning takes them onto the tensor cores: banks of DIRECT_TYPES from EXPERT_DIRECT_MIN_T pairs an expert
    (the converting tiles lost to the int8 GEMM's end to end, perf/README.md stop 31); else None."""
    t = TU.current().mma
    if not t.experts or not t.on or not available(dev) or qtype not in DIRECT_TYPES or T < EXPERT_DIRECT_MIN_T:
        return None
    return t.for_experts().tile_for(dev, n_out, T, extra, pair, qtype=qtype)


def without_copies(tiles) -> tuple[MmaTile, ...]:
    """The tiles as expert products take them: without f16 row copies (their tiles gather rows from a bank; WC 3
    tiles copy none)."""
    return tuple(dict.fromkeys(replace(x, XC=0, WC=x.WC if x.WC == 3 else 0) for x in tiles))


def direct_tile(qtype: str | None, n_out: int, T: int, pair: bool = False, few: bool = False,
                vw: bool = False) -> MmaTile:
    """The WC 3 tile for n_out rows x T tokens of `qtype` (a WGSL name of DIRECT_TYPES): DIRECT_Q6_TILE for a Q6_K
    product (not a pair), else DIRECT_TILE (`vw`: MmaTuning.vw, as a VW tile), or (`few`: MmaTuning.direct_few)
    DIRECT_FEW_TILE where DIRECT_TILE would give fewer than DIRECT_FEW_GROUPS workgroups."""
    if qtype == "q6_k" and not pair:
        return DIRECT_Q6_TILE
    if few and DIRECT_TILE.groups(n_out, T, pair) < DIRECT_FEW_GROUPS:
        return DIRECT_FEW_TILE
    return replace(DIRECT_TILE, VW=1) if vw else DIRECT_TILE


def tile_for(dev, n_out: int, T: int, extra: int = 0, pair: bool = False, w16_bytes: int = 0,
             K: int = 0, qtype: str | None = None) -> MmaTile | None:
    """The tile for n_out rows x T tokens on `dev`, or None where the kernel does not run there or
    no tile fills the device (kernels_mmq's int8 GEMM then does: both read the same q8 rows)."""
    t = TU.current().mma
    if not t.on or not available(dev):
        return None
    return t.tile_for(dev, n_out, T, extra, pair, w16_bytes, K, qtype)


def _staged_base(tile: MmaTile, a: int, pair: bool) -> str:
    """WGSL: the first staged row of this subgroup's row matrix a."""
    if not pair:
        return f"(sr * TM + {a}u) * 16u"
    h = tile.TM // 2
    half = "BN / 2u + " if a >= h else ""
    return f"{half}(sr * {h}u + {a % h}u) * 16u"


def generated(tile: MmaTile, pair: bool) -> dict[str, str]:
    """The kernel's written-out parts: accumulators, products per 16 values of k, the epilogue."""
    TM, TN = tile.TM, tile.TN
    ref = (lambda name: name) if tile.VW else (lambda name: f"&{name}")  # VW: wh, xh and ep are pointers (views)
    left = "subgroup_matrix_left<f16, 16, 16>"
    right = "subgroup_matrix_right<f16, 16, 16>"
    decl = "\n".join(f"    var acc_{a}_{b}: subgroup_matrix_result<f32, 16, 16>;" for a in range(TM) for b in range(TN))
    body = [f"            let l_{a} = subgroupMatrixLoad<{left}>({ref('wh')}, ({_staged_base(tile, a, pair)}) * LD + kk, false, LD);"
            for a in range(TM)]
    for b in range(TN):
        body.append(f"            let r_{b} = subgroupMatrixLoad<{right}>({ref('xh')}, ((sc * TN + {b}u) * 16u) * LD + kk, true, LD);")
        body += [f"            acc_{a}_{b} = subgroupMatrixMultiplyAccumulate(l_{a}, r_{b}, acc_{a}_{b});"
                 for a in range(TM)]
    epi = []
    for a in range(TM // 2 if pair else TM):
        for b in range(TN):
            epi += [f"    subgroupMatrixStore({ref('ep')}, scratch, acc_{a}_{b}, true, 16u);", "    workgroupBarrier();",
                    f"    let v_{a}_{b} = out_values(scratch, lane);", "    workgroupBarrier();"]
            up = f"v_{a}_{b}"
            if pair:
                epi += [f"    subgroupMatrixStore({ref('ep')}, scratch, acc_{a + TM // 2}_{b}, true, 16u);", "    workgroupBarrier();",
                        f"    let u_{a}_{b} = out_values(scratch, lane);", "    workgroupBarrier();"]
                up = f"u_{a}_{b}"
            st = (f"store_values(v_{a}_{b}, {up}, lane, first + {_staged_base(tile, a, pair)}, "
                  f"tok0, (sc * TN + {b}u) * 16u);")
            epi.append(f"    {st}" if tile.KP == 1 else f"    if (kp == 0u) {{ {st} }}")
    gen = {"ACC_DECL": decl, "PRODUCTS": "\n".join(body), "EPILOGUE": "\n".join(epi),
           "XM_DECL": "", "XM_STORE": "", "XM_LOAD": ""}
    copies = []  # (matrix type, name, source, its offset fn, the tile, the tile's offset fn, column-major, how many)
    if tile.XC == 1:
        copies.append((right, "xm", "x16", "x16_at(sg, {j}u, {st}, tok0)", "xh", "tile_at(sg, {j}u)", "true", tile.token_mats))
    if tile.WC == 1:
        copies.append((left, "wm", "w16", "w16_at(sg, {j}u, {st}, first)", "wh", "tile_at(sg, {j}u)", "false",
                       tile.weight_mats))
    decl, store, load = [], [], []
    for typ, name, src, at, dst, dst_at, cm, n in copies:
        ld = f"subgroupMatrixLoad<{typ}>(&{src}, {at}, {cm}, params.K)"
        decl += [f"    var {name}_{j} = {ld.format(j=j, st='0u')};" for j in range(n)]
        store += [f"        subgroupMatrixStore({ref(dst)}, {dst_at.format(j=j)}, {name}_{j}, {cm}, LD);" for j in range(n)]
        load += [f"            {name}_{j} = {ld.format(j=j, st='st + 1u')};" for j in range(n)]
    gen.update(XM_DECL="\n".join(decl), XM_STORE="\n".join(store), XM_LOAD="\n".join(load))
    return gen


_VIEWS = """    let wh = bufferView<array<f16, BN * LD>>(&smem, 0u);
    let xh = bufferView<array<f16, BT * LD>>(&smem, XH_AT);
    let ep = bufferView<array<f32, EPN>>(&smem, 0u);
    let wh2 = bufferView<array<vec2<u32>, BN * LD / 4u>>(&smem, 0u);
    let xh2 = bufferView<array<vec2<u32>, BT * LD / 4u>>(&smem, XH_AT);
    let wh4 = bufferView<array<vec4<u32>, BN * LD / 8u>>(&smem, 0u);
    let xh4 = bufferView<array<vec4<u32>, BT * LD / 8u>>(&smem, XH_AT);"""


def _memory(tile: MmaTile) -> dict[str, str]:
    """gemm_mma.wgsl's workgroup tiles and their stores: three arrays stored an f16 at a time, or (VW) views of one
    buffer (the scratch over the tiles) stored by vec2 / vec4 words (every offset a multiple of 4 / 8 f16: PAD % 8)."""
    if not tile.VW:
        return {"SMEM": "var<workgroup> wh: array<f16, BN * LD>;\nvar<workgroup> xh: array<f16, BT * LD>;\n"
                        "var<workgroup> ep: array<f32, KP * SGR * SGT * 256u>;",
                "VIEW_LETS": "",
                "PUT4": "    wh[o] = v.x; wh[o + 1u] = v.y; wh[o + 2u] = v.z; wh[o + 3u] = v.w;",
                "PUT8": "            wh[o] = v[0].x; wh[o + 1u] = v[0].y; wh[o + 2u] = v[0].z; wh[o + 3u] = v[0].w;\n"
                        "            wh[o + 4u] = v[1].x; wh[o + 5u] = v[1].y; wh[o + 6u] = v[1].z; wh[o + 7u] = v[1].w;",
                "VEC_PUT": "        for (var c = 0u; c < 4u; c++) {\n"
                           "            let h = bitcast<vec2<f16>>(w[n][c]);\n"
                           "            if (i < NWV) {\n"
                           "                wh[o + 2u * c] = h.x;\n"
                           "                wh[o + 2u * c + 1u] = h.y;\n"
                           "            } else if (i < NWV + NXV) {\n"
                           "                xh[o + 2u * c] = h.x;\n"
                           "                xh[o + 2u * c + 1u] = h.y;\n"
                           "            }\n"
                           "        }",
                "XPUT4": "                xh[o + 4u * c] = v.x; xh[o + 4u * c + 1u] = v.y; xh[o + 4u * c + 2u] = v.z; "
                         "xh[o + 4u * c + 3u] = v.w;"}
    return {"SMEM": "const XH_AT: u32 = 2u * BN * LD;  // the token tile's first byte\n"
                    "const EPN: u32 = KP * SGR * SGT * 256u;  // the epilogue's scratch, over the tiles\n"
                    f"var<workgroup> smem: buffer<{tile.tile_bytes}>;",
            "VIEW_LETS": _VIEWS,
            "PUT4": "    wh2[o / 4u] = bitcast<vec2<u32>>(v);",
            "PUT8": "            wh2[o / 4u] = bitcast<vec2<u32>>(v[0]);\n            wh2[o / 4u + 1u] = bitcast<vec2<u32>>(v[1]);",
            "VEC_PUT": "        if (i < NWV) {\n            wh4[o / 8u] = w[n];\n        } else if (i < NWV + NXV) {\n"
                       "            xh4[o / 8u] = w[n];\n        }",
            "XPUT4": "                xh2[(o + 4u * c) / 4u] = bitcast<vec2<u32>>(v);"}


def pipeline(kernels, qtype_name: str, tile: MmaTile, pair_act: str | None = None, split: bool = False,
             phases: tuple[str, ...] | None = None, expert: bool = False):
    """(the compiled kernel, output rows and tokens one workgroup covers), as kernels_mmq.mmq_pipeline
    (`expert`: tiles of pairs routed to one expert of a bank, kernels_moe's grouped path).
    `phases` without "convert" or "products" leaves that part out (wrong results: for timing it)."""
    pair = pair_act is not None
    if pair_act not in (None, *KM.PAIR_ACTS):
        raise UnsupportedError(f"no tensor-core gate||up kernel for the activation {pair_act!r}")
    if not tile.kp_ok:
        raise UnsupportedError(f"tensor-core tile {tile.spec}: KP groups need whole 16-value products a stage "
                               "and no f16 row copies (those index the subgroups of one group)")
    if tile.VW and tile.PAD % 8:
        raise UnsupportedError(f"tensor-core tile {tile.spec}: VW stores the tiles by 8- and 16-byte words, so their rows "
                               "need PAD a multiple of 8")
    if tile.WC == 3 and qtype_name not in DIRECT_TYPES:
        raise UnsupportedError(f"tensor-core tile {tile.spec}: no direct conversion of {qtype_name} units (DIRECT_TYPES)")
    if (tile.XC or tile.WC in (1, 2)) and expert:
        raise UnsupportedError("a tensor-core tile copying f16 rows (XC, WC) reads whole tiles of a matrix; "
                               "expert tiles gather their pairs' rows from a bank")
    phases = PHASES if phases is None else phases
    gen = generated(tile, pair)
    if "products" not in phases:
        gen["PRODUCTS"] = ""
    consts = {
        "QTYPE": qtype_name, "BN": tile.BN, "BT": tile.BT, "SUB": tile.SUB, "SGR": tile.SGR, "SGT": tile.SGT,
        "SG": SUBGROUP, "TM": tile.TM, "TN": tile.TN, "PAD": tile.PAD, "KP": tile.KP,
        "PAIR": str(pair).lower(), **KM.pair_act_consts(pair_act),
        **KM.tile_reader_consts(pair, split),
        "CONVERT": str("convert" in phases).lower(), **gen,
        "XCOPY": str(bool(tile.XC)).lower(), "NXA": 1 if tile.XC else -(-tile.BT * 2 * tile.SUB // tile.invocations),
        "X16": "@group(0) @binding(12) var<storage, read> x16: array<f16>;" if tile.XC == 1 else "",
        "WCOPY": str(tile.WC in (1, 2)).lower(), "WQN": 1 if tile.WC else 2 * tile.SUB * tile.BN,
        "DIRECT": str(tile.WC == 3).lower(), "DIRECT_FNS": f"mma_direct_{qtype_name}" if tile.WC == 3 else "mma_direct_none",
        "WSN": 1 if tile.WC else tile.SUB * tile.BN,
        "W16": "@group(0) @binding(13) var<storage, read> w16: array<f16>;" if tile.WC == 1 else "",
        "WVEC": str(tile.WC == 2).lower(), "XVEC": str(tile.XC == 2).lower(),
        "VEC_FNS": "\n".join(f"// #include mma_{c}vec_{'on' if on else 'off'}" for c, on in (("w", tile.WC == 2),
                                                                                          ("x", tile.XC == 2))),
        "EXPERT": "// #include mmq_expert_on" if expert else "// #include mmq_expert_off",
        "TOKENS_FIRST": str(TU.current().gemm_tokens_first != 0 and not expert).lower(),
        **_memory(tile),
    }
    pipe = kernels.pipeline("gemm_mma", "main", unchecked=True, **consts)
    return pipe, (tile.BN // 2 if pair else tile.BN), tile.BT


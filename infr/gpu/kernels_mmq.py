"""The int8 GEMM on 8-bit activations (wgsl/gemm_mmq.wgsl, "mmq") for batches of tokens.

The batched GEMV (kernels_matmul) reads every weight once per token; the f32
GEMM (kernels_gemm) reuses weights across tokens but dequantizes them to f32
and multiplies in f32. This kernel does both: a tile of BN weight rows x BT
tokens multiplies int8 weight lanes with the int8 activations of kernels_q8
by dot4I8Packed, so a prefill reads the weights ceil(T / BT) times and does
integer arithmetic. One kernel serves every type in READERS: its block
reader (wgsl/mmq_TYPE.wgsl) turns blocks into int8 lanes and per-32-value
scales as they are staged. It reads the same q8 scratch as the GEMV (one
quantize or rmsnorm_q8 feeds q, k, v or gate, up) and the same weight
uploads (row chunks, the stacked q|k|v buffer), with the GEMV's epilogues:
bias, the fused residual add, the q|k|v split and the gate||up pair.

Q4_K (before the reader split, nibbles staged as such) took the synthetic
8B's pp512 on the H200 from 406 to 1289 t/s and the 1B's from 2746 to 8057
(perf/h200/prefill-mmq-2026-12-01.json).

Selection (use_mmq): a READERS type whose matmuls round their activations
(infr.numerics.takes_q8), K % 64 == 0, in batches of T >= min_t tokens, on
every adapter. Smaller batches keep their kernels (the GEMV; on CPU adapters
the f32 GEMM from 8 tokens). The knobs (tile list, min_t, runtime checks)
are read from INFR_MMQ_* once per device (MmqTuning.from_env, device_tuning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType as Q

from infr.errors import UnsupportedError
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning as TU
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.numerics import takes_q8

# Types with a block reader wgsl/mmq_TYPE.wgsl -> the workgroup bytes the reader declares itself.
READERS = {
    Q.Q4_K: 0,
    Q.Q6_K: 0,
    Q.Q8_0: 0,
    Q.Q5_0: 0,
    Q.Q5_K: 0,
    Q.Q4_0: 0,
    Q.Q4_1: 0,
    Q.Q5_1: 0,
    Q.IQ4_NL: 1024,  # the code book, a byte at a time (mmq_iq4.wgsl)
    Q.IQ4_XS: 1024,
}

# Small batches keep the GEMV: the kernel's time barely moves below ~64 tokens
# (too few workgroups, each a long K loop). On the H200, 8B Q4_K_M, batched
# decode (perf/batched_bench.py, L sequences = L-row steps): L = 8 GEMV 507 vs
# mmq 341 t/s, L = 16 GEMV 542 vs mmq 678, L = 32 GEMV 550 vs mmq 1321
# (perf/h200/batched-8b-2026-12-02.json; the GEMV takes 8 tokens per workgroup).
# Decode (T = 1) keeps the GEMV.
MMQ_MIN_T = 16
MIN_GROUPS = 256


def applies(tensor) -> bool:
    """A matrix the kernel can multiply: a READERS type, whole 64-value groups per row (the q8
    activations' scale pairs; k-quant rows are whole 256-value blocks anyway). Rows of 32-value
    block types that are not whole 256s (Gemma 4 26B's experts: 704 wide, Q5_0 / Q8_0 by
    llama.cpp's fallback) stage fewer sub-blocks at a time (MmqTile.fit_k)."""
    return Q(int(tensor.qtype)) in READERS and int(tensor.shape[-1]) % 64 == 0


@dataclass(frozen=True)
class MmqTile:
    """One compiled shape: BN weight rows x BT tokens per workgroup, RM x RT
    sums per invocation ((BN / RM) * (BT / RT) invocations), SUB 32-value
    sub-blocks staged per stage (0: the largest of 8, 4, 2 that fits the
    device's workgroup memory), PREFETCH (0: one buffer, two barriers per
    stage; 1: two buffers, stage n + 1 written while n is multiplied; 2: as 1
    with stage n + 1's global loads in registers across the products),
    UNCHECKED 1: the module compiled without wgpu's runtime checks."""

    BN: int = 128
    BT: int = 64
    RM: int = 4
    RT: int = 8
    SUB: int = 0
    PREFETCH: int = 0
    UNCHECKED: int = 0

    @property
    def invocations(self) -> int:
        return (self.BN // self.RM) * (self.BT // self.RT)

    def shared_bytes(self, sub: int | None = None, extra: int = 0) -> int:
        """Workgroup memory of gemm_mmq.wgsl's tiles: per buffer and sub-block
        32 + 8 bytes per row (int8 lanes, scales) and per token (q, d and s)."""
        sub = self.SUB if sub is None else sub
        return sub * 40 * (self.BN + self.BT) * (2 if self.PREFETCH else 1) + extra

    def resolved(self, dev=None, extra: int = 0) -> MmqTile:
        """This tile checked against the device's limits, with SUB chosen when 0."""
        limits = getattr(dev, "limits", None) or {}
        mem = int(limits.get("max-compute-workgroup-storage-size", 16384))
        inv = int(limits.get("max-compute-invocations-per-workgroup", 256))
        t = self
        if t.SUB == 0:
            t = replace(t, SUB=next((s for s in (8, 4, 2) if t.shared_bytes(s, extra) <= mem), 2))
        ok = (
            t.BN % t.RM == 0 and t.BT % t.RT == 0 and t.RM % 2 == 0 and t.SUB in (2, 4, 8)
            and 32 <= t.invocations <= inv and t.shared_bytes(None, extra) <= mem
            and t.PREFETCH in (0, 1, 2) and t.UNCHECKED in (0, 1)
        )
        if not ok:
            raise ValueError(f"bad mmq tile {t}: needs BN % RM == BT % RT == 0, RM even, SUB 2, 4 or 8, "
                             f"32..{inv} invocations, at most {mem} bytes of workgroup memory")
        return t

    def fit_k(self, K: int) -> MmqTile:
        """This (resolved) tile staging a number of sub-blocks that divides a row of K values: the
        largest of SUB, 4, 2 that does (K % 64 == 0, so 2 always does)."""
        return replace(self, SUB=next(s for s in (8, 4, 2) if s <= self.SUB and (K // 32) % s == 0))

    @classmethod
    def parse(cls, spec: str) -> MmqTile:
        """'BN,BT,RM,RT[,SUB[,PREFETCH[,UNCHECKED]]]'."""
        return cls(*map(int, spec.split(",")))

    @property
    def spec(self) -> str:
        return ",".join(map(str, (self.BN, self.BT, self.RM, self.RT, self.SUB, self.PREFETCH, self.UNCHECKED)))


# Tiles tried in order for a product: the first that gives at least
# MIN_GROUPS workgroups, else the one giving the most. On the H200 a 4096-row
# matrix at T = 128 made only 64 workgroups of a 128 x 64 tile and ran no
# faster than at T = 4 (1.5 ms for 4096 x 14336). 4 x 8 sums per invocation
# rather than the nibble kernel's best 8 x 4: about 40 fewer registers for the
# staged rows (32 sums either way), so two 256-invocation workgroups may share
# a multiprocessor; an estimate until perf/mmq_bench.py's sweep runs there.
#
# Compiled without wgpu's runtime checks (UNCHECKED 1): on the H200 at T = 512 that took the
# 128 x 64 tile from 11.5 to 57.5 TOPS for Q4_K (46.6 Q6_K, 49.8 Q8_0, 49.9 Q5_0, 55.7 Q4_0)
# against every checked tile of the sweep (7-12 TOPS): perf/h200/mmq-sweep-2026-12-02.json.
# The kernel guards its own tails (tests/gpu/test_mmq_types.py runs odd shapes on it);
# INFR_MMQ_UNCHECKED=0 puts the checks back.
TILES = (MmqTile(128, 64, 4, 8, UNCHECKED=1), MmqTile(64, 64, 4, 4, UNCHECKED=1), MmqTile(64, 32, 4, 2, UNCHECKED=1))


# Grouped expert products where an expert gets few pairs (EXPERT_FEW_MAX_T or fewer on average: at most
# a 64-token tile's worth) may take tiles of their own (INFR_MMQ_EXPERT_FEW; one grouping pass serves both
# products, so gate||up and down alike). None by default: on the H100 through Dawn at 512 tokens (32 pairs
# an expert), 128 x 32 tiles ("128,32,4,4,0,0,1") against the grid rule's 128 x 64 took Gemma 4 26B-A4B's
# pp512 from 5241.5 to 5413.0 / 5396.4 t/s but Qwen3-30B-A3B's from 5733.6 to 5622.0 / 5473.7: its down
# product (Q6_K of 768) was slower, 0.750 vs 0.705 ms a layer (perf/moe_grouped_time.py; perf/README stop 31).
EXPERT_FEW_TILES: tuple = ()
EXPERT_FEW_MAX_T = 48


def _tiles(spec: str) -> tuple[MmqTile, ...]:
    return tuple(MmqTile.parse(s) for s in spec.split())


@dataclass(frozen=True)
class MmqTuning:
    """The kernel's knobs for one device, read once (from_env; device_tuning
    caches one per device): the smallest batch that takes the kernel, the
    tiles tried by grid size (per type where `per_type` names one) and the
    workgroups a tile must give to be taken."""

    min_t: int = MMQ_MIN_T
    tiles: tuple[MmqTile, ...] = TILES
    per_type: tuple[tuple[str, tuple[MmqTile, ...]], ...] = ()  # ("Q6_K", tiles), ...
    min_groups: int = MIN_GROUPS
    expert_few: tuple[MmqTile, ...] = EXPERT_FEW_TILES  # (): the grid rule for those products too (default)
    expert_few_max_t: int = EXPERT_FEW_MAX_T

    @classmethod
    def from_env(cls, env=None) -> MmqTuning:
        """INFR_MMQ_MIN_T (0: never), INFR_MMQ_TILES ("BN,BT,RM,RT[,SUB[,PREFETCH[,UNCHECKED]]] ..."),
        INFR_MMQ_TILES_<TYPE> (one type's list), INFR_MMQ_MIN_GROUPS, INFR_MMQ_UNCHECKED=0|1 (every
        tile), INFR_MMQ_BN / _BT / _RM / _RT / _SUB / _PREFETCH: one tile for every product, and
        INFR_MMQ_EXPERT_FEW (tiles of grouped expert products of few pairs an expert, as INFR_MMQ_TILES:
        UNCHECKED, the seventh field, 1 for the unchecked module the defaults use; "none": none, the
        default). The one-tile pins leave expert_few alone."""
        env = os.environ if env is None else env
        get = lambda k: env.get(f"INFR_MMQ_{k}") or None
        t = cls()
        if get("MIN_T") is not None:
            t = replace(t, min_t=int(get("MIN_T")) if int(get("MIN_T")) > 0 else 1 << 30)
        if get("MIN_GROUPS") is not None:
            t = replace(t, min_groups=int(get("MIN_GROUPS")))
        if get("TILES"):
            t = replace(t, tiles=_tiles(get("TILES")))
        pins = {k: int(get(k)) for k in ("BN", "BT", "RM", "RT", "SUB", "PREFETCH") if get(k) is not None}
        if pins:
            t = replace(t, tiles=(replace(t.tiles[0], **pins),))
        t = replace(t, per_type=tuple(sorted((Q[k[len("INFR_MMQ_TILES_"):].upper()].name, _tiles(v))
                                             for k, v in env.items() if k.startswith("INFR_MMQ_TILES_") and v)))
        if get("EXPERT_FEW"):
            t = replace(t, expert_few=() if get("EXPERT_FEW") == "none" else _tiles(get("EXPERT_FEW")))
        if get("UNCHECKED") in ("0", "1"):
            t = t.map_tiles(lambda tile: replace(tile, UNCHECKED=int(get("UNCHECKED"))))
        return t

    def map_tiles(self, f) -> MmqTuning:
        return replace(self, tiles=tuple(map(f, self.tiles)), expert_few=tuple(map(f, self.expert_few)),
                       per_type=tuple((n, tuple(map(f, ts))) for n, ts in self.per_type))

    def tiles_for(self, qtype) -> tuple[MmqTile, ...]:
        name = Q(int(qtype)).name
        return next((ts for n, ts in self.per_type if n == name), self.tiles)

    def expert_tile_for(self, dev, qtype, n_out: int, A: int, E: int, pair: bool = False) -> MmqTile:
        """The tile of a grouped expert product of A pairs over E experts: at most expert_few_max_t
        pairs an expert, the first of expert_few that fits the device; else tile_for's over the A pairs."""
        if -(-A // E) <= self.expert_few_max_t:
            for tile in self.expert_few:
                try:
                    return tile.resolved(dev, READERS.get(Q(int(qtype)), 0))
                except ValueError:  # does not fit this device
                    continue
        return self.tile_for(dev, qtype, n_out, A, pair)

    def tile_for(self, dev, qtype, n_out: int, T: int, pair: bool = False) -> MmqTile:
        """The tile for n_out output rows x T tokens of `qtype`: the first of
        tiles_for(qtype) that fits the device and gives min_groups workgroups,
        else the fitting one giving the most (on a tie the later, smaller one)."""
        best, best_groups = None, -1
        for tile in self.tiles_for(qtype):
            try:
                t = tile.resolved(dev, READERS.get(Q(int(qtype)), 0))
            except ValueError:  # does not fit this device
                continue
            groups = -(-n_out // (t.BN // 2 if pair else t.BN)) * -(-T // t.BT)
            if groups >= self.min_groups:
                return t
            if groups >= best_groups:
                best, best_groups = t, groups
        if best is None:
            raise ValueError(f"no mmq tile of {self.tiles_for(qtype)} fits this device")
        return best


_DEFAULT: list[MmqTuning] = []


def device_tuning(dev=None) -> MmqTuning:
    """The device's tuning: one set_tuning gave it, else the process's (infr.gpu.tuning)."""
    t = getattr(dev, "_mmq_tuning", None) if dev is not None else (_DEFAULT[0] if _DEFAULT else None)
    return t if t is not None else TU.current().mmq


def set_tuning(dev, tuning: MmqTuning | None) -> MmqTuning | None:
    """Give the device a tuning of its own (None: the process's again);
    returns the one it had. For benchmarks and tests."""
    old = getattr(dev, "_mmq_tuning", None) if dev is not None else (_DEFAULT[0] if _DEFAULT else None)
    if dev is None:
        _DEFAULT[:] = [tuning] if tuning is not None else []
    else:
        setattr(dev, "_mmq_tuning", tuning)
    return old


def min_tokens(dev=None) -> int:
    """The smallest batch that takes the kernel (INFR_MMQ_MIN_T; 0 there: never)."""
    return device_tuning(dev).min_t


def use_mmq(T: int, dev=None, tensor=None, q8: bool | None = None, pair: bool = False) -> bool:
    """Whether a batch of T tokens times `tensor` (None: the batch size alone)
    runs this kernel on `dev`: a type with a reader in a matmul that multiplies
    rounded activations (q8: as the plan marks it, MatMul.q8, which the CPU
    reference follows too; None: takes_q8 of the tensor's type, for callers
    with a bare tensor), in batches of min_t tokens or more, on every adapter
    (on lavapipe Q4_K beat the f32 GEMM that runs batches there at T = 16 and
    64 alike; on the H200 the GEMV wins below 32 tokens). `pair`: a gate||up pair, which takes the
    tensor cores from fewer rows than plain products do (kernels_mma.keeps_gemv)."""
    if tensor is not None and not (applies(tensor) and (takes_q8(tensor.qtype) if q8 is None else q8)):
        return False
    if tensor is not None and KMA.keeps_gemv(dev, T, pair, int(tensor.shape[-1])):  # batched decode's products
        return False
    return T >= min_tokens(dev)


def mmq_pipeline(kernels: Kernels, qtype, tile: MmqTile | KMA.MmaTile, pair_act: str | None = None,
                 split: bool = False, expert: bool = False, K: int | None = None):
    """(the compiled kernel for `qtype`: plain, gate||up with `pair_act` or
    the q|k|v split; the output rows and the tokens one workgroup covers).
    An MmaTile builds the tensor-core kernel (kernels_mma) on the same bindings. `expert`: tiles
    of pairs routed to one expert of a bank (kernels_moe's grouped path). `K`: the
    rows' width, which the stages must divide (None: the tile's as resolved)."""
    if isinstance(tile, KMA.MmaTile):
        if K is not None and K % (32 * tile.SUB):
            raise ValueError(f"tensor-core tile {tile.spec} stages {32 * tile.SUB} values; rows of {K} are not whole stages")
        return KMA.pipeline(kernels, KM.wgsl_name(qtype), tile, pair_act, split, expert=expert)
    t = tile.resolved(kernels.dev, READERS[Q(int(qtype))])
    if K is not None:
        t = t.fit_k(K)
    pair = pair_act is not None
    consts = {
        "QTYPE": KM.wgsl_name(qtype), "BN": t.BN, "BT": t.BT, "RM": t.RM, "RT": t.RT, "SUB": t.SUB,
        "PREFETCH": t.PREFETCH, "NB": 2 if t.PREFETCH else 1,
        "SWR": 7 if (t.BN // t.RM) % 8 == 0 else 0, "SWT": 7 if (t.BT // t.RT) % 8 == 0 else 0,
        "PAIR": str(pair).lower(), **KM.pair_act_consts(pair_act),
        **KM.tile_reader_consts(pair, split),
        "EXPERT": "// #include mmq_expert_on" if expert else "// #include mmq_expert_off",
        "TOKENS_FIRST": str(TU.current().gemm_tokens_first == 1 and not expert).lower(),
    }
    pipe = kernels.pipeline("gemm_mmq", "main", unchecked=bool(t.UNCHECKED), **consts)
    return pipe, (t.BN // 2 if pair else t.BN), t.BT


def token_rows(kernels: Kernels, xq, K: int, T: int, bt: int) -> tuple[Dispatch, object]:
    """The dispatch writing xq's T rounded rows as f16 values (wgsl/q8_f16.wgsl) into the device's
    f16 scratch, T rounded up to bt rows, and that scratch: the token rows an XC tensor-core tile
    (kernels_mma.MmaTile.XC) copies. It precedes its product in the same ordered pass."""
    rows = -(-T // bt) * bt
    buf = KQ._buffer(kernels, "f16", 2 * rows * K)
    pipe = kernels.pipeline("q8_f16", "main")
    p = storage(kernels.dev, np.array([K, T, rows, KQ.words(K) // 4], np.uint32), label="q8_f16.params", uniform=True)
    return Dispatch(pipe, kernels.bind(pipe, [p, xq, buf]), (-(-K // 4096), rows, 1), f"q8_f16 {K}"), buf


def dequant_pipeline(kernels: Kernels, q, pair: bool, direct: bool = False):
    """wgsl/mma_dequant.wgsl for type q, a plain matrix or a gate||up pair; `direct`: its units turned into f16 by
    mma_direct_TYPE.wgsl (kernels_mma.DIRECT_TYPES), as WC 3 tiles do (to check that conversion anywhere)."""
    name = KM.wgsl_name(q)
    if direct and name not in KMA.DIRECT_TYPES:
        raise UnsupportedError(f"no direct conversion of {name} units (kernels_mma.DIRECT_TYPES)")
    return kernels.pipeline("mma_dequant", "main", unchecked=True, QTYPE=name, PAIR=str(pair).lower(),
                            DIRECT=str(direct).lower(), DIRECT_FNS=f"mma_direct_{name}" if direct else "mma_direct_none",
                            **KM.tile_reader_consts(pair), **KM.pair_act_consts(None))


def weight_rows(kernels: Kernels, q, p, bufs: list, K: int, rows: int, direct: bool = False) -> tuple[Dispatch, object]:
    """The dispatch writing a chunk's `rows` weight rows (bufs: [w] or a pair's [gate, up]; `p` the
    product's params) as f16 values (wgsl/mma_dequant.wgsl) into the device's f16 weight scratch, and
    that scratch: the weight rows a WC tensor-core tile copies, each half padded to 128 rows."""
    pair = len(bufs) == 2
    padded = -(-rows // 128) * 128
    buf = KQ._buffer(kernels, "w16", 2 * K * padded * len(bufs))
    pipe = dequant_pipeline(kernels, q, pair, direct)
    res = [p, bufs[0]] + [None] * 4 + [bufs[1] if pair else None] + [None] * 6 + [buf]
    groups = (padded // (32 if pair else 64), -(-K // 512), 1)
    return Dispatch(pipe, kernels.bind(pipe, res), groups, f"mma_dequant_{KM.wgsl_name(q)} {rows}x{K}",
                    len(bufs) * rows * KM.row_bytes(q, K)), buf


def _copies(tile) -> tuple[bool, bool]:
    """Whether a tile copies f16 token rows (XC) and f16 weight rows (WC)."""
    return (bool(tile.XC), tile.WC in (1, 2)) if isinstance(tile, KMA.MmaTile) else (False, False)


def _token_pass(kernels: Kernels, tile, xq, K: int, T: int, bt: int, extra: dict) -> list[Dispatch]:
    """An XC tile's token_rows pass ([] for other tiles), its scratch put at binding 12 of `extra`."""
    if not _copies(tile)[0]:
        return []
    d, extra[12] = token_rows(kernels, xq, K, T, bt)
    return [d]


def _weight_pass(kernels: Kernels, tile, q, p, bufs: list, K: int, rows: int, extra: dict) -> list[Dispatch]:
    """A WC tile's weight_rows pass for one chunk ([] for other tiles), its scratch at binding 13 of `extra`."""
    if not _copies(tile)[1]:
        return []
    d, extra[13] = weight_rows(kernels, q, p, bufs, K, rows)
    return [d]


def _with(res: list, extra: dict) -> list:
    """Bindings `res` with `extra` {binding: buffer} past them."""
    if not extra:
        return res
    out = list(res) + [None] * (max(extra) + 1 - len(res))
    for i, b in extra.items():
        out[i] = b
    return out


def _params(q, K: int, rows: int, row0: int, N_out: int, T: int, bias: bool, resid: bool, split1=0, split2=0):
    return KM.params_matmul(K, rows, row0, KM.row_bytes(q, K), KQ.words(K) // 4, N_out, bias, T, resid,
                            split1, split2)


def _check(w, K: int) -> Q:
    if not applies(w):
        raise ValueError(f"mmq multiplies {'/'.join(q.name for q in READERS)} rows of whole 64-value groups, "
                         f"not {Q(int(w.qtype)).name} K={K}")
    return Q(int(w.qtype))


def _tile(kernels: Kernels, q, n_out: int, T: int, pair: bool = False, K: int = 0,
          w16_rows: int = 0, direct: bool = True) -> MmqTile | KMA.MmaTile:
    """The tensor-core tile where the device has one (kernels_mma), else the int8 GEMM's. A WC tile's
    f16 weight rows (each half padded to 128; `w16_rows` where a mixed stack writes more) must fit one binding;
    `direct` False: no tile converting one type's units (WC 3)."""
    w16 = 2 * K * (w16_rows or -(-n_out // 128) * 128) * (2 if pair else 1)
    mma = KMA.tile_for(kernels.dev, n_out, T, READERS[Q(int(q))], pair, w16_bytes=w16, K=K,
                       qtype=KM.wgsl_name(q) if direct else None)
    if mma is not None:
        return mma
    return device_tuning(kernels.dev).tile_for(kernels.dev, q, n_out, T, pair)


def mmq_dispatches(kernels: Kernels, w, chunks, xq, y, bias, T: int, resid=None, y_stride: int | None = None,
                   tile: MmqTile | None = None) -> list[Dispatch]:
    """y[t] = W @ x[t] (+ bias) (+ resid[t]) for t < T, one dispatch per weight
    chunk; `xq` holds x rounded (kernels_q8: quantize_dispatch or rmsnorm_q8),
    `chunks` is upload_weight's list, `resid` laid out like y (not y itself)."""
    K, N = int(w.shape[-1]), int(w.shape[0])
    q = _check(w, K)
    if sum(rows for _, _, rows in chunks) != N:
        raise ValueError(f"weight chunks hold {sum(r for _, _, r in chunks)} rows, expected {N}")
    tile = tile or _tile(kernels, q, max(r for _, _, r in chunks), T, K=K)
    pipe, rows_wg, bt = mmq_pipeline(kernels, q, tile, K=K)
    none = KM._no_bias(kernels)
    rb = KM.row_bytes(q, K)
    extra: dict = {}
    out = _token_pass(kernels, tile, xq, K, T, bt, extra)
    for buf, row0, rows in chunks:
        p = storage(kernels.dev, _params(q, K, rows, row0, y_stride or N, T, bias is not None, resid is not None),
                    label="mmq.params", uniform=True)
        out += _weight_pass(kernels, tile, q, p, [buf], K, rows, extra)
        bind = kernels.bind(pipe, _with([p, buf, xq, y, bias if bias is not None else none,
                                         resid if resid is not None else none], extra))
        groups = (-(-rows // rows_wg), -(-T // bt), 1)
        out.append(Dispatch(pipe, bind, groups, f"mmq_{KM.wgsl_name(q)} {N}x{K}", groups[1] * rows * rb))
    return out


def can_pair(wg, wu, chunks_g, chunks_u) -> bool:
    """Gate and up of one mmq type and shape, uploaded in the same row chunks."""
    return (
        applies(wg) and Q(int(wg.qtype)) == Q(int(wu.qtype)) and tuple(wg.shape) == tuple(wu.shape)
        and [(r0, n) for _, r0, n in chunks_g] == [(r0, n) for _, r0, n in chunks_u]
    )


def pairs_act(kernels: Kernels, wg, chunks_g, T: int, act) -> bool:
    """Whether the pair tile for this batch applies `act`: all of them do but gemma4's table GELU on
    the tensor cores, which waits for a GPU run (kernels_mma.MmaTuning.table_pair, INFR_MMA_TABLE_PAIR=1)."""
    if getattr(act, "value", act) != "gelu_f16" or TU.current().mma.table_pair:
        return True
    return not isinstance(_tile(kernels, wg.qtype, max(r for _, _, r in chunks_g), T, pair=True,
                                  K=int(wg.shape[-1])), KMA.MmaTile)


def gate_up_dispatches(kernels: Kernels, wg, wu, chunks_g, chunks_u, xq, y, act, T: int,
                       tile: MmqTile | None = None) -> list[Dispatch] | None:
    """y[t] = act(Wg @ x[t]) * (Wu @ x[t]) in one dispatch per chunk pair, or
    None where the pair cannot be fused (can_pair, pairs_act)."""
    if not can_pair(wg, wu, chunks_g, chunks_u) or (tile is None and not pairs_act(kernels, wg, chunks_g, T, act)):
        return None
    K, N = int(wg.shape[-1]), int(wg.shape[0])
    q = Q(int(wg.qtype))
    tile = tile or _tile(kernels, q, max(r for _, _, r in chunks_g), T, pair=True, K=K)
    pipe, rows_wg, bt = mmq_pipeline(kernels, q, tile, pair_act=getattr(act, "value", act), K=K)
    none = KM._no_bias(kernels)
    rb = KM.row_bytes(q, K)
    extra: dict = {}
    out = _token_pass(kernels, tile, xq, K, T, bt, extra)
    for (bg, row0, rows), (bu, _, _) in zip(chunks_g, chunks_u):
        p = storage(kernels.dev, _params(q, K, rows, row0, N, T, False, False), label="mmq.gate_up.params",
                    uniform=True)
        out += _weight_pass(kernels, tile, q, p, [bg, bu], K, rows, extra)
        groups = (-(-rows // rows_wg), -(-T // bt), 1)
        bind = kernels.bind(pipe, _with(KM.pair_resources(kernels, [p, bg, xq, y, none, none, bu], act), extra))
        out.append(Dispatch(pipe, bind, groups, f"mmq_{KM.wgsl_name(q)}_gate_up {N}x{K}", 2 * groups[1] * rows * rb))
    return out


def stacked_dispatches(kernels: Kernels, tensors, chunks, xq, ys, bias, T: int,
                       tile: MmqTile | None = None) -> list[Dispatch]:
    """ys[i][t] = W_i @ x[t] (+ bias) for matrices uploaded stacked (kernels_matmul.upload_stacked) in
    one dispatch; `bias` holds every matrix's rows (zeros where one has none) or is None. Matrices of
    one type, or of several (a Q4_K_M layer's Q6_K v) on a tile copying f16 weight rows (mixed_tile)."""
    K = int(tensors[0].shape[-1])
    q = _check(tensors[0], K)
    if any(int(t.shape[-1]) != K for t in tensors):
        raise ValueError("stacked mmq matrices need one K")
    if KM.is_mixed(tensors):
        return _mixed_stacked(kernels, tensors, chunks, xq, ys, bias, T, tile)
    sizes = [int(t.shape[0]) for t in tensors]
    N = sum(sizes)
    split1 = sizes[0]
    split2 = sizes[0] + sizes[1] if len(sizes) == 3 else N
    tile = tile or _tile(kernels, q, N, T, K=K)
    pipe, rows_wg, bt = mmq_pipeline(kernels, q, tile, split=True, K=K)
    (buf, _, _), = chunks
    none = KM._no_bias(kernels)
    p = storage(kernels.dev, _params(q, K, N, 0, N, T, bias is not None, False, split1, split2),
                label="mmq.qkv.params", uniform=True)
    # Outputs a two-matrix stack lacks get a buffer of their own: a writable binding may not alias `none`.
    outs = list(ys) + [storage(kernels.dev, 16, label="mmq.no_output") for _ in range(3 - len(ys))]
    extra: dict = {}
    pre = _token_pass(kernels, tile, xq, K, T, bt, extra) + _weight_pass(kernels, tile, q, p, [buf], K, N, extra)
    bind = kernels.bind(pipe, _with([p, buf, xq, outs[0], bias if bias is not None else none, none, outs[1], outs[2]],
                                    extra))
    groups = (-(-N // rows_wg), -(-T // bt), 1)
    label = f"mmq_{KM.wgsl_name(q)}_stacked {'+'.join(map(str, sizes))}x{K}"
    return pre + [Dispatch(pipe, bind, groups, label, groups[1] * N * KM.row_bytes(q, K))]


# A mixed stack (Q4_K q, k and a Q6_K v: a third of a Q4_K_M file's layers) as one product. A tile copying
# f16 weight rows (WC) never reads blocks itself: each matrix's rows are dequantized by its own type's
# mma_dequant pass into its place of one f16 buffer, in the single-type stack's layout (row r of the stack
# at r K, the stack padded to 128 rows), and one kernel with the q|k|v split multiplies them all: one
# token pass and one grid of 128-row tiles, where three products each had their own passes and the
# 1024-row k and v filled few workgroups.


def _mixed_rows(sizes: list[int]) -> tuple[list[int], list[int], int]:
    """A mixed stack's f16 rows: (each matrix's first row, the rows its pass writes, the buffer's rows).
    mma_dequant writes whole 64-row workgroups (rows past a matrix's own copy its last): a pass may run
    into the next matrix's rows, which that matrix's pass, later in the same pass, writes over; the last
    writes on to the stack's 128-row padding."""
    offs = [sum(sizes[:i]) for i in range(len(sizes))]
    padded = -(-sum(sizes) // 128) * 128
    rows = [-(-n // 64) * 64 for n in sizes[:-1]] + [-(-(padded - offs[-1]) // 64) * 64]
    return offs, rows, max([padded] + [o + r for o, r in zip(offs, rows)])


def mixed_tile(kernels: Kernels, tensors, T: int) -> KMA.MmaTile | None:
    """The tile of a mixed stack's one product (stacked_dispatches), or None where the stack keeps a
    product per matrix: a type without a reader, no tensor-core tile copying f16 weight rows for the
    stacked rows (WC 0: it would read the blocks as its one QTYPE; mmq's int8 tiles; batches below
    wc_min_t), or a matrix's f16 rows not on a storage offset boundary (its pass binds a view there)."""
    K = int(tensors[0].shape[-1])
    if not TU.current().mma.mixed or not all(applies(t) for t in tensors):
        return None
    if len({int(t.shape[-1]) for t in tensors}) != 1:
        return None
    offs, _, rows = _mixed_rows([int(t.shape[0]) for t in tensors])
    if any(2 * K * o % KM.STACK_ALIGN for o in offs):
        return None
    tile = _tile(kernels, tensors[0].qtype, sum(int(t.shape[0]) for t in tensors), T, K=K, w16_rows=rows,
                 direct=False)  # its rows are of several types: a tile reading f16 rows, not one type's units
    return tile if _copies(tile)[1] else None


def mixed_weight_rows(kernels: Kernels, tensors, chunks) -> tuple[list[Dispatch], object]:
    """A mixed stack's f16 weight rows: a dequant pass per matrix (its rows a view of the stacked upload,
    its f16 rows a view of the scratch at its first row), and that scratch, in the single-type stack's
    layout (_mixed_rows)."""
    K = int(tensors[0].shape[-1])
    qs = [_check(t, K) for t in tensors]
    sizes = [int(t.shape[0]) for t in tensors]
    offs, rows, total = _mixed_rows(sizes)
    if any(2 * K * o % KM.STACK_ALIGN for o in offs):
        raise ValueError(f"f16 rows of {sizes} x {K} do not start on {KM.STACK_ALIGN}-byte boundaries")
    w16 = KQ._buffer(kernels, "w16", 2 * K * total)
    out = []
    for q, n, o, r, part in zip(qs, sizes, offs, rows, KM.stack_parts(tensors, chunks)):
        (view, _, _), = part
        p = storage(kernels.dev, _params(q, K, n, 0, n, 1, False, False), label="mmq.qkv.dequant.params", uniform=True)
        dq = dequant_pipeline(kernels, q, False)
        res = [p, view] + [None] * 11 + [(w16, 2 * K * o, 2 * K * r)]
        out.append(Dispatch(dq, kernels.bind(dq, res), (r // 64, -(-K // 512), 1),
                            f"mma_dequant_{KM.wgsl_name(q)} {n}x{K}", n * KM.row_bytes(q, K)))
    return out, w16


def _mixed_stacked(kernels: Kernels, tensors, chunks, xq, ys, bias, T: int, tile) -> list[Dispatch]:
    """stacked_dispatches of a mixed stack: the token pass, a dequant pass per matrix (mixed_weight_rows)
    and one q|k|v product. The
    kernel is compiled for the first matrix's type, whose reader it never runs (WCOPY: no fetch_units;
    INIT only fills the IQ4 code book): binding 1, which it declares, holds the whole upload."""
    tile = tile or mixed_tile(kernels, tensors, T)
    if not _copies(tile)[1]:
        raise ValueError("a stack of several types runs as one product only on a tile copying f16 weight rows (WC)")
    K = int(tensors[0].shape[-1])
    qs = [_check(t, K) for t in tensors]
    sizes = [int(t.shape[0]) for t in tensors]
    N = sum(sizes)
    pipe, rows_wg, bt = mmq_pipeline(kernels, qs[0], tile, split=True, K=K)
    (buf, _, _), = chunks
    none = KM._no_bias(kernels)
    extra: dict = {}
    out = _token_pass(kernels, tile, xq, K, T, bt, extra)
    passes, extra[13] = mixed_weight_rows(kernels, tensors, chunks)
    out += passes
    split2 = sizes[0] + sizes[1] if len(sizes) == 3 else N
    p = storage(kernels.dev, _params(qs[0], K, N, 0, N, T, bias is not None, False, sizes[0], split2),
                label="mmq.qkv.params", uniform=True)
    outs = list(ys) + [storage(kernels.dev, 16, label="mmq.no_output") for _ in range(3 - len(ys))]
    bind = kernels.bind(pipe, _with([p, buf, xq, outs[0], bias if bias is not None else none, none, outs[1], outs[2]],
                                    extra))
    groups = (-(-N // rows_wg), -(-T // bt), 1)
    label = f"mmq_{'+'.join(dict.fromkeys(map(KM.wgsl_name, qs)))}_stacked {'+'.join(map(str, sizes))}x{K}"
    nbytes = sum(n * KM.row_bytes(q, K) for q, n in zip(qs, sizes))
    return out + [Dispatch(pipe, bind, groups, label, groups[1] * nbytes)]

"""The Q4_K GEMM on 8-bit activations (wgsl/gemm_q4_k.wgsl, "mmq") for batches of tokens.

The batched GEMV (kernels_matmul) reads every weight once per token; the f32
GEMM (kernels_gemm) reuses weights across tokens but dequantizes them to f32
and multiplies in f32. This kernel does both: a tile of BN weight rows x BT
tokens multiplies the nibbles with the int8 activations of kernels_q8 by
dot4I8Packed, so a prefill reads the weights ceil(T / BT) times and does the
GEMV's integer arithmetic. It reads the same q8 scratch as the GEMV (one
quantize or rmsnorm_q8 feeds q, k, v or gate, up) and the same weight
uploads (row chunks, the stacked q|k|v buffer), with the GEMV's epilogues:
bias, the fused residual add, the q|k|v split and the gate||up pair.

On the H200 it took the synthetic 8B's pp512 from 406 to 1289 t/s and the
1B's from 2746 to 8057 (perf/h200/prefill-mmq-2026-12-01.json).

Selection (use_mmq): Q4_K matrices (K % 256 == 0) in batches of T >= MMQ_MIN_T
tokens, on every adapter (INFR_MMQ_MIN_T overrides; 0 disables the kernel).
On lavapipe it beats the f32 GEMM it replaces there 2.4-2.8x (perf/mmq_bench.py
--scale 4 --T 64 --gemm: 1024x1024 18.8 vs 47.3 ms, the 3584x1024 pair 127 vs
342 ms, 1024x3584 63.6 vs 179 ms). Smaller batches keep their kernels (the
GEMV; on CPU adapters the f32 GEMM from 8 tokens). Tile shape: MmqTuning
(INFR_MMQ_* env overrides).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType as Q

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import Dispatch, Kernels, storage

# Small batches keep the GEMV: the kernel's time barely moves below ~64 tokens
# (too few workgroups, each a long K loop), and on the H200 the GEMV won at 16
# tokens (8B 369 vs 265 t/s, 1B 1861 vs 1151) and lost from 32 (8B 395 vs 523;
# 1B even); perf/h200/prefill-mmq-2026-12-01.json. Decode (T = 1) keeps the GEMV.
MMQ_MIN_T = 32


def min_tokens() -> int:
    """The smallest batch that takes the kernel (INFR_MMQ_MIN_T; 0 there: never)."""
    v = os.environ.get("INFR_MMQ_MIN_T")
    if v is None or v == "":
        return MMQ_MIN_T
    return int(v) if int(v) > 0 else 1 << 30


def applies(tensor) -> bool:
    """A matrix the kernel multiplies: Q4_K, whole 256-value blocks per row."""
    return Q(int(tensor.qtype)) == Q.Q4_K and int(tensor.shape[-1]) % 256 == 0


def use_mmq(T: int, dev=None, tensor=None) -> bool:
    """Whether a batch of T tokens times `tensor` (None: any Q4_K matrix) runs
    this kernel on `dev`. The same rule on every adapter: on lavapipe it beat
    the f32 GEMM that runs batches there at T = 16 and 64 alike, and the GEMV
    2.5-5x at T = 64 (module docstring); on the H200 the GEMV wins below 32
    tokens (MMQ_MIN_T). `dev` is unused: the place for a per-adapter rule."""
    if tensor is not None and not applies(tensor):
        return False
    return T >= min_tokens()


@dataclass(frozen=True)
class MmqTuning:
    """Tile of BN weight rows x BT tokens, RM x RT sums per invocation
    ((BN / RM) * (BT / RT) invocations), SUB 32-value sub-blocks staged per
    barrier pair (8: a whole block; 4: half; 0: the largest that fits the
    device's workgroup memory), PREFETCH 1: the next stage's global loads
    issued into registers before this stage's products (more registers).
    INFR_MMQ_BN / _BT / _RM / _RT / _SUB / _PREFETCH override.

    On the H200 (perf/mmq_bench.py, the 8B shapes at T = 512,
    perf/h200/mmq-bench-2026-12-01.json) 128 x 64 with 8 x 4 sums and whole
    blocks per stage ran at 19-20 TFLOP/s, 64 x 64 with 4 x 4 at 16-18, 128 x 128
    at 15-18; PREFETCH lost 1-10 %. A device with less workgroup memory than
    the 128-row tile's half-block stages (22.5 KB) takes 64 x 64 (16 KB)."""

    BN: int = 128
    BT: int = 64
    RM: int = 8
    RT: int = 4
    SUB: int = 0
    PREFETCH: int = 0

    @property
    def invocations(self) -> int:
        return (self.BN // self.RM) * (self.BT // self.RT)

    def shared_bytes(self, sub: int) -> int:
        """Workgroup memory of gemm_q4_k.wgsl's tiles (its unused `partial` is not counted by wgpu)."""
        return sub * (24 * self.BN + 40 * self.BT)

    @classmethod
    def for_device(cls, dev=None) -> MmqTuning:
        env = {k: int(os.environ[f"INFR_MMQ_{k}"]) for k in ("BN", "BT", "RM", "RT", "SUB", "PREFETCH")
               if os.environ.get(f"INFR_MMQ_{k}")}
        limits = getattr(dev, "limits", None) or {}
        mem = int(limits.get("max-compute-workgroup-storage-size", 16384))
        if "BN" not in env and "RM" not in env and cls().shared_bytes(4) > mem:
            env.update(BN=64, RM=4)  # the smaller tile fits WebGPU's default 16 KB
        return cls(**env).resolved(dev)

    def resolved(self, dev=None) -> MmqTuning:
        """This tuning checked against the device's limits, with SUB chosen when 0."""
        limits = getattr(dev, "limits", None) or {}
        mem = int(limits.get("max-compute-workgroup-storage-size", 16384))
        inv = int(limits.get("max-compute-invocations-per-workgroup", 256))
        t = self
        if t.SUB == 0:
            t = replace(t, SUB=8 if t.shared_bytes(8) <= mem else 4)
        ok = (
            t.BN % t.RM == 0 and t.BT % t.RT == 0 and t.RM % 2 == 0 and t.SUB in (4, 8)
            and 32 <= t.invocations <= inv and t.shared_bytes(t.SUB) <= mem and t.PREFETCH in (0, 1)
        )
        if not ok:
            raise ValueError(f"bad mmq tuning {t}: needs BN % RM == BT % RT == 0, RM even, SUB 4 or 8, "
                             f"32..{inv} invocations, at most {mem} bytes of workgroup memory")
        return t


# Tiles tried in order for a product (kernels from the H200 sweep): the first
# that gives at least MIN_GROUPS workgroups, else the one giving the most. On
# the H200 a 4096-row matrix at T = 128 made only 64 workgroups of the 128 x 64
# tile and ran no faster than at T = 4 (1.5 ms for 4096 x 14336).
TILES = ((128, 64, 8, 4), (64, 64, 4, 4), (64, 32, 4, 2))
MIN_GROUPS = 256


def tuning_for(kernels: Kernels, n_out: int, T: int, pair: bool = False) -> MmqTuning:
    """The tile for n_out output rows x T tokens: INFR_MMQ_* when set, else from TILES."""
    if any(os.environ.get(f"INFR_MMQ_{k}") for k in ("BN", "BT", "RM", "RT")):
        return MmqTuning.for_device(kernels.dev)
    best, best_groups = None, -1
    for bn, bt, rm, rt in TILES:
        try:
            t = replace(MmqTuning.for_device(kernels.dev), BN=bn, BT=bt, RM=rm, RT=rt, SUB=0).resolved(kernels.dev)
        except ValueError:  # does not fit this device
            continue
        groups = -(-n_out // (bn // 2 if pair else bn)) * -(-T // bt)
        if groups >= MIN_GROUPS:
            return t
        if groups >= best_groups:  # on a tie the smaller tile: less of it idle
            best, best_groups = t, groups
    if best is None:
        raise ValueError("no mmq tile fits this device")
    return best


def mmq_pipeline(kernels: Kernels, pair_act: str | None = None, split: bool = False, tuning: MmqTuning | None = None):
    """(the compiled kernel: plain, gate||up with `pair_act` or the q|k|v split;
    the output rows and the tokens one workgroup covers)."""
    t = tuning or MmqTuning.for_device(kernels.dev)  # read at each graph build: the env knobs can change
    pair = pair_act is not None
    consts = {
        "BN": t.BN, "BT": t.BT, "RM": t.RM, "RT": t.RT, "SUB": t.SUB, "PREFETCH": str(bool(t.PREFETCH)).lower(),
        "PAIR": str(pair).lower(), "GELU": str(pair_act == "gelu").lower(),
        "W2": "@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;" if pair else "",
        "W2_LOAD": "if (slot == 1u) { return w2[i]; }" if pair else "",
        "SPLIT_DECL": "// #include gemv_split" if split else "", "STORE": "store_split" if split else "store_row",
    }
    return kernels.pipeline("gemm_q4_k", "main", **consts), (t.BN // 2 if pair else t.BN), t.BT


def _params(K: int, rows: int, row0: int, N_out: int, T: int, bias: bool, resid: bool, split1=0, split2=0):
    rb = KM.row_bytes(Q.Q4_K, K)
    return KM.params_matmul(K, rows, row0, rb, KQ.words(K) // 4, N_out, bias, T, resid, split1, split2)


def mmq_dispatches(kernels: Kernels, w, chunks, xq, y, bias, T: int, resid=None, y_stride: int | None = None,
                   tuning: MmqTuning | None = None) -> list[Dispatch]:
    """y[t] = W @ x[t] (+ bias) (+ resid[t]) for t < T, one dispatch per weight
    chunk; `xq` holds x rounded (kernels_q8: quantize_dispatch or rmsnorm_q8),
    `chunks` is upload_weight's list, `resid` laid out like y (not y itself)."""
    K, N = int(w.shape[-1]), int(w.shape[0])
    if not applies(w):
        raise ValueError(f"mmq multiplies Q4_K rows of whole 256-value blocks, not {Q(int(w.qtype)).name} K={K}")
    if sum(rows for _, _, rows in chunks) != N:
        raise ValueError(f"weight chunks hold {sum(r for _, _, r in chunks)} rows, expected {N}")
    pipe, rows_wg, bt = mmq_pipeline(kernels, tuning=tuning or tuning_for(kernels, max(r for _, _, r in chunks), T))
    none = KM._no_bias(kernels)
    rb = KM.row_bytes(Q.Q4_K, K)
    out = []
    for buf, row0, rows in chunks:
        p = storage(kernels.dev, _params(K, rows, row0, y_stride or N, T, bias is not None, resid is not None),
                    label="mmq.params", uniform=True)
        bind = kernels.bind(pipe, [p, buf, xq, y, bias if bias is not None else none,
                                   resid if resid is not None else none])
        groups = (-(-rows // rows_wg), -(-T // bt), 1)
        out.append(Dispatch(pipe, bind, groups, f"mmq_q4_k {N}x{K}", groups[1] * rows * rb))
    return out


def gate_up_dispatches(kernels: Kernels, wg, wu, chunks_g, chunks_u, xq, y, act, T: int,
                       tuning: MmqTuning | None = None) -> list[Dispatch] | None:
    """y[t] = act(Wg @ x[t]) * (Wu @ x[t]) in one dispatch per chunk pair, or
    None where the pair cannot be fused (kernels_matmul.can_fuse_gate_up)."""
    if not (applies(wg) and KM.can_fuse_gate_up(wg, wu, chunks_g, chunks_u)):
        return None
    K, N = int(wg.shape[-1]), int(wg.shape[0])
    pipe, rows_wg, bt = mmq_pipeline(kernels, pair_act=getattr(act, "value", act),
                                     tuning=tuning or tuning_for(kernels, max(r for _, _, r in chunks_g), T, pair=True))
    none = KM._no_bias(kernels)
    rb = KM.row_bytes(Q.Q4_K, K)
    out = []
    for (bg, row0, rows), (bu, _, _) in zip(chunks_g, chunks_u):
        p = storage(kernels.dev, _params(K, rows, row0, N, T, False, False), label="mmq.gate_up.params", uniform=True)
        groups = (-(-rows // rows_wg), -(-T // bt), 1)
        bind = kernels.bind(pipe, [p, bg, xq, y, none, none, bu])
        out.append(Dispatch(pipe, bind, groups, f"mmq_q4_k_gate_up {N}x{K}", 2 * groups[1] * rows * rb))
    return out


def stacked_dispatches(kernels: Kernels, tensors, chunks, xq, ys, bias, T: int,
                       tuning: MmqTuning | None = None) -> list[Dispatch]:
    """ys[i][t] = W_i @ x[t] (+ bias) for matrices uploaded stacked
    (kernels_matmul.upload_stacked) in one dispatch; `bias` holds every
    matrix's rows (zeros where one has none) or is None."""
    K = int(tensors[0].shape[-1])
    sizes = [int(t.shape[0]) for t in tensors]
    N = sum(sizes)
    split1 = sizes[0]
    split2 = sizes[0] + sizes[1] if len(sizes) == 3 else N
    pipe, rows_wg, bt = mmq_pipeline(kernels, split=True, tuning=tuning or tuning_for(kernels, N, T))
    (buf, _, _), = chunks
    none = KM._no_bias(kernels)
    p = storage(kernels.dev, _params(K, N, 0, N, T, bias is not None, False, split1, split2),
                label="mmq.qkv.params", uniform=True)
    # Outputs a two-matrix stack lacks get a buffer of their own: a writable binding may not alias `none`.
    outs = list(ys) + [storage(kernels.dev, 16, label="mmq.no_output") for _ in range(3 - len(ys))]
    bind = kernels.bind(pipe, [p, buf, xq, outs[0], bias if bias is not None else none, none, outs[1], outs[2]])
    groups = (-(-N // rows_wg), -(-T // bt), 1)
    label = f"mmq_q4_k_stacked {'+'.join(map(str, sizes))}x{K}"
    return [Dispatch(pipe, bind, groups, label, groups[1] * N * KM.row_bytes(Q.Q4_K, K))]

"""Weights on the GPU and the prebuilt dispatches of the GEMV/GEMM and embedding kernels.

Weights are uploaded once, in their GGUF block layout (never expanded), as a
list of row chunks: a chunk holds whole rows, fits one storage binding and has
few enough rows that `ceil(rows / ROWS_PER_WG)` workgroups fit one dispatch
dimension. The matmul of a chunked weight is one dispatch per chunk, each
writing its own column range of `y` (the embedding lookup over such chunks:
kernels_embed). See docs/gpu_kernels.md.

Params packers return the exact bytes of the WGSL `Params` struct: fields in
declaration order, u32 / f32 little-endian, zero-padded to a multiple of 16.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from infr.errors import UnsupportedError
from infr.numerics import Q8_ACTIVATIONS, gelu_f16_table
from infr.gpu import kernels_gemv_float as KGF
from infr.gpu import kernels_norm_in as KN
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning as TU
from infr.gpu.device import Device
from infr.gpu.runtime import Dispatch, Kernels, storage

# Types with a wgsl/quant_TYPE.wgsl reader.
GPU_TYPES = frozenset(
    {
        Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
        Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
    }
)
# The float readers decode a few values per call (one 16-byte load), not one;
# their QK differs from ggml's block size of 1. Must match the WGSL constants.
_FLOAT_BLOCKS = {Q.F32: (4, 16), Q.F16: (8, 16), Q.BF16: (8, 16)}

MATMUL_WG = 64
# Rows per matmul workgroup. With 64 threads that is a team of 16 per row: a
# 1024-wide Q4_K row is 4 blocks, a 4096-wide one 16, so teams stay busy on
# the short rows of small models without idling on long ones.
_ROWS_PER_WG = 4


def as_qtype(qtype) -> Q:
    """GGMLQuantizationType from the enum, its name ("q4_k", "Q4_K") or its number."""
    if isinstance(qtype, Q):
        q = qtype
    elif isinstance(qtype, str):
        try:
            q = Q[qtype.upper()]
        except KeyError:
            raise UnsupportedError(f"unknown quantization type {qtype!r}") from None
    else:
        q = Q(int(qtype))
    if q not in GPU_TYPES:
        names = ", ".join(sorted(t.name for t in GPU_TYPES))
        raise UnsupportedError(f"no GPU kernel for {q.name} weights; supported: {names}")
    return q


def wgsl_name(qtype) -> str:
    return as_qtype(qtype).name.lower()


def block_shape(qtype) -> tuple[int, int]:
    """(values per block, bytes per block) as the WGSL reader defines QK and BLOCK_BYTES."""
    q = as_qtype(qtype)
    return _FLOAT_BLOCKS.get(q) or tuple(GGML_QUANT_SIZES[q])


def row_bytes(qtype, K: int) -> int:
    qk, nbytes = block_shape(qtype)
    if K % qk:
        raise UnsupportedError(f"{as_qtype(qtype).name} rows of {K} values are not whole blocks of {qk}")
    return K // qk * nbytes


# Types with an int8 GEMV reader (wgsl/gemv_TYPE.wgsl) -> its x family: which
# activations a lane meets (gemv.wgsl's x_std / x_b32 / x_q6k).
GEMV_FAMILY = {
    Q.Q4_K: "std", Q.Q5_K: "std", Q.Q6_K: "q6k",
    Q.Q4_0: "b32", Q.Q4_1: "b32", Q.Q5_0: "b32", Q.Q5_1: "b32", Q.Q8_0: "b32", Q.IQ4_NL: "b32", Q.IQ4_XS: "b32",
}
GEMV_K = 64  # the GEMV's K multiple: the unit of quantize_q8's layout
GEMV_TEAMS = 8  # 32-lane teams per workgroup of the GEMV
_IQ4 = (Q.IQ4_NL, Q.IQ4_XS)  # readers that fill a table in workgroup memory first


def has_gemv(qtype, K: int) -> bool:
    """Whether [*, K] matrices of this type run the int8 GEMV (rows of whole 64-value groups)."""
    return Q(int(qtype)) in GEMV_FAMILY and K % GEMV_K == 0


@dataclass(frozen=True)
class GemvTuning:
    """How the GEMV is compiled: R weight rows per team (the activations are
    loaded once for all of them), U block steps unrolled, the subgroup size
    its reductions use (0: shared memory only), and NT, the most tokens one
    workgroup takes (a batch of T tokens reads the weights ceil(T / NT)
    times), and UB, the block steps unrolled where a workgroup takes more than
    one token. INFR_GEMV_R / _U / _UB / _SG / _NT override (for measuring; read once,
    infr.gpu.tuning; SG -1: the device's subgroup size). With
    8-bit activations one row and two steps in flight measured best on the
    H200 for every Llama shape (Q4_K; perf/h200/gemv-bench-2026-12-01-q8.json)."""

    R: int = 1
    U: int = 2
    # A workgroup of NT > 1 tokens holds R x U weight blocks while each token's activations meet
    # them; one step in flight did better on an H100 (8B Q4_K_M, perf/batched_bench.py -npl 8,32):
    # 8 rows 987.8 against 838.3 t/s, 32 rows 1332.7 against 1266.7 (perf/h200/gemv-ub-2026-12-06-h100.txt).
    UB: int = 1
    SG: int = -1
    NT: int = 8
    # 1: compiled without wgpu's runtime checks (runtime.unchecked_module), as Dawn runs it: every
    # index is in range by construction (rows and sub-blocks clamped; weight buffers carry a
    # WEIGHT_TAIL). H200, 8B Q4_K_M tg128: 263.5 -> 300.6 t/s; Q4_K gate+up 1988 -> 2544 GB/s.
    UNCHECKED: int = 1
    # 1: the gate||up pair whose output the down projection's int8 GEMV reads next writes it rounded
    # too (gemv_q8_on.wgsl, workgroups of 32 teams: one q8 block of rows each), one quantize_q8
    # dispatch fewer a layer; 0 (INFR_GEMV_Q8=0): the quantize dispatch.
    Q8: int = 1
    # 1: the q|k|v GEMV rotates q and k and stores k and v in the KV cache itself (gemv_rope_on.wgsl,
    # kernels_qkv_rope), one rope_kv dispatch fewer a layer of "norm" rope (llama); 0 (INFR_GEMV_ROPE=0):
    # the rope_kv dispatch. Both on, an H100 through Dawn (python3 -m infr.bench -p 0 -n 128 -r 3, runs
    # alternated, perf/README.md stop 39): 1B tg128 1031.0 / 1032.5 t/s against 926.2 / 925.8, 8B 299.3 /
    # 299.5 against 297.9 / 297.1.
    ROPE: int = 1
    # 1: a plain RMSNorm that only int8 GEMVs read runs in their prologue (gemv_norm_on.wgsl,
    # kernels_norm_in), at one token a step, where the prologues read little: the 1B's attention
    # norm goes (tg128 +3.5 to 5 % on an H100), the 8B keeps both.
    NORM: int = 1

    @classmethod
    def from_env(cls, env) -> "GemvTuning":
        keys = ("R", "U", "UB", "SG", "NT", "UNCHECKED", "Q8", "ROPE", "NORM")
        t = cls(**{k: int(env[f"INFR_GEMV_{k}"]) for k in keys if env.get(f"INFR_GEMV_{k}")})
        if (t.R not in (1, 2, 4) or t.U not in (1, 2, 4) or t.UB not in (1, 2, 4) or (t.SG > 0 and 32 % t.SG) or t.NT not in (1, 2, 4, 8, 16)
                or t.UNCHECKED not in (0, 1) or t.Q8 not in (0, 1) or t.ROPE not in (0, 1) or t.NORM not in (0, 1)):
            raise ValueError(f"bad GEMV tuning {t}")
        return t

    @classmethod
    def for_device(cls, dev: Device) -> "GemvTuning":
        """The process's tuning (infr.gpu.tuning) with SG resolved for `dev`."""
        t = TU.current().gemv
        if t.SG >= 0:
            return t
        sg = dev.subgroup_size or 0
        return replace(t, SG=sg if sg and 32 % sg == 0 else 0)  # teams are 32 lanes: whole subgroups only

    def tokens(self, T: int) -> int:
        """Tokens per workgroup for a batch of T: T rounded up to a power of two, at most NT."""
        return min(1 << max(int(T) - 1, 0).bit_length(), self.NT)


# The gate||up pair's activations: the WGSL function its epilogue applies to the gate. gelu_f16
# (gemma4's table GELU, wgsl/gelu_f16.wgsl) also reads the table, bound at PAIR_TABLE_BINDING
# (past every binding of the GEMV and int8 GEMM kernels, expert banks included).
PAIR_ACTS = ("silu", "gelu", "gelu_f16")
PAIR_TABLE_BINDING = 11

_gelu_tables: "weakref.WeakKeyDictionary[Kernels, object]" = weakref.WeakKeyDictionary()


def gelu_table(kernels: Kernels):
    """The device's buffer of numerics.gelu_f16_table (256 KiB, made once): what every kernel
    applying gelu_f16 binds, the pair's epilogue and kernels_gemma4's gated_gelu_f16 alike."""
    buf = _gelu_tables.get(kernels)
    if buf is None:
        buf = _gelu_tables[kernels] = storage(kernels.dev, gelu_f16_table(), label="gelu_f16_table")
    return buf


def pair_act_consts(pair_act: str | None) -> dict:
    """The PAIR_ACT / ACT_TABLE constants of a kernel with the gate||up pair epilogue."""
    act = pair_act or "silu"  # unread without PAIR
    if act not in PAIR_ACTS:
        raise UnsupportedError(f"no fused gate||up kernel for the activation {act!r}")
    table = (f"@group(0) @binding({PAIR_TABLE_BINDING}) var<storage, read> gelu_table: array<f32>;\n"
             "// #include gelu_f16") if act == "gelu_f16" else ""
    return dict(PAIR_ACT=act, ACT_TABLE=table)


def tile_reader_consts(pair: bool, split: bool = False) -> dict:
    """What the tiled kernels' block readers (gemm_mmq, gemm_mma, mma_dequant) take for a gate||up
    pair's up rows (w2, binding 6) and the q|k|v split's store."""
    return {
        "W2": "@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;" if pair else "",
        "W2_LOAD": "if (slot == 1u) { return w2[i]; }" if pair else "",
        "W2_WORD": "if (slot == 1u) { return w2[i >> 2u][i & 3u]; }" if pair else "",
        "SPLIT_DECL": "// #include gemv_split" if split else "", "STORE": "store_split" if split else "store_row",
    }


def pair_resources(kernels: Kernels, res: list, pair_act) -> list:
    """A pair kernel's bindings `res`, with the gelu table at PAIR_TABLE_BINDING where its act reads it."""
    if getattr(pair_act, "value", pair_act) != "gelu_f16":
        return res
    return list(res) + [None] * (PAIR_TABLE_BINDING - len(res)) + [gelu_table(kernels)]


def gemv_shape(t: GemvTuning, pair: bool, nt: int, q8_out: bool) -> tuple[int, int, int]:
    """(invocations, rows per team, floats of the `partial` reduction array) of a GEMV workgroup:
    8 teams of 32 lanes, or 32 teams where the pair writes whole q8 blocks (q8_out)."""
    R = 2 if pair else t.R  # a pair's two rows are its gate and up
    wg = 32 * (32 if q8_out else GEMV_TEAMS)
    return wg, R, (wg // t.SG if t.SG else wg) * R * nt


def gemv_needs(dev: Device, pair: bool = False, split: bool = False, rope: bool = False,
               table: bool = False, T: int = 1) -> tuple[int, int, int]:
    """(workgroup bytes, storage buffers, output rows a workgroup) of the GEMV of this kind (not a pair that
    rounds its output: no norm goes into those): what kernels_norm_in.takes weighs."""
    t = GemvTuning.for_device(dev)
    nt = t.tokens(T)
    wg, R, partial = gemv_shape(t, pair, nt, False)
    shared = 4 * (partial + 16 + (GEMV_TEAMS * R * nt if rope else 0))
    return shared, 5 + 2 * (split or pair) - pair + 6 * rope + table, wg // 32 * (1 if pair else R)


def gemv_pipeline(kernels: Kernels, types, pair_act: str | None = None, split: bool = False, T: int = 1,
                  expert: bool = False, q8_out: bool = False, rope: dict | None = None, norm: KN.NormIn | None = None):
    """The GEMV over rows of `types` (one type; a pair's gate and up types; a
    split's segment types) for a plain product, the fused gate||up with
    activation `pair_act`, or the stacked q|k|v with `split`, for batches of
    T tokens; its output rows per workgroup and its tokens per workgroup.
    `expert`: rows of an expert bank picked per token by the router (kernels_moe; one token a workgroup).
    `q8_out` (a pair, dense or over expert banks; pair_rounds): the output also rounded, into binding 7.
    `rope` (a split: kernels_qkv_rope's consts): q and k rotated, k and v stored in the KV cache too.
    `norm` (kernels_norm_in, one token): binding 2 holds the rows of the input norm's input, normed in the prologue."""
    t = GemvTuning.for_device(kernels.dev)
    qs = [as_qtype(q) for q in ((types,) if isinstance(types, (Q, int, str)) else types)]
    qs = (qs + [qs[-1]] * 3)[:3]
    pair = pair_act is not None
    if q8_out and not pair:
        raise ValueError("only the gate||up pair writes its output rounded")
    if rope is not None and not split:
        raise ValueError("only the q|k|v split rotates and stores its rows")
    nt = 1 if expert else t.tokens(T)
    if norm is not None and (nt != 1 or t.SG < 8):
        raise ValueError("the GEMV norms its input for one token a workgroup, with subgroups of 8 or more")
    U = t.U if nt == 1 else t.UB
    wg, R, partial = gemv_shape(t, pair, nt, q8_out)
    names = [wgsl_name(q) for q in qs]
    fams = [GEMV_FAMILY[q] for q in qs]
    consts = dict(
        R=R, U=U, SG=t.SG, NT=nt, WG=wg, PARTIAL=partial, Q8_OUT=f"// #include gemv_q8_{'on' if q8_out else 'off'}",
        PAIR=str(pair).lower(), **pair_act_consts(pair_act), SPLIT=str(split).lower(),
        SUBGROUP_ADD="subgroupAdd" if t.SG else "no_subgroups",
        W2="@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;" if pair else "",
        W2_VEC="if (slot == 1u) { return w2[i]; }" if pair else "",
        W2_WORD="if (slot == 1u) { return w2[a >> 4u][(a >> 2u) & 3u]; }" if pair else "",
        SPLIT_DECL="// #include gemv_split" if split else "",
        STORE="rope_keep" if rope is not None else "store_split" if split else "store_row",
        ROPE_OUT=f"// #include gemv_rope_{'off' if rope is None else 'on'}", **(rope or {}),
        **(norm.consts() if norm is not None else KN.off_consts()),
        Q8_SLOTS=8 * nt if q8_out else 1,
        EXPERT=expert_include(expert),
        READERS="\n".join(f"// #include gemv_{n}" for n in dict.fromkeys(names)),
        PROLOGUE="iq4_init(tid);" if any(q in _IQ4 for q in qs) else "",
        SAME_X=str(len(set(fams)) == 1).lower(), ONE_TYPE=str(len(set(qs)) == 1).lower(),
        **{f"DOT{i}": f"w_{n}" for i, n in enumerate(names)}, **{f"X{i}": f"x_{f}" for i, f in enumerate(fams)},
    )
    pipe = kernels.pipeline("gemv", "main", unchecked=bool(t.UNCHECKED), **consts)
    return pipe, wg // 32 * (1 if pair else R), nt


def pair_rounds(dev: Device, N: int, chunks, T: int) -> bool:
    """Whether the GEMV's gate||up pair of N rows in `chunks` (upload_weight's; an expert bank's
    pair: [(None, 0, N)], one token a workgroup: T = 1) can also write its output rounded
    (gemv_pipeline's q8_out): the tuning asks for it, N is whole 64-value groups of the rounded
    layout, every chunk whole 32-row blocks, and the device takes workgroups of 1024 invocations
    with their workgroup memory."""
    t = GemvTuning.for_device(dev)
    if not t.Q8 or N % GEMV_K or any(r0 % 32 or n % 32 for _, r0, n in chunks):
        return False
    wg, _, partial = gemv_shape(t, True, t.tokens(T), True)
    lim = dev.limits
    # partial, the block's values and its per-invocation max and sum, the IQ4 readers' table
    shared = 4 * (partial + 48 * t.tokens(T) + 16)
    return (int(lim.get("max-compute-invocations-per-workgroup", 256)) >= wg
            and int(lim.get("max-compute-workgroup-size-x", 256)) >= wg
            and int(lim.get("max-compute-workgroup-storage-size", 16384)) >= shared)


def expert_include(expert: bool) -> str:
    """The EXPERT constant of gemv.wgsl, gemv_float.wgsl and matmul.wgsl: rows of an expert bank, or dense rows."""
    return "// #include expert_on" if expert else "// #include expert_off"


def rows_per_workgroup(qtype) -> int:
    as_qtype(qtype)
    return _ROWS_PER_WG


def pack_params(fields: list[tuple[str, str, object]]) -> np.ndarray:
    dt = np.dtype([(name, "<u4" if kind == "u32" else "<f4") for name, kind, _ in fields])
    rec = np.zeros(1, dt)
    for name, _, value in fields:
        rec[name] = value
    raw = rec.tobytes()
    return np.frombuffer(raw + b"\0" * (-len(raw) % 16), np.uint8)


def params_matmul(
    K: int, N: int, row0: int, row_bytes: int, x_stride: int, y_stride: int, has_bias: bool, T: int,
    has_resid: bool = False, split1: int = 0, split2: int = 0,
    row_bytes2: int = 0, row_bytes3: int = 0, off2: int = 0, off3: int = 0, eps: float = 0.0,
) -> np.ndarray:
    """matmul_common.wgsl Params; N is the chunk's row count, row0 its first global row."""
    return pack_params([
        ("K", "u32", K), ("N", "u32", N), ("row0", "u32", row0), ("row_bytes", "u32", row_bytes),
        ("x_stride", "u32", x_stride), ("y_stride", "u32", y_stride), ("has_bias", "u32", int(has_bias)),
        ("T", "u32", T), ("has_resid", "u32", int(has_resid)), ("split1", "u32", split1), ("split2", "u32", split2),
        ("row_bytes2", "u32", row_bytes2), ("row_bytes3", "u32", row_bytes3), ("off2", "u32", off2),
        ("off3", "u32", off3), ("eps", "f32", eps),
    ])


def max_groups(dev: Device) -> int:
    return int(dev.limits.get("max-compute-workgroups-per-dimension", 65535))


# Zero bytes after every weight upload; every view of a mixed stack's matrix (stack_parts) reaches as
# far past its bytes (into the next matrix, or that zero tail).
# The GEMV's readers of blocks that are not 16-byte aligned (Q8_0, Q5_0, Q4_0, ...) load the aligned
# vec4 after their bytes whether or not `realign` uses it; unchecked (GemvTuning.UNCHECKED, and always
# on Dawn) that load must stay inside the binding.
WEIGHT_TAIL = 16


def binding_for_rows(rows: int, rb: int) -> int:
    """The bytes a weight chunk of `rows` rows of `rb` bytes binds (padded, with its tail)."""
    return -(-rows * rb // 16) * 16 + WEIGHT_TAIL


def upload_weight(dev: Device, tensor, max_binding: int | None = None, label: str | None = None) -> list[tuple]:
    """Upload a [N, K] matrix's raw GGUF bytes as row chunks: [(buffer, row0, rows)].

    A chunk is at most `max_binding` bytes (default: the device's storage
    binding limit) and at most max-workgroups × ROWS_PER_WG rows; each buffer
    is zero-padded to a multiple of 4 bytes (storage() pads to 16).
    """
    q = as_qtype(tensor.qtype)
    N, K = int(tensor.shape[0]), int(tensor.shape[-1])
    rb = row_bytes(q, K)
    raw = np.ascontiguousarray(tensor.raw).view(np.uint8).reshape(N, -1)
    if raw.shape[1] != rb:
        raise UnsupportedError(f"{tensor.name}: rows of {raw.shape[1]} bytes, expected {rb} for {q.name}")
    limit = dev.max_binding if max_binding is None else int(max_binding)
    # binding_for_rows(rows, rb) <= limit: the whole buffer, padded and with its tail, is bound
    per_chunk = min((limit - WEIGHT_TAIL) // 16 * 16 // rb, max_groups(dev) * rows_per_workgroup(q))
    if per_chunk < 1:
        raise UnsupportedError(f"{tensor.name}: one row ({rb} bytes) exceeds the storage binding limit {limit}")
    chunks = []
    name = label or getattr(tensor, "name", "weight")
    for row0 in range(0, N, per_chunk):
        rows = min(per_chunk, N - row0)
        buf = storage(dev, raw[row0 : row0 + rows].reshape(-1), label=f"{name}[{row0}:{row0 + rows}]", tail=WEIGHT_TAIL)
        chunks.append((buf, row0, rows))
    return chunks


_dummies: weakref.WeakKeyDictionary[Kernels, object] = weakref.WeakKeyDictionary()


def _no_bias(kernels: Kernels):
    """Bound in place of a missing bias (layout="auto" needs every binding; has_bias=0 skips reads)."""
    buf = _dummies.get(kernels)
    if buf is None:
        buf = _dummies[kernels] = storage(kernels.dev, np.zeros(4, np.float32), label="no_bias")
    return buf


_sinks: weakref.WeakKeyDictionary[Kernels, object] = weakref.WeakKeyDictionary()


def _no_output(kernels: Kernels):
    """Bound in place of the third output of a two-matrix stack (never written)."""
    buf = _sinks.get(kernels)
    if buf is None:
        buf = _sinks[kernels] = storage(kernels.dev, 16, label="no_output")
    return buf


def _weight_shape(w, dims: tuple) -> tuple[Q, tuple]:
    """Accept a Tensor (its qtype and shape) or a bare qtype whose shape comes in `dims`."""
    if hasattr(w, "qtype") and hasattr(w, "shape"):
        return as_qtype(w.qtype), (int(w.shape[-1]), int(w.shape[0])) + tuple(dims)
    return as_qtype(w), tuple(dims)


def matmul_dispatches(
    kernels: Kernels, w, chunks, x, y, bias, *dims: int,
    x_stride: int | None = None, y_stride: int | None = None, wg: int = MATMUL_WG, resid=None, xq=None,
) -> list[Dispatch]:
    """Dispatches for y[t] = W @ x[t] (+ bias), one per weight chunk.

    `matmul_dispatches(kernels, tensor, chunks, x, y, bias, T)` or
    `matmul_dispatches(kernels, qtype, chunks, x, y, bias, K, N, T)`; `chunks`
    is upload_weight's list, `bias` a buffer of N floats or None, `resid` a
    buffer laid out like y added in the epilogue (a fused residual add; it
    must not be y itself). Strides are in floats and default to K (x) and N (y).
    Types with an int8 GEMV (has_gemv): it multiplies x rounded to 8 bits
    (kernels_q8), by a quantize dispatch put first, or already rounded in `xq`
    (x is then unread), or normed and rounded in the GEMV's prologue where `xq` is a
    kernels_norm_in.NormIn (its x then the input, T = 1). Other Q8_ACTIVATIONS shapes take the f32 GEMM, which rounds.
    F32 / F16 / BF16 take the float GEMV (kernels_gemv_float.has_float_gemv), the rest matmul.wgsl.
    """
    q, shape = _weight_shape(w, dims)
    if len(shape) != 3:
        raise TypeError("matmul_dispatches needs T (with a tensor) or K, N, T (with a qtype)")
    K, N, T = shape
    rows_wg = rows_per_workgroup(q)
    team = wg // rows_wg
    if wg % rows_wg or team & (team - 1):
        raise ValueError(f"matmul WG={wg} must be {rows_wg} x a power of two")
    if sum(rows for _, _, rows in chunks) != N:
        raise ValueError(f"weight chunks hold {sum(r for _, _, r in chunks)} rows, expected {N}")
    rb = row_bytes(q, K)
    out = []
    floats = False
    norm = KN.given(xq, K)
    if norm is not None and not (has_gemv(q, K) and x_stride in (None, K)):
        raise ValueError(f"no GEMV of {q.name} over rows of {x_stride or K} norms its input")
    if has_gemv(q, K):  # int8 activations, a team of lanes reads each block together
        pipe, rows_wg, nt = gemv_pipeline(kernels, q, T=T, norm=norm)
        label = f"gemv_{wgsl_name(q)}{'_norm' if norm else ''}"
        if xq is None:
            quant, xq = KQ.quantize_dispatch(kernels, x, K, T, x_stride)
            out.append(quant)
        # the GEMV reads the rounded rows, in vec4 (or the norm's input, normed in its prologue)
        x, x_stride = (norm.x, K) if norm else (xq, KQ.words(K) // 4)
    elif q in Q8_ACTIVATIONS:  # K % 64 != 0: the f32 GEMM rounds its activations itself
        from infr.gpu import kernels_gemm as KG

        return KG.gemm_dispatches(kernels, q, chunks, x, y, bias, K, N, T, x_stride=x_stride, y_stride=y_stride,
                                  resid=resid)
    elif (floats := KGF.has_float_gemv(q, x_stride or K)):  # F32 / F16 / BF16: wide teams, vec4 loads, NT tokens a load
        label = f"gemv_{wgsl_name(q)}"
    else:
        pipe = kernels.pipeline("matmul", "main", QTYPE=wgsl_name(q), WG=wg, ROWS=rows_wg, EXPERT=expert_include(False))
        label, nt = f"matmul_{wgsl_name(q)}", 1
    b = bias if bias is not None else _no_bias(kernels)
    for buf, row0, rows in chunks:
        if floats:  # the team width follows the chunk's shape
            pipe, rows_wg, nt = KGF.float_gemv_pipeline(kernels, q, rows, K, T)
        data = params_matmul(K, rows, row0, rb, x_stride or K, y_stride or N, bias is not None, T, resid is not None,
                             eps=norm.eps if norm else 0.0)
        p = storage(kernels.dev, data, label="matmul.params", uniform=True)
        groups = (-(-rows // rows_wg), -(-T // nt), 1)
        r = resid if resid is not None else _no_bias(kernels)
        res = [p, buf, x, y, b, r]
        bind = kernels.bind(pipe, norm.resources(res) if norm else res)
        out.append(Dispatch(pipe, bind, groups, f"{label} {N}x{K}", rows * rb))
    return out


def can_pair(wg, wu, chunks_g, chunks_u) -> bool:
    """Gate and up the GEMV runs as one PAIR dispatch: both with an int8 GEMV
    (their types may differ), one shape, one chunking."""
    K = int(wg.shape[-1])
    return (
        has_gemv(wg.qtype, K) and has_gemv(wu.qtype, K) and tuple(wg.shape) == tuple(wu.shape)
        and [(r0, n) for _, r0, n in chunks_g] == [(r0, n) for _, r0, n in chunks_u]
    )


def can_fuse_gate_up(wg, wu, chunks_g, chunks_u) -> bool:
    """A pair (can_pair) of one type: what the tiled kernels (kernels_mmq) fuse."""
    return as_qtype(wg.qtype) == as_qtype(wu.qtype) and can_pair(wg, wu, chunks_g, chunks_u)


def gate_up_dispatches(
    kernels: Kernels, wg, wu, chunks_g, chunks_u, x, y, act: str, T: int, xq=None, yq=None,
) -> list[Dispatch] | None:
    """y[t] = act(Wg @ x[t]) * (Wu @ x[t]) in one dispatch per chunk (the fused
    gate||up of a gated FFN), or None where no fused kernel applies (the caller
    then runs the two matmuls and the activation). `yq` (only where pair_rounds):
    a buffer of T * kernels_q8.words(N) words that also gets y rounded, as quantize_q8 writes it."""
    if not can_pair(wg, wu, chunks_g, chunks_u):
        return None
    qg, qu = as_qtype(wg.qtype), as_qtype(wu.qtype)
    K, N = int(wg.shape[-1]), int(wg.shape[0])
    if yq is not None and not pair_rounds(kernels.dev, N, chunks_g, T):
        raise ValueError(f"the gate||up pair of {N} rows cannot write its output rounded here")
    norm = KN.given(xq, K)
    pipe, rows_wg, nt = gemv_pipeline(kernels, (qg, qu), pair_act=getattr(act, "value", act), T=T,
                                      q8_out=yq is not None, norm=norm)
    rb, rb2 = row_bytes(qg, K), row_bytes(qu, K)
    none = _no_bias(kernels)
    out = []
    if xq is None:
        quant, xq = KQ.quantize_dispatch(kernels, x, K, T)
        out.append(quant)
    x = norm.x if norm else xq
    name = wgsl_name(qg) if qg == qu else f"{wgsl_name(qg)}_{wgsl_name(qu)}"
    for (bg, row0, rows), (bu, _, _) in zip(chunks_g, chunks_u):
        p = storage(kernels.dev, params_matmul(K, rows, row0, rb, KQ.words(K) // 4, N, False, T, row_bytes2=rb2,
                                               eps=norm.eps if norm else 0.0), label="gate_up.params", uniform=True)
        groups = (-(-rows // rows_wg), -(-T // nt), 1)
        res = pair_resources(kernels, [p, bg, x, y, none, none, bu] + ([yq] if yq is not None else []), act)
        bind = kernels.bind(pipe, norm.resources(res) if norm else res)
        label = f"gemv_{name}_gate_up{'_q8' if yq is not None else ''}{'_norm' if norm else ''} {N}x{K}"
        out.append(Dispatch(pipe, bind, groups, label, rows * (rb + rb2)))
    return out


STACK_ALIGN = 256  # a mixed stack's matrices start here: WebGPU's storage offset alignment, for views of each


def is_mixed(tensors) -> bool:
    return len({as_qtype(t.qtype) for t in tensors}) > 1


def stack_layout(tensors) -> list[tuple[int, int]]:
    """(byte offset, bytes) of each matrix in its stacked upload: back to back
    when they share a type (one row layout from the first row on), each on a
    STACK_ALIGN boundary when they do not (its own vec4-aligned rows, and a
    buffer view per matrix for the kernels that run them one by one)."""
    align = STACK_ALIGN if is_mixed(tensors) else 1
    out, off = [], 0
    for t in tensors:
        n = int(t.shape[0]) * row_bytes(t.qtype, int(t.shape[-1]))
        out.append((off, n))
        off = -(-(off + n) // align) * align
    return out


def can_stack(tensors, max_binding: int) -> bool:
    """Matrices one GEMV can run stacked (the fused q|k|v): 2 or 3 with an
    int8 GEMV (types may differ: a Q4_K_M layer's Q6_K v), one K, together
    within one storage binding."""
    ks = {int(t.shape[-1]) for t in tensors}
    if len(ks) != 1 or not 2 <= len(tensors) <= 3:
        return False
    K = ks.pop()
    off, n = stack_layout(tensors)[-1]
    return all(has_gemv(t.qtype, K) for t in tensors) and -(-(off + n) // STACK_ALIGN) * STACK_ALIGN + WEIGHT_TAIL <= max_binding


def upload_stacked(dev: Device, tensors, label: str) -> list[tuple]:
    """The matrices' raw rows in one buffer (stack_layout): [(buffer, 0, rows)]."""
    layout = stack_layout(tensors)
    off, n = layout[-1]
    raw = np.zeros(-(-(off + n) // STACK_ALIGN) * STACK_ALIGN, np.uint8)
    for t, (off, n) in zip(tensors, layout):
        raw[off : off + n] = np.ascontiguousarray(t.raw).view(np.uint8).reshape(-1)
    rows = sum(int(t.shape[0]) for t in tensors)
    return [(storage(dev, raw, label=label, tail=WEIGHT_TAIL), 0, rows)]


def stack_parts(tensors, chunks) -> list[list[tuple]]:
    """Each matrix of a mixed stack as upload_weight's chunk list over a view of the buffer: its bytes
    padded to STACK_ALIGN and WEIGHT_TAIL more (the next matrix's first bytes, or the buffer's tail)."""
    if not is_mixed(tensors):
        raise ValueError("views of a stack need its matrices on STACK_ALIGN boundaries (a mixed stack)")
    (buf, _, _), = chunks
    return [[((buf, off, -(-n // STACK_ALIGN) * STACK_ALIGN + WEIGHT_TAIL), 0, int(t.shape[0]))]
            for t, (off, n) in zip(tensors, stack_layout(tensors))]


def stacked_dispatches(kernels: Kernels, tensors, chunks, x, ys, bias, T: int, xq=None, rope=None) -> list[Dispatch]:
    """ys[i][t] = W_i @ x[t] (+ bias) for the stacked matrices in one dispatch;
    `bias` is one buffer with every matrix's rows (zeros where one has none). `rope`
    (kernels_qkv_rope.StackRope): q and k rotated and k, v stored in the KV cache in the same dispatch.
    `xq` a kernels_norm_in.NormIn: x normed in the prologue (matmul_dispatches)."""
    qs = [as_qtype(t.qtype) for t in tensors]
    K = int(tensors[0].shape[-1])
    sizes = [int(t.shape[0]) for t in tensors]
    N = sum(sizes)
    norm = KN.given(xq, K)
    pipe, rows_wg, nt = gemv_pipeline(kernels, qs, split=True, T=T, rope=rope.consts() if rope else None, norm=norm)
    split1 = sizes[0]
    split2 = sizes[0] + sizes[1] if len(sizes) == 3 else N
    layout = stack_layout(tensors) + [(0, 0)]
    rbs = [row_bytes(q, K) for q in qs] + [0]
    (buf, _, _), = chunks
    quant = []
    if xq is None:
        d, xq = KQ.quantize_dispatch(kernels, x, K, T)
        quant.append(d)
    data = params_matmul(K, N, 0, rbs[0], KQ.words(K) // 4, N, bias is not None, T, False, split1, split2,
                         row_bytes2=rbs[1], row_bytes3=rbs[2], off2=layout[1][0], off3=layout[2][0],
                         eps=norm.eps if norm else 0.0)
    p = storage(kernels.dev, data, label="qkv.params", uniform=True)
    none = _no_bias(kernels)
    # Outputs a two-matrix stack lacks get a buffer of their own: a writable binding may not alias `none`.
    outs = list(ys) + [_no_output(kernels)] * (3 - len(ys))
    extra = rope.bindings(kernels) if rope else []
    res = [p, buf, norm.x if norm else xq, outs[0], bias if bias is not None else none, none, outs[1], outs[2], *extra]
    bind = kernels.bind(pipe, norm.resources(res) if norm else res)
    name = wgsl_name(qs[0]) if not is_mixed(tensors) else "_".join(dict.fromkeys(wgsl_name(q) for q in qs))
    label = f"gemv_{name}_stacked{'_rope_kv' if rope else ''}{'_norm' if norm else ''} {'+'.join(map(str, sizes))}x{K}"
    return quant + [Dispatch(pipe, bind, (-(-N // rows_wg), -(-T // nt), 1), label, sum(n for _, n in layout))]

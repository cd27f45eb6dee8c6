"""Params packers and prebuilt dispatches for the small kernels.

Everything here runs once, at load: each helper packs the op's `Params` into a
uniform buffer (or reuses one it is given), builds the bind group and returns a
`Dispatch` the backend encodes token after token. Positions are not baked in:
kernels that need them read a `Paging` (the `state` buffer, `state[1]` = live
rows; `rows`, each row's position and sequence slot; the block table of the
paged KV cache), see docs/gpu_kernels.md "Paged KV cache".

Packers return the exact bytes of the WGSL struct: fields in declaration order,
u32 / f32 little-endian, zero-padded to a multiple of 16 bytes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from infr.gpu.runtime import Dispatch, Kernels, storage

# Bounds the attention kernel is compiled for (its shared q row and V accumulators).
ATTN_MAX_HEAD_DIM = 512
ELEMENTWISE_WG = 256
BLOCK_SIZE = 32  # KV cache positions per block (paging.wgsl), the default


@dataclass(frozen=True)
class Paging:
    """The buffers that say where a batch's rows are and where their keys live:
    `state` (u32: [0] row 0's position, for the decode loops; [1] live rows n;
    [2] tokens logged), `rows` (u32, 2 a row: position, sequence slot) and
    `table` (u32 [max_seqs * blocks_per_seq]: the physical block of each slot's
    logical blocks of `block_size` positions). Rows t >= state[1] are padding."""

    state: object
    rows: object
    table: object
    block_size: int = BLOCK_SIZE
    blocks_per_seq: int = 1

    def __post_init__(self):
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            raise ValueError(f"the KV block size must be a power of two >= 16, got {bs}")


def pack_rows(positions, slots) -> np.ndarray:
    """Contents of the `rows` buffer: (position, slot) per row."""
    pos = np.asarray(positions, np.uint32).reshape(-1)
    return np.stack([pos, np.broadcast_to(np.asarray(slots, np.uint32), pos.shape)], axis=1).reshape(-1)


def identity_table(n_blocks: int, max_seqs: int = 1) -> np.ndarray:
    """A block table where slot 0 owns blocks 0 .. n_blocks - 1 in order (one
    sequence: today's contiguous cache); the other slots point at block 0."""
    table = np.zeros((max_seqs, n_blocks), np.uint32)
    table[0] = np.arange(n_blocks, dtype=np.uint32)
    return table.reshape(-1)


def single_sequence(dev, start: int, T: int, n_ctx: int, block_size: int = BLOCK_SIZE) -> Paging:
    """New buffers for one sequence of T rows at start .. start + T - 1 in a
    contiguous cache of n_ctx positions (slot 0, identity table): kernel tests."""
    n_blocks = -(-n_ctx // block_size)
    return Paging(storage(dev, pack_state(start, T), label="state"),
                  storage(dev, pack_rows(np.arange(start, start + T), 0), label="rows"),
                  storage(dev, identity_table(n_blocks), label="block_table"), block_size, n_blocks)


def write_rows(dev, pg: Paging, positions, slots, n_live: int | None = None) -> None:
    """Point pg at new rows: state (row 0's position, n live) and the rows buffer."""
    q = dev.device.queue
    rows = pack_rows(positions, slots)
    if rows.size:
        q.write_buffer(pg.rows, 0, rows)
    n = len(rows) // 2 if n_live is None else n_live
    q.write_buffer(pg.state, 0, pack_state(int(rows[0]) if rows.size else 0, n)[:2])


def _pack(fields: list[tuple[str, str, object]]) -> bytes:
    dt = np.dtype([(name, "<u4" if kind == "u32" else "<f4") for name, kind, _ in fields])
    rec = np.zeros(1, dt)
    for name, _, value in fields:
        rec[name] = value
    raw = rec.tobytes()
    return raw + b"\0" * (-len(raw) % 16)


def pack_rmsnorm(width: int, group: int, eps: float, T: int) -> bytes:
    return _pack([("width", "u32", width), ("group", "u32", group), ("eps", "f32", eps), ("T", "u32", T)])


def pack_rope(n_heads: int, head_dim: int, n_rot: int, theta: float, freq_scale: float, has_factors: bool) -> bytes:
    return _pack([
        ("n_heads", "u32", n_heads), ("head_dim", "u32", head_dim), ("n_rot", "u32", n_rot),
        ("theta", "f32", theta), ("freq_scale", "f32", freq_scale), ("has_factors", "u32", int(has_factors)),
    ])


def pack_kv_store(kv_heads: int, head_dim: int, v_head_dim: int, blocks_per_seq: int) -> bytes:
    return _pack([("kv_heads", "u32", kv_heads), ("head_dim", "u32", head_dim), ("v_head_dim", "u32", v_head_dim),
                  ("blocks_per_seq", "u32", blocks_per_seq)])


def pack_attention(
    n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, scale: float, window: int | None,
    softcap: float | None, n_ctx: int = 0, max_chunks: int = 0, blocks_per_seq: int = 1, chunk: int | None = None,
) -> bytes:
    """wgsl/attn_common.wgsl Params, shared by every attention kernel (n_ctx and
    max_chunks: the split-K scratch strides; blocks_per_seq: the block table's; chunk: chunked
    attention's chunk, None or 0 for none)."""
    if chunk is not None and chunk < 0:
        raise ValueError(f"attention chunk must be positive, got {chunk}")
    return _pack([
        ("n_heads", "u32", n_heads), ("kv_heads", "u32", kv_heads), ("head_dim", "u32", head_dim),
        ("v_head_dim", "u32", v_head_dim), ("scale", "f32", scale), ("window", "u32", window or 0),
        ("softcap", "f32", softcap or 0.0), ("n_ctx", "u32", n_ctx), ("max_chunks", "u32", max_chunks),
        ("blocks_per_seq", "u32", blocks_per_seq), ("chunk", "u32", chunk or 0),
    ])


def pack_elementwise(n: int, cap: float = 0.0) -> bytes:
    # gated/add declare {n}; softcap {n, cap}. Same bytes: cap lands in the padding.
    return _pack([("n", "u32", n), ("cap", "f32", cap)])


def pack_argmax(n: int, per: int, parts: int) -> bytes:
    return _pack([("n", "u32", n), ("per", "u32", per), ("parts", "u32", parts)])


def pack_state(start: int, T: int) -> np.ndarray:
    """Contents of the `state` buffer: row 0's position and the live rows (Paging)."""
    return np.array([start, T, 0, 0], np.uint32)


def _params(kernels: Kernels, data: bytes, params, label: str):
    """The op's uniform buffer: `params` (rewritten with `data`) or a new one."""
    if params is None:
        return storage(kernels.dev, np.frombuffer(data, np.uint8), label=f"{label}.params", uniform=True)
    kernels.dev.device.queue.write_buffer(params, 0, data)
    return params


_dummies: "weakref.WeakKeyDictionary[Kernels, object]" = weakref.WeakKeyDictionary()


def _dummy(kernels: Kernels):
    """A small storage buffer for bindings an op declares but does not read (rope without factors)."""
    buf = _dummies.get(kernels)
    if buf is None:
        buf = _dummies[kernels] = storage(kernels.dev, np.ones(4, np.float32), label="dummy")
    return buf


def _flat_groups(kernels: Kernels, n: int) -> tuple[int, int, int]:
    """ceil(n / 256) groups, folded into y past the per-dimension limit (the kernel linearises)."""
    groups = max(1, -(-n // ELEMENTWISE_WG))
    limit = int(kernels.dev.limits.get("max-compute-workgroups-per-dimension", 65535))
    if groups <= limit:
        return (groups, 1, 1)
    return (limit, -(-groups // limit), 1)


def rmsnorm_dispatch(
    kernels: Kernels, x, g, y, width: int, group: int | None, eps: float, T: int, params=None
) -> Dispatch:
    group = group or width
    if width % group:
        raise ValueError(f"rmsnorm group {group} does not divide width {width}")
    pipe = kernels.pipeline("rmsnorm", "main")
    p = _params(kernels, pack_rmsnorm(width, group, eps, T), params, "rmsnorm")
    return Dispatch(pipe, kernels.bind(pipe, [p, x, g, y]), (width // group, T, 1), "rmsnorm")


def rmsnorm_add_dispatch(kernels: Kernels, x, g, resid, y, width: int, eps: float, T: int, w=None, w_width: int = 1,
                         scale: float = 1.0) -> Dispatch:
    """y = resid + rmsnorm(x) * g (a post-norm residual add), then with w: y = (y * scale) * w[i % w_width]."""
    pipe = kernels.pipeline("rmsnorm_add", "main", SCALE="true" if w is not None else "false")
    p = _params(kernels, _pack([("width", "u32", width), ("group", "u32", width), ("eps", "f32", eps), ("T", "u32", T),
                                ("scale", "f32", scale), ("w_width", "u32", w_width), ("eps2", "f32", 0.0),
                                ("q_stride", "u32", 0)]), None, "rmsnorm_add")  # rmsnorm_add_common's Params
    return Dispatch(pipe, kernels.bind(pipe, [p, x, g, y, resid, w if w is not None else _dummy(kernels)]),
                    (1, T, 1), "rmsnorm_add")


def rope_dispatch(
    kernels: Kernels, x, pg: Paging, n_heads: int, head_dim: int, n_rot: int, theta: float, freq_scale: float,
    style: str, T: int, factors=None, params=None,
) -> Dispatch:
    style = getattr(style, "value", style)  # RopeStyle or its string
    if style not in ("norm", "neox"):
        raise ValueError(f"unknown rope style {style!r}")
    if n_rot % 2 or n_rot > head_dim:
        raise ValueError(f"n_rot {n_rot} must be even and at most head_dim {head_dim}")
    pipe = kernels.pipeline("rope", "main", STYLE=style)
    p = _params(kernels, pack_rope(n_heads, head_dim, n_rot, theta, freq_scale, factors is not None), params, "rope")
    ff = factors if factors is not None else _dummy(kernels)
    return Dispatch(pipe, kernels.bind(pipe, [p, x, ff, pg.rows]), (n_heads, T, 1), f"rope_{style}")


def kv_store_dispatch(
    kernels: Kernels, k, v, kcache, vcache, pg: Paging, kv_heads: int, head_dim: int, v_head_dim: int, T: int,
    params=None,
) -> Dispatch:
    """k, v rows of the live rows into the caches at their cache rows (pg's block table)."""
    if head_dim % 2 or v_head_dim % 2:
        raise ValueError("the f16 KV cache packs pairs: head dims must be even")
    pipe = kernels.pipeline("kv_store", "main", BS=pg.block_size)
    p = _params(kernels, pack_kv_store(kv_heads, head_dim, v_head_dim, pg.blocks_per_seq), params, "kv_store")
    return Dispatch(pipe, kernels.bind(pipe, [p, k, v, kcache, vcache, pg.state, pg.rows, pg.table]),
                    (kv_heads, T, 1), "kv_store")


def attention_dispatch(
    kernels: Kernels, q, kcache, vcache, out, pg: Paging, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
    scale: float, window: int | None, softcap: float | None, T: int, params=None, kv_max: int = 0, xq=None,
    chunk: int | None = None,
) -> Dispatch:
    """One workgroup per (head, row) over all the keys of the row's sequence;
    kv_max > 0: idle for rows that see more keys (split-K takes those). `xq`: the
    output is also written there rounded (kernels_q8 layout; q8_out_consts)."""
    if n_heads % kv_heads:
        raise ValueError(f"{n_heads} query heads do not share {kv_heads} kv heads evenly")
    if head_dim % 8 or v_head_dim % 4 or max(head_dim, v_head_dim) > ATTN_MAX_HEAD_DIM:
        raise ValueError(f"attention needs head_dim % 8 == 0, v_head_dim % 4 == 0, both at most {ATTN_MAX_HEAD_DIM}")
    pipe = kernels.pipeline("attention", "main", KV_MAX=kv_max, BS=pg.block_size,
                            **q8_out_consts(xq, n_heads, v_head_dim, 8))
    data = pack_attention(n_heads, kv_heads, head_dim, v_head_dim, scale, window, softcap,
                          blocks_per_seq=pg.blocks_per_seq, chunk=chunk)
    p = _params(kernels, data, params, "attention")
    res = [p, q, kcache, vcache, out, pg.state, pg.rows, pg.table] + ([xq] if xq is not None else [])
    return Dispatch(pipe, kernels.bind(pipe, res), (n_heads, T, 1), "attention")


def can_round_output(n_heads: int, v_head_dim: int) -> bool:
    """Whether the attention kernels can also write their output rounded to 8
    bits (wgsl/attn_q8_on.wgsl): whole 32-value blocks per head, whole 256-value
    blocks per row, and a head's values within one combine workgroup."""
    return v_head_dim % 32 == 0 and (n_heads * v_head_dim) % 256 == 0 and v_head_dim <= 256


def q8_out_consts(xq, n_heads: int, v_head_dim: int, binding: int) -> dict:
    """Template constants of an attention kernel's rounded output (attn_q8_on / attn_q8_off)."""
    if xq is None:
        return {"Q8": "off"}
    if not can_round_output(n_heads, v_head_dim):
        raise ValueError(f"cannot round an attention output of {n_heads} heads x {v_head_dim} to 8 bits")
    return {"Q8": "on", "Q8_BINDING": binding, "Q8_K": n_heads * v_head_dim}


def gated_dispatch(kernels: Kernels, g, u, y, n: int, act: str, params=None) -> Dispatch:
    act = getattr(act, "value", act)  # Activation or its string
    if act == "gelu_f16":  # gemma4's table GELU: a kernel that also binds the table
        from infr.gpu.kernels_gemma4 import gated_gelu_f16_dispatch

        return gated_gelu_f16_dispatch(kernels, g, u, y, n)
    if act not in ("silu", "gelu"):
        raise ValueError(f"unknown activation {act!r}")
    pipe = kernels.pipeline("elementwise", f"gated_{act}")
    p = _params(kernels, pack_elementwise(n), params, f"gated_{act}")
    return Dispatch(pipe, kernels.bind(pipe, [p, g, u, y]), _flat_groups(kernels, n), f"gated_{act}")


def add_dispatch(kernels: Kernels, a, b, y, n: int, params=None) -> Dispatch:
    """y = a + b. y must be its own buffer: a writable binding may not alias a read one."""
    pipe = kernels.pipeline("elementwise", "add")
    p = _params(kernels, pack_elementwise(n), params, "add")
    return Dispatch(pipe, kernels.bind(pipe, [p, a, b, y]), _flat_groups(kernels, n), "add")


def softcap_dispatch(kernels: Kernels, x, n: int, cap: float, params=None) -> Dispatch:
    if not cap > 0:
        raise ValueError(f"softcap needs a positive cap, got {cap}")
    pipe = kernels.pipeline("elementwise", "softcap")
    p = _params(kernels, pack_elementwise(n, cap), params, "softcap")
    return Dispatch(pipe, kernels.bind(pipe, [p, x]), _flat_groups(kernels, n), "softcap")



def query_temp_dispatch(kernels: Kernels, x, tau, rows, width: int, n_pos: int, T: int, params=None) -> Dispatch:
    """x [T, width] *= tau[position of each row] in place (llama4's query temperature): tau holds
    n_pos per-position factors, made on the host (query_temp_table)."""
    if not 0 < n_pos <= tau.size // 4:
        raise ValueError(f"query temperature table of {tau.size // 4} values cannot hold {n_pos} positions")
    pipe = kernels.pipeline("query_temp", "main")
    p = _params(kernels, _pack([("width", "u32", width), ("n_pos", "u32", n_pos)]), params, "query_temp")
    return Dispatch(pipe, kernels.bind(pipe, [p, x, tau, rows]), (-(-width // 64), T, 1), "query_temp")


def query_temp_table(kernels: Kernels, temp, n_pos: int):
    """The factors tau(0 .. n_pos - 1) of a QueryTemperature as a storage buffer: the CPU
    reference's float32 values, so both backends scale q alike."""
    return storage(kernels.dev, temp.factor(np.arange(n_pos)), label="query_temp.tau")


def ones(kernels: Kernels, n: int):
    """n float32 ones: the weight of a weightless RMSNorm (x * 1.0 is x, so the norm kernel's result
    is the weightless norm's exactly)."""
    return storage(kernels.dev, np.ones(n, np.float32), label="ones")

ARGMAX_SLICE = 2048  # values per workgroup of the first argmax pass


def argmax_dispatches(kernels: Kernels, x, out, n: int, rows: int = 1) -> list[Dispatch]:
    """out[r] = argmax(x[r n : (r + 1) n]) for each of `rows` rows (lowest index on ties):
    a pass per slice of every row, then one merge per row."""
    parts = max(1, -(-n // ARGMAX_SLICE))
    p = _params(kernels, pack_argmax(n, ARGMAX_SLICE, parts), None, "argmax")
    best = storage(kernels.dev, rows * parts * 8, label="argmax.best")
    first, last = kernels.pipeline("argmax", "partial"), kernels.pipeline("argmax", "merge")
    return [Dispatch(first, kernels.bind(first, [p, x, best, out]), (parts, rows, 1), f"argmax {n}"),
            Dispatch(last, kernels.bind(last, [p, x, best, out]), (1, rows, 1), "argmax_merge")]

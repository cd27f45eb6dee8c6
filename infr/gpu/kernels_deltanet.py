"""qwen35 on the GPU: the gated DeltaNet mixer (the DeltaNet op) with its per-slot recurrent
state, and the gated attention's two elementwise ops (HeadSlice, SigmoidMul). CPU reference:
infr/cpu/deltanet.py and infr/cpu/kinds.py.

The DeltaNet op is three dispatches (four for prompt batches: wgsl/deltanet_qknorm.wgsl first
normalises q and k of every row in parallel), the first two token-serial over the batch's live rows (a
slot's rows in position order, RecurrentStates.check_rows): wgsl/deltanet_conv.wgsl (the causal
conv with its state, silu; a thread per channel), wgsl/deltanet_rule.wgsl (the gates beta' and g,
then the delta rule with S in registers; a V-head's columns split over workgroups per slot) and
wgsl/deltanet_norm.wgsl (the gated RMSNorm times silu(z), and the rounded copy the output
projection's int8 GEMV reads). Batches of CHUNK_ROWS rows or more take the chunked rule instead
(chunk_dispatches: wgsl/deltanet_chunk_index, _intra, _state; the WY / UT form, derived and checked
in tests/test_deltanet_chunk.py): T / 32 serial steps of small matmuls instead of T row steps.

State: one f32 buffer per DeltaNet layer, max_seqs slots of RecurrentState.spec.state_floats each
(the conv's last d_conv - 1 inputs [d_conv - 1, conv_dim], then S [H_v, d_k, d_v]), the CPU
reference's SeqState layout. A row at position 0 starts its slot from zeros, so the buffers are
never cleared; the host tracks where each slot's state stands and refuses rows that skip or rewind.
"""

from __future__ import annotations

import numpy as np

from infr.errors import InfrError, UnsupportedError
from infr.gpu import kernels_misc as KS
from infr.gpu import tuning as TU
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import Dispatch, Kernels, storage
from infr.models.spec import DeltaNetSpec
from infr.ops import DeltaNet, HeadSlice, SigmoidMul

CONV_WG = 64  # deltanet_conv.wgsl's @workgroup_size
PRE_ROWS = 16  # batches of this many rows normalise q and k in a pass of their own (rule_dispatches)
# Batches of this many rows take the chunked rule (chunk_dispatches): ~T / CHUNK serial steps of
# small matmuls instead of T row steps, for two more dispatches of fixed cost; shorter batches and
# batched decode steps keep the token-serial rule. Measured on an H100 (qwen35-4b's DeltaNet, us a
# layer with qknorm and the norm, `DN_T=64,512 python3 perf/deltanet_chunk_time.py [DN_FLAVOR=dawn]`,
# perf/h200/deltanet-chunk-2026-12-06-h100.txt): wgpu-native token-serial 144 / 900 at T = 64 / 512,
# chunked 92 / 420; Dawn token-serial 69 / 509, chunked 91 / 404. So the chunked rule from one full
# chunk on wgpu-native, and on Dawn from 160 rows, where the two lines through those points cross.
CHUNK_ROWS = 32
CHUNK_ROWS_DAWN = 160
CHUNK = 32  # rows a chunk (deltanet_chunk_intra.wgsl's C: its C x 32 tiles fit 16 KiB of workgroup memory)
CHUNK_MAX_DK = 128  # deltanet_chunk_state.wgsl keeps a d_k x 16 block of S in workgroup memory
MAX_DK = 256  # the rule kernel's qs and ks, d_k floats each in workgroup memory


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --- gated attention

def head_slice_dispatch(kernels: Kernels, src, dst, n_heads: int, head_dim: int, part: int, T: int) -> Dispatch:
    """dst [T, H * D] = part `part` of each head's [first | second] of src [T, H * 2D]."""
    if part not in (0, 1):
        raise ValueError(f"a head has two parts, not part {part}")
    n = T * n_heads * head_dim
    pipe = kernels.pipeline("gated_attn", "head_slice")
    p = KS._params(kernels, KS._pack([("n", "u32", n), ("head_dim", "u32", head_dim), ("part", "u32", part)]),
                   None, "head_slice")
    return Dispatch(pipe, kernels.bind(pipe, [p, src, None, dst]), KS._flat_groups(kernels, n),
                    f"head_slice {n_heads}x{head_dim}")


def sigmoid_mul_dispatch(kernels: Kernels, x, gate, y, n: int) -> Dispatch:
    """y = x * sigmoid(gate), n values."""
    pipe = kernels.pipeline("gated_attn", "sigmoid_mul")
    p = KS._params(kernels, KS._pack([("n", "u32", n), ("head_dim", "u32", 1), ("part", "u32", 0)]), None,
                   "sigmoid_mul")
    return Dispatch(pipe, kernels.bind(pipe, [p, x, gate, y]), KS._flat_groups(kernels, n), "sigmoid_mul")


def lower_head_slice(lower, op: HeadSlice) -> list[Dispatch]:
    x = lower.current(op.src)
    y = lower.target(op.dst, op.src)
    return [head_slice_dispatch(lower.k, x, y, op.n_heads, op.head_dim, op.part, lower.rows)]


def lower_sigmoid_mul(lower, op: SigmoidMul) -> list[Dispatch]:
    x, g = lower.current(op.buf), lower.current(op.gate)
    y = lower.target(op.buf, op.buf, op.gate)
    return [sigmoid_mul_dispatch(lower.k, x, g, y, lower.rows * lower.be.widths[op.buf])]


# --- the DeltaNet mixer

def check_spec(m: DeltaNetSpec) -> None:
    if m.d_k != m.d_v or not 0 < m.d_k <= MAX_DK:
        raise UnsupportedError(f"the GPU DeltaNet needs d_k == d_v <= {MAX_DK}, got {m.d_k} and {m.d_v}")
    if m.n_v_heads % m.n_k_heads:
        raise UnsupportedError(f"{m.n_v_heads} V-heads do not tile {m.n_k_heads} K-heads")


def conv_dispatch(kernels: Kernels, qkv, w, live, rows, rstate, u, m: DeltaNetSpec) -> Dispatch:
    """u [T, conv_dim] = silu(the causal conv of each live row through its slot's conv state)."""
    pipe = kernels.pipeline("deltanet_conv", "conv", K=m.d_conv)
    p = KS._params(kernels, KS._pack([("conv_dim", "u32", m.conv_dim), ("d_conv", "u32", m.d_conv),
                                      ("slot_stride", "u32", m.state_floats)]), None, "deltanet_conv")
    return Dispatch(pipe, kernels.bind(pipe, [p, qkv, w, live, rows, rstate, u]), (-(-m.conv_dim // CONV_WG), 1, 1),
                    f"deltanet_conv {m.conv_dim}x{m.d_conv}")


def rule_layout(d_k: int) -> dict[str, int]:
    """deltanet_rule.wgsl's split of a head's S (its header): WC columns a workgroup, R invocations a
    column (R divides d_k), so an invocation keeps d_k / R floats (16 at d_k 128)."""
    R = next(r for r in (8, 4, 2, 1) if d_k % r == 0)
    return {"DK": d_k, "WC": min(_pow2(d_k), 32), "R": R}


def qknorm_dispatch(kernels: Kernels, u, live, m: DeltaNetSpec, eps: float, T: int) -> Dispatch:
    """q and k of u [T, conv_dim] L2-normalised in place, per row and K-head (prompt batches)."""
    lay = rule_layout(m.d_k)
    pipe = kernels.pipeline("deltanet_qknorm", "main", DK=m.d_k, WG=lay["WC"] * lay["R"])  # the rule's sum order
    p = KS._params(kernels, KS._pack([("h_k", "u32", m.n_k_heads), ("conv_dim", "u32", m.conv_dim),
                                      ("eps", "f32", eps)]), None, "deltanet_qknorm")
    return Dispatch(pipe, kernels.bind(pipe, [p, live, u]), (2 * m.n_k_heads, T, 1), f"deltanet_qknorm {m.n_k_heads}x{m.d_k}")


def chunk_scratch_sizes(m: DeltaNetSpec, n_slots: int, T: int) -> tuple[int, int]:
    """Bytes of the chunked rule's scratch: cs (W, U [T, H_v, d_k], M [T, H_v, CHUNK], gamma [T, H_v])
    and idx (each slot's row count, then its row ids)."""
    return 4 * T * m.n_v_heads * (2 * m.d_k + CHUNK + 1), 4 * n_slots * (T + 1)


def can_chunk(kernels: Kernels, m: DeltaNetSpec) -> bool:
    """d_k within the state pass's block (and a multiple of 4: it reads u and its scratch as vec4s)."""
    return m.d_k <= CHUNK_MAX_DK and m.d_k % 4 == 0 and int(kernels.dev.limits.get("max-compute-workgroup-storage-size", 16384)) >= 16384


def chunk_dispatches(kernels: Kernels, u, beta, alpha, consts, live, rows, rstate, o, m: DeltaNetSpec,
                     n_slots: int, T: int, scratch=None) -> list[Dispatch]:
    """The chunked gated delta rule (wgsl/deltanet_chunk_*.wgsl; derivation: tests/test_deltanet_chunk.py)
    into o, as the token-serial rule writes it, with the same state in rstate: each slot's rows indexed,
    then every (chunk, V-head, slot)'s W, U and masked Q K^T in parallel, then per (V-head, column
    block, slot) the chunks in order through the state. q and k must come normalised (qknorm_dispatch).
    scratch: (cs, idx) of chunk_scratch_sizes' bytes (or more), else made here."""
    if scratch is None:
        scratch = tuple(storage(kernels.dev, n, label=f"deltanet.chunk.{name}")
                        for n, name in zip(chunk_scratch_sizes(m, n_slots, T), ("cs", "idx")))
    cs, idx = scratch
    scale = float(np.float32(1.0 / np.sqrt(m.d_k)))
    H = m.n_v_heads
    ipipe = kernels.pipeline("deltanet_chunk_index", "main", unchecked=True)
    pi = KS._params(kernels, KS._pack([("cap", "u32", T), ("n_slots", "u32", n_slots)]), None, "deltanet_chunk_index")
    index = Dispatch(ipipe, kernels.bind(ipipe, [pi, live, rows, idx]), (n_slots, 1, 1), f"deltanet_chunk_index {n_slots}")
    # every index of the chunk kernels is in range by construction (as Dawn runs them): no wgpu clamps
    apipe = kernels.pipeline("deltanet_chunk_intra", "main", unchecked=True, DK=m.d_k)
    pa = KS._params(kernels, KS._pack([("h_k", "u32", m.n_k_heads), ("h_v", "u32", H), ("conv_dim", "u32", m.conv_dim),
                                       ("cap", "u32", T), ("n_slots", "u32", n_slots), ("scale", "f32", scale)]),
                    None, "deltanet_chunk_intra")
    intra = Dispatch(apipe, kernels.bind(apipe, [pa, u, beta, alpha, consts, idx, cs]), (-(-T // CHUNK), H, n_slots),
                     f"deltanet_chunk_intra {H}x{m.d_k}")
    spipe = kernels.pipeline("deltanet_chunk_state", "main", unchecked=True, DK=m.d_k)
    ps = KS._params(kernels, KS._pack([("h_k", "u32", m.n_k_heads), ("h_v", "u32", H), ("conv_dim", "u32", m.conv_dim),
                                       ("cap", "u32", T), ("n_slots", "u32", n_slots),
                                       ("slot_stride", "u32", m.state_floats),
                                       ("s_base", "u32", (m.d_conv - 1) * m.conv_dim), ("scale", "f32", scale)]),
                    None, "deltanet_chunk_state")
    nb = -(-m.d_k // 16)  # deltanet_chunk_state.wgsl's WC
    state = Dispatch(spipe, kernels.bind(spipe, [ps, u, idx, rows, cs, rstate, o]), (nb * H, n_slots, 1),
                     f"deltanet_chunk_state {H}x{m.d_k}")
    return [index, intra, state]


def chunk_rows(dev) -> int:
    """The smallest prompt batch that takes the chunked rule on `dev` (the knob, else by flavor)."""
    least = TU.current().deltanet_chunk_rows
    if least is not None:
        return least
    return CHUNK_ROWS_DAWN if dev.dawn else CHUNK_ROWS


def rule_dispatches(kernels: Kernels, u, beta, alpha, z, consts, live, rows, rstate, o, dst, m: DeltaNetSpec,
                    eps: float, n_slots: int, T: int, xq=None, pre: bool | None = None, chunk: bool | None = None,
                    scratch=None) -> list[Dispatch]:
    """dst [T, H_v * d_v] = the delta rule's output of each live row (into o, scratch of that size),
    then gated-RMSNormed times silu(z); with xq (KQ.scratch) dst also rounded to 8 bits there, for
    the output projection's int8 GEMV (KS.can_round_output). `pre` (default: T >= PRE_ROWS): q and k
    normalised first by a parallel pass, so the token-serial rule has two barriers a row, not a dozen.
    `chunk` (default: T >= CHUNK_ROWS, CHUNK_ROWS_DAWN on Dawn, where can_chunk): the chunked rule (chunk_dispatches, its
    scratch) instead of the token-serial one."""
    check_spec(m)
    if T > 65535:
        raise UnsupportedError(f"the DeltaNet kernels take at most 65535 rows a pass, not {T}")
    if chunk is None:
        chunk = T >= chunk_rows(kernels.dev) and can_chunk(kernels, m)
    pre = chunk or (T >= PRE_ROWS if pre is None else pre)
    if chunk:
        rule = chunk_dispatches(kernels, u, beta, alpha, consts, live, rows, rstate, o, m, n_slots, T, scratch)
    else:
        lay = rule_layout(m.d_k)
        pipe = kernels.pipeline("deltanet_rule", "main", PRE="true" if pre else "false", **lay)
        data = KS._pack([("h_k", "u32", m.n_k_heads), ("h_v", "u32", m.n_v_heads), ("conv_dim", "u32", m.conv_dim),
                         ("slot_stride", "u32", m.state_floats), ("s_base", "u32", (m.d_conv - 1) * m.conv_dim),
                         ("eps", "f32", eps), ("scale", "f32", float(np.float32(1.0 / np.sqrt(m.d_k))))])
        p = KS._params(kernels, data, None, "deltanet_rule")
        nb = -(-m.d_k // lay["WC"])
        rule = [Dispatch(pipe, kernels.bind(pipe, [p, u, beta, alpha, consts, live, rows, rstate, o]),
                         (nb * m.n_v_heads, n_slots, 1), f"deltanet_rule {m.n_v_heads}x{m.d_k}")]
    npipe = kernels.pipeline("deltanet_norm", "main", DK=m.d_k, **KS.q8_out_consts(xq, m.n_v_heads, m.d_v, 6))
    pn = KS._params(kernels, KS._pack([("h_v", "u32", m.n_v_heads), ("eps", "f32", eps)]), None, "deltanet_norm")
    norm = Dispatch(npipe, kernels.bind(npipe, [pn, o, z, consts, live, dst] + ([xq] if xq is not None else [])),
                    (m.n_v_heads, T, 1),
                    f"deltanet_norm {m.n_v_heads}x{m.d_k}")
    return ([qknorm_dispatch(kernels, u, live, m, eps, T)] if pre else []) + rule + [norm]


class RecurrentStates:
    """The DeltaNet layers' state on the GPU (module docstring), their small weights as f32 (the
    conv [conv_dim, d_conv]; consts = [dt_bias | a | norm]), the mixer's scratch, and where each
    slot's state stands (`pos`: the next position it expects)."""

    def __init__(self, dev, gf, plan, max_seqs: int, max_rows: int):
        from gguf.quants import dequantize

        self.dev, self.max_seqs = dev, max_seqs
        self.buffers, self.conv, self.consts, self.specs = {}, {}, {}, {}
        self.pos: dict[int, int] = {}
        self.vram = 0

        def f32(name: str) -> np.ndarray:
            t = gf.tensor(name)
            return np.asarray(dequantize(np.asarray(t.raw), t.qtype), np.float32).reshape(-1)

        widest = 0
        for op in plan.ops:
            if not isinstance(op, DeltaNet):
                continue
            m = op.spec
            check_spec(m)
            nbytes = 4 * m.state_floats * max_seqs
            if nbytes > dev.max_binding:
                raise UnsupportedError(f"layer {op.layer}: the recurrent state of {max_seqs} sequences "
                                       f"({nbytes >> 20} MiB) exceeds one storage binding; run fewer in parallel")
            self.specs[op.layer] = m
            self.buffers[op.layer] = storage(dev, nbytes, label=f"recurrent.{op.layer}")
            self.conv[op.layer] = storage(dev, f32(op.conv), label=op.conv)
            self.consts[op.layer] = storage(dev, np.concatenate([f32(op.dt_bias), f32(op.a), f32(op.norm)]),
                                            label=f"{op.dt_bias}|a|norm")
            self.vram += nbytes + 4 * (m.conv_dim * m.d_conv + 2 * m.n_v_heads + m.d_v)
            widest = max(widest, m.conv_dim)
        heads = max((m.n_v_heads for m in self.specs.values()), default=0)
        self.u = storage(dev, 4 * max_rows * max(widest, 1), label="deltanet.u") if self.specs else None
        values = max((m.n_v_heads * m.d_v for m in self.specs.values()), default=0)
        self.o = storage(dev, 4 * max_rows * max(values, 1), label="deltanet.o") if self.specs else None
        self.vram += (self.u.size + self.o.size) if self.specs else 0
        # the chunked rule's scratch (chunk_dispatches), shared by the layers as u and o are
        self.chunk = None
        if self.specs:
            sizes = [chunk_scratch_sizes(m, max_seqs, max_rows) for m in self.specs.values()]
            self.chunk = tuple(storage(dev, max(n), label=f"deltanet.chunk.{name}")
                               for n, name in zip(zip(*sizes), ("cs", "idx")))
            self.vram += sum(b.size for b in self.chunk)

    @staticmethod
    def tensors(plan) -> frozenset[str]:
        """The weights this class uploads itself (f32 copies, not the matmul layout)."""
        return frozenset(n for op in plan.ops if isinstance(op, DeltaNet) for n in op.tensors)

    def __bool__(self) -> bool:
        return bool(self.specs)

    # --- where each slot's state stands

    def check_rows(self, positions, slots) -> None:
        """Refuse rows the kernels would compute wrong: each slot's rows, in batch order, are
        consecutive positions from 0 (a fresh start) or from where its state stands."""
        pos, slot = np.asarray(positions, np.int64), np.asarray(slots, np.int64)
        for s in np.unique(slot):
            p = pos[slot == s]
            if len(p) > 1 and not (np.diff(p) == 1).all():
                raise InfrError(f"slot {int(s)}'s rows are not consecutive positions in batch order")
            at = self.pos.get(int(s))
            if p[0] != 0 and at != p[0]:
                raise InfrError(f"slot {int(s)} resumes at position {int(p[0])}, but its recurrent state stands at "
                                f"{'none' if at is None else f'position {at}'}: a recurrent model's sequence cannot "
                                f"skip or rewind positions")

    def advance(self, positions, slots, steps: int = 1) -> None:
        """After a pass (or `steps` decode steps) over these rows: each slot stands past its last row."""
        pos, slot = np.asarray(positions, np.int64), np.asarray(slots, np.int64)
        for s in np.unique(slot):  # a slot's last row in batch order (check_rows: its highest position)
            self.pos[int(s)] = int(pos[slot == s][-1]) + steps

    # --- checkpoints

    def _span(self, layer: int, slot: int) -> tuple[int, int]:
        if not 0 <= slot < self.max_seqs:
            raise InfrError(f"slot {slot} is outside 0..{self.max_seqs - 1}")
        n = 4 * self.specs[layer].state_floats
        return slot * n, n

    def save(self, slot: int) -> dict:
        """A GPU copy of every DeltaNet layer's state of slot (a buffer per layer) and its position."""
        enc = self.dev.device.create_command_encoder()
        snap = {}
        for layer, buf in self.buffers.items():
            off, n = self._span(layer, slot)
            snap[layer] = storage(self.dev, n, label=f"snapshot.{layer}")
            enc.copy_buffer_to_buffer(buf, off, snap[layer], 0, n)
        self.dev.device.queue.submit([enc.finish()])
        return {"layers": snap, "pos": self.pos.get(slot)}

    def load(self, slot: int, snap: dict, pos: int) -> None:
        layers = snap["layers"] if isinstance(snap, dict) else None
        if layers is None or set(layers) != set(self.buffers):
            raise InfrError("load_state takes a snapshot that save_state of this backend made")
        enc = self.dev.device.create_command_encoder()
        for layer, buf in self.buffers.items():
            off, n = self._span(layer, slot)
            enc.copy_buffer_to_buffer(layers[layer], 0, buf, off, n)
        self.dev.device.queue.submit([enc.finish()])
        self.pos[slot] = int(pos)

    def read(self, slot: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Slot's state read back, per layer (conv [d_conv - 1, conv_dim], S [H_v, d_k, d_v]): tests."""
        out = {}
        for layer, buf in self.buffers.items():
            m = self.specs[layer]
            off, n = self._span(layer, slot)
            raw = np.frombuffer(self.dev.device.queue.read_buffer(buf, off, n), np.float32)
            k = (m.d_conv - 1) * m.conv_dim
            out[layer] = (raw[:k].reshape(m.d_conv - 1, m.conv_dim).copy(),
                          raw[k:].reshape(m.n_v_heads, m.d_k, m.d_v).copy())
        return out


def deltanet_dispatches(lower, op: DeltaNet) -> list[Dispatch]:
    """The DeltaNet op for the lowering's batch (module docstring)."""
    be, k, m = lower.be, lower.k, op.spec
    rs: RecurrentStates = be.recurrent
    live, rows = be.paging.state, be.paging.rows
    qkv, z, beta, alpha = (lower.current(n) for n in (op.qkv, op.z, op.beta, op.alpha))
    y = lower.target(op.dst, op.qkv, op.z, op.beta, op.alpha)
    buf, consts = rs.buffers[op.layer], rs.consts[op.layer]
    K = m.n_v_heads * m.d_v
    # the output projection reads the rounded copy the norm kernel writes (as attention's o projection)
    xq = KQ.scratch(k, K, lower.rows) if KS.can_round_output(m.n_v_heads, m.d_v) and lower._feeds_gemv_q8(op.dst, K) else None
    # a batched decode step (each slot a few rows: lower.decode) keeps the token-serial rule, however
    # many slots; batches with a longer run of one slot take the chunked rule from CHUNK_ROWS rows
    ds = [conv_dispatch(k, qkv, rs.conv[op.layer], live, rows, buf, rs.u, m),
          *rule_dispatches(k, rs.u, beta, alpha, z, consts, live, rows, buf, rs.o, y, m, op.eps, rs.max_seqs,
                           lower.rows, xq, chunk=False if lower.decode else None, scratch=rs.chunk)]
    if xq is not None:
        lower.q8 = (y, K, xq)
    return ds

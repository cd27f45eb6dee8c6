"""Executes a plan with numpy: a batch of rows from any number of sequences.

The KV cache is a store of blocks per layer ([n_blocks * block_size, kv_heads,
head_dim], float16 as llama.cpp's default cache is, so rounding matches the
oracle); a sequence reaches its keys through its block table (infr/kvpool.py).
Sliding-window layers have a store and block tables of their own, sized for
their windows (infr/kvseq.py); their released blocks are never read.
Generated (decode) rows and the head's rows of a matmul whose input is rounded to
8 bits go through integer sums (infr/cpu/mmq.py): every such row of a step at
once, each weight read once, each row's result what it is alone. Prompt rows
go by position block through float gemms; attention runs per sequence over its
own keys.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

from infr.batch import Batch, StepResult
from infr.cpu import kinds
from infr.cpu import mmq
from infr.cpu import ops as F
from infr.cpu.deltanet import RecurrentStore
from infr.cpu.weights import WeightStore, check_supported
from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.kvpool import BLOCK_SIZE, KVBudget, store_sizes
from infr.memory import free_ram_bytes
from infr.ops import Add, Attention, Embed, GatedAct, MatMul, RMSNorm, Rope, Softcap, StoreKV
from infr.plan import Plan, bind
from infr.sampling import host_sample


class ContextFullError(InfrError):
    pass


class CPUBackend:
    name = "cpu"
    multi_step = 1  # the engine runs one step per call (each step's tokens are known at once)
    max_rows = 1 << 20  # no buffers sized by it: the engine's budget decides

    def __init__(self, gf: GGUFFile, plan: Plan, n_ctx: int, kv_blocks: "int | KVBudget | None" = None,
                 block_size: int = BLOCK_SIZE, max_seqs: int | None = None, batch_tokens: int | None = None):
        """`max_seqs`, `batch_tokens`: the engine's sequences and rows a step, which size the
        sliding-window layers' store (kvpool.store_sizes; None: as large as the full one's)."""
        self.gf, self.n_ctx = gf, n_ctx
        for name in plan.weights():
            check_supported(gf.tensor(name))  # missing tensor / unsupported type fail at load
        self.plan = plan = bind(plan, gf)  # shapes checked; each matmul's numerics (MatMul.q8) set
        self.w = WeightStore(gf)
        # Integer lanes of every matmul that takes 8-bit input, where its type has them (mmq.supports);
        # consecutive ones that read one value (q, k, v; gate, up) share one set, side by side (_fused_runs).
        # Made on first use (mmq.Lazy): a 0.5B model's lanes took ~1.8 s of a cold start otherwise.
        self._mmq: dict[int, tuple[str, mmq.Lazy, slice]] = _fused_runs(gf, plan.embed + plan.layers + plan.head)
        self.lanes = {key: lanes for key, lanes, _ in self._mmq.values()}
        # Float copies only of what some op reads as floats: the head's rows (all alone) of a matmul with
        # lanes never do, and the embedding table is gathered row by row from its blocks.
        head = {id(op) for op in plan.head}
        floats = {op.weight for op in plan.ops
                  if isinstance(op, MatMul) and (id(op) not in head or id(op) not in self._mmq)}
        skip = ({op.weight for op in plan.head if isinstance(op, MatMul)} | set(plan.row_tables)) - floats
        skip |= plan.expert_banks  # experts: read as chosen (infr/cpu/moe.py)
        self.w.load_all(plan.weights(), skip=frozenset(skip))
        self.block_size = int(block_size)
        self.blocks_per_seq = -(-n_ctx // self.block_size)
        # (a KVBudget is sized now: the weights are in)
        self.n_blocks, self.n_window_blocks = store_sizes(self, plan, kv_blocks, self.block_size, self.blocks_per_seq,
                                                          max_seqs, batch_tokens)
        self.k_cache: dict[int, np.ndarray] = {}
        self.v_cache: dict[int, np.ndarray] = {}
        self.windowed = {st.layer: bool(st.window) for st in plan.kv}  # which store and tables a layer uses
        for st in plan.kv:
            rows = (self.n_window_blocks if st.window else self.n_blocks) * self.block_size
            self.k_cache[st.layer] = np.zeros((rows, st.n_kv_heads, st.head_dim), np.float16)
            self.v_cache[st.layer] = np.zeros((rows, st.n_kv_heads, st.v_head_dim), np.float16)
        # DeltaNet layers' state per sequence slot (infr/cpu/deltanet.py): started at a sequence's position 0
        self.recurrent = RecurrentStore({st.layer: st.spec for st in plan.recurrent})
        ropes: dict = {}
        self._body_ops = [self._compile(op, ropes) for op in plan.embed + plan.layers]
        self._head_ops = [self._compile(op, ropes) for op in plan.head]

    @property
    def kv_bytes_per_token(self) -> int:
        return self.plan.kv_bytes_per_token()

    # --- one sequence (tools and tests): slot 0 over blocks 0.. in order

    def forward(self, tokens: list[int] | np.ndarray, start: int, n_logits: int = 1) -> np.ndarray:
        """Run tokens at positions start.. of one sequence; logits [n_logits, vocab] of the last rows.
        Uses blocks 0.. as that sequence's cache: not for a backend an engine schedules on. One token
        past position 0 is a decode step: its row goes alone, as the engine's generated rows do."""
        ids = np.asarray(tokens, dtype=np.int64)
        if start + len(ids) > self.n_ctx:
            raise ContextFullError(
                f"context full: {start + len(ids)} tokens do not fit in a context of {self.n_ctx}"
            )
        self._check_ids(ids)
        if self.n_window_blocks < self.blocks_per_seq:
            raise InfrError("forward() runs one sequence over blocks 0..: this backend's sliding-window store "
                            "holds less than one context (it is sized for the engine's step())")
        pos = np.arange(start, start + len(ids))
        table = {0: list(range(self.blocks_per_seq))}
        decode = np.full(len(ids), len(ids) == 1 and start > 0)
        x = self._body(ids, pos, np.zeros(len(ids), np.int32), table, decode)
        return self._head(x[-n_logits:] if n_logits > 0 else x)

    # --- the engine's step

    def step(self, batch: Batch) -> StepResult:
        """Every row of the batch through the model; one sampled token per output row."""
        ids = np.asarray(batch.tokens, dtype=np.int64)
        self._check_ids(ids)
        if len(batch.positions) and int(batch.positions.max()) >= self.n_ctx:
            raise ContextFullError(f"context full: position {int(batch.positions.max())} is past {self.n_ctx}")
        gen = batch.generated
        x = self._body(ids, np.asarray(batch.positions, np.int64), batch.slots, batch.tables, gen, batch.window_tables)
        outs = batch.outputs
        if not outs:
            return StepResult([])
        rows = [o.row for o in outs]
        logits = self._head(x[rows])
        res = StepResult([host_sample(o, logits[i]) for i, o in enumerate(outs)])
        res.logits = {i: logits[i] for i, o in enumerate(outs) if o.want_logits}
        return res

    def free_memory(self) -> tuple[int, str] | None:
        return free_ram_bytes()

    def warm(self, rows: int, far: bool = False) -> None:
        """Nothing to build ahead: numpy runs each step as it comes."""

    def save_state(self, slot: int) -> object:
        """Copies of slot's DeltaNet states (backends.RecurrentStates)."""
        return self.recurrent.snapshot(slot)

    def load_state(self, slot: int, snap: object, pos: int) -> None:
        self.recurrent.restore(slot, snap, pos)

    def samples(self, params) -> bool:
        """The reference draws every sampled row with the request's host sampler (infr/sampling.py)."""
        return False

    def decode_steps(self, batch: Batch, k: int, stop=None) -> Generator[list[int], None, None]:
        """k greedy steps of a batch of decode rows: step() k times, each step's tokens fed to the next
        (none after stop() is true: nothing runs ahead here)."""
        for _ in range(k):
            if stop is not None and stop():
                return
            tokens = self.step(batch).tokens
            yield tokens
            batch = Batch(np.asarray(tokens, np.int32), batch.positions + 1, batch.slots, batch.tables, batch.outputs,
                          np.ones(batch.rows, bool), batch.window_tables)

    # --- execution

    def _check_ids(self, ids: np.ndarray) -> None:
        if len(ids) and (ids.min() < 0 or ids.max() >= self.plan.spec.n_vocab):
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")

    def _physical(self, pos: np.ndarray, slots: np.ndarray, tables: dict[int, np.ndarray], n_blocks: int) -> np.ndarray:
        """Store rows of (slot, position) pairs, in a store of n_blocks blocks."""
        bs = self.block_size
        out = np.empty(len(pos), np.int64)
        for s in np.unique(slots):
            sel = slots == s
            table = tables[int(s)]
            p = pos[sel]
            if len(p) and int(p.max()) // bs >= len(table):
                raise InfrError(f"position {int(p.max())} of slot {int(s)} is past its {len(table)} KV blocks")
            blocks = table[p // bs]
            if len(p) and not 0 <= int(blocks.min()) <= int(blocks.max()) < n_blocks:
                raise InfrError(f"slot {int(s)} writes KV into a block outside 0..{n_blocks - 1} (or a released one)")
            out[sel] = blocks * bs + p % bs
        return out

    def _body(self, ids: np.ndarray, pos: np.ndarray, slots: np.ndarray, tables: dict[int, list[int]],
              generated: np.ndarray | None = None, window_tables: dict[int, list[int]] | None = None) -> np.ndarray:
        env: dict[str, np.ndarray] = {}
        slots = np.asarray(slots)
        full = {int(s): np.asarray(t, np.int64) for s, t in tables.items()}
        win = full if window_tables is None else {int(s): np.asarray(t, np.int64) for s, t in window_tables.items()}
        # A released window block (kvseq.RELEASED) is older than every row's window: its keys are masked, so any
        # block stands in for it in the gathers (_Rows.groups); a write into one is refused (_physical).
        phys = self._physical(pos, slots, full, self.n_blocks)
        same = window_tables is None and self.n_window_blocks == self.n_blocks  # one table, one size: one answer
        wphys = phys if same else self._physical(pos, slots, win, self.n_window_blocks)
        ctx = _Rows(pos, slots, {False: full, True: win}, {False: phys, True: wphys}, generated)
        for run in self._body_ops:
            run(env, ids, ctx)
        return env["x"]

    def _head(self, x: np.ndarray) -> np.ndarray:
        env = {"x": x}
        ctx = _Rows.only(len(x))
        for run in self._head_ops:
            run(env, None, ctx)
        return env["logits"]

    def _compile(self, op, ropes: dict) -> Callable[[dict, np.ndarray | None, "_Rows"], None]:
        """op as a function of (env, ids, rows), with what it needs from the plan and the weights
        looked up once, at load: its arrays, its numerics (MatMul.q8), which rope table it shares."""
        w = self.w
        new_kind = kinds.compile_op(self, op)  # MoE, llama4's attention options (infr/cpu/kinds.py)
        if new_kind is not None:
            return new_kind
        if isinstance(op, MatMul):
            bias = w[op.bias] if op.bias else None
            src, dst = op.src, op.dst
            if id(op) in self._mmq:
                key, lanes, cols = self._mmq[id(op)]
                # the head's weight has no float copy: its rows are all alone (_Rows.only)
                wt = None if any(op is h for h in self.plan.head) else w[op.weight].T
                parts = self._parts

                def matmul(env, ids, ctx):
                    y = _matmul_q8(env, key, parts(env, src), lanes, cols, wt, ctx)
                    if bias is not None:
                        y += bias
                    env[dst] = y
                return matmul
            wt = w[op.weight].T
            rounded = self._rounded if op.q8 else None

            def matmul(env, ids, ctx):
                x = env[src] if rounded is None else rounded(env, src)
                y = _matmul(x, wt, ctx)
                if bias is not None:
                    y += bias
                env[dst] = y
            return matmul
        if isinstance(op, RMSNorm):
            g = w[op.weight]
            return lambda env, ids, ctx: env.__setitem__(op.dst, F.rms_norm(env[op.src], g, op.eps, op.group))
        if isinstance(op, Rope):
            ff = w[op.rope.freq_factors] if op.rope.freq_factors else None
            key = ropes.setdefault((op.rope, op.rope.freq_factors), len(ropes))  # q and k share one table a step

            def rope(env, ids, ctx):
                table = ctx.ropes.get(key)
                if table is None:
                    table = ctx.ropes[key] = F.rope_table(F.rope_angles(ctx.pos, op.rope, ff))
                env[op.buf] = F.rope_rotate(env[op.buf], op.n_heads, op.head_dim, table, op.rope.style)
            return rope
        if isinstance(op, StoreKV):
            kc, vc = self.k_cache[op.layer], self.v_cache[op.layer]
            windowed = self.windowed[op.layer]

            def store(env, ids, ctx):
                n = len(ctx.pos)
                kc[ctx.phys[windowed]] = env[op.k].reshape(n, kc.shape[1], kc.shape[2])
                vc[ctx.phys[windowed]] = env[op.v].reshape(n, vc.shape[1], vc.shape[2])
            return store
        if isinstance(op, Attention):
            return lambda env, ids, ctx: env.__setitem__(op.dst, self._attention(op, env[op.q], ctx))
        if isinstance(op, GatedAct):
            return lambda env, ids, ctx: env.__setitem__(op.dst, F.gated_act(env[op.gate], env[op.up], op.act))
        if isinstance(op, Add):
            return lambda env, ids, ctx: env.__setitem__(op.dst, env[op.a] + env[op.b])
        if isinstance(op, Embed):
            scale = np.float32(op.scale)
            return lambda env, ids, ctx: env.__setitem__(op.dst, w.rows(op.table, ids) * scale)
        if isinstance(op, Softcap):
            cap = np.float32(op.cap)
            return lambda env, ids, ctx: env.__setitem__(op.buf, np.tanh(env[op.buf] / op.cap) * cap)
        # a new op kind must be implemented here before a plan may use it
        raise NotImplementedError(type(op).__name__)

    def _parts(self, env: dict[str, np.ndarray], src: str) -> "_Q8":
        """Value src rounded to 8 bits, as integer parts (mmq.quantize): once per value for every
        matmul that reads it, as _rounded."""
        x = env[src]
        key = "q8p:" + src
        got = env.get(key)
        if got is None or got[0] is not x:
            env[key] = got = (x, _Q8(*mmq.quantize(x, self.plan.q8_rounding)))
        return got[1]

    def _rounded(self, env: dict[str, np.ndarray], src: str) -> np.ndarray:
        """Value src rounded to 8 bits (the input of a matmul marked q8): once per value for every
        matmul that reads it (q, k and v share one rounding, gate and up another; on SmolLM2's
        decode the numpy calls of the rounding were ~12 ms of a 57 ms token)."""
        x = env[src]
        key = "q8:" + src
        got = env.get(key)
        if got is None or got[0] is not x:  # another value under that name since: round it anew
            env[key] = got = (x, F.quantize_q8(x, self.plan.q8_rounding))
        return got[1]

    def _attention(self, op: Attention, q: np.ndarray, ctx: "_Rows") -> np.ndarray:
        """Each sequence's rows over that sequence's keys, gathered from its blocks. Its prompt rows go
        by position block (_Rows.blocks): block b's rows, at their offsets in BLOCK rows, over keys
        0 .. (b + 1) * BLOCK (the causal mask hides the later ones), so every product has one shape
        for a given position. Its generated rows go one at a time, over their own keys, as they ran
        when decoded. So a row's output is the same however the sequence's rows were chunked, batched
        or recomputed."""
        a = op.spec
        kc, vc = self.k_cache[op.layer], self.v_cache[op.layer]
        out = np.empty((q.shape[0], a.n_heads * a.v_head_dim), np.float32)
        for blocks, decoded in ctx.groups(self.block_size, self.windowed[op.layer]):
            for sel, offs, keys, pos in blocks:
                qb = np.zeros((BLOCK, q.shape[1]), np.float32)
                qb[offs] = q[sel]
                out[sel] = F.attention(qb, kc[keys], vc[keys], pos, len(keys), a.n_heads, a.scale, a.sliding_window,
                                       a.softcap, chunk=a.chunk)[offs]
            for r, keys in decoded:  # over its own keys only, as when it was decoded
                out[r : r + 1] = F.attention(q[r : r + 1], kc[keys], vc[keys], ctx.pos[r : r + 1], len(keys),
                                             a.n_heads, a.scale, a.sliding_window, a.softcap, chunk=a.chunk)
        return out


BLOCK = 64  # positions of a prompt-row block: one product shape per position (_matmul, _attention)


def _matmul(x: np.ndarray, wt: np.ndarray, rows: "_Rows") -> np.ndarray:
    """x @ wt with every row's sums independent of the other rows. BLAS sums a row in an order that
    depends on the product's shape and the row's place in it: a lone row (gemv) differs from a gemm,
    and on AVX-512 OpenBLAS (SkylakeX kernels) a gemm's row differs with the row count and offset
    too. With 8-bit activations one ulp can cross a rounding step, and a prompt's text then depended
    on what it was batched with. So generated tokens' rows (decode) go through gemv one at a time,
    and prompt rows by block of BLOCK positions of their sequence: each block one gemm of BLOCK rows,
    a row at its position's offset (zeros elsewhere); a 512-row prompt costs about one gemm (SmolLM2
    and Gemma-3 shapes, two threads). Padding every decode row instead made gemm pack the whole
    weight per row: SmolLM2 decode on one thread fell from 18.8 to 6.6 tokens/s. (Weights with integer
    lanes take their generated rows through _matmul_q8 instead: all at once, each weight read once.)"""
    y = np.empty((x.shape[0], wt.shape[1]), np.float32)
    for i in rows.one:
        y[i] = x[i] @ wt
    if rows.pos is not None:
        _blocks(x, wt, rows, y)
    return y


def _blocks(x: np.ndarray, wt: np.ndarray, rows: "_Rows", y: np.ndarray) -> None:
    """y[prompt rows] = x @ wt, by block of BLOCK positions (_matmul)."""
    buf = F.block_buffer(BLOCK, x.shape[1])
    for _, sel, offs in rows.blocks(rows.rest):
        buf[offs] = x[sel]
        y[sel] = (buf @ wt)[offs]
        buf[offs] = 0


class _Q8:
    """A value rounded to 8 bits: its integer parts (mmq.quantize) and, when a prompt row needs it,
    its float value (quantize_q8's, bit for bit)."""

    def __init__(self, q: np.ndarray, d: np.ndarray, s: np.ndarray):
        self.q, self.d, self.s = q, d, s
        self._x: np.ndarray | None = None

    @property
    def x(self) -> np.ndarray:
        if self._x is None:
            self._x = mmq.dequantized(self.q, self.d)
        return self._x

    def rows(self, sel: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(sel) == len(self.q):  # every row (sel is sorted and unique): no copies
            return self.q, self.d, self.s
        return self.q[sel], self.d[sel], self.s[sel]


def _matmul_q8(env: dict, key: str, x: _Q8, lanes: mmq.Lazy, cols: slice, wt: np.ndarray | None,
               rows: "_Rows") -> np.ndarray:
    """A matmul with 8-bit input and integer lanes: generated rows (and the head's) by integer sums
    (mmq.matmul: all at once, each as it is alone), prompt rows by position block as _matmul. The
    lanes may hold several matmuls of one input side by side (key names them): computed once a step,
    each takes its columns."""
    y = np.empty((x.q.shape[0], cols.stop - cols.start), np.float32)
    if rows.one:
        got = env.get(key)
        if got is None or got[0] is not x:
            env[key] = got = (x, mmq.matmul(*x.rows(rows.one), lanes.get()))
        y[rows.one] = got[1][:, cols]
    if rows.pos is not None and len(rows.rest):
        _blocks(x.x, wt, rows, y)
    return y


def _fused_runs(gf: GGUFFile, ops) -> dict[int, tuple[str, mmq.Lazy, slice]]:
    """Per matmul op with lanes (by id): the lanes it reads (made on first use), under a key, and its
    columns there. A run of consecutive matmuls of one input whose weights split alike (one group
    size, all or none with a min term) shares one set of lanes: one integer product a step for all of
    them. A row's sums do not depend on the columns beside it, so that is the same alone or batched too."""
    out: dict[int, tuple[str, mmq.Lazy, slice]] = {}
    made: dict[str, mmq.Lazy] = {}
    run: list = []  # (op, tensor, layout)

    def make(tensors):
        def lanes() -> mmq.Lanes:
            parts = [mmq.lanes(t.raw, t.qtype, t.shape) for t in tensors]
            if len(parts) == 1:
                return parts[0]
            return mmq.Lanes(np.concatenate([p.q for p in parts], axis=2), np.concatenate([p.a for p in parts], axis=1),
                             None if parts[0].m is None else np.concatenate([p.m for p in parts], axis=1),
                             parts[0].group)
        return lanes

    def close() -> None:
        if not run:
            return
        key = "mmq:" + "|".join(op.weight for op, _, _ in run)
        if key not in made:
            made[key] = mmq.Lazy(make([t for _, t, _ in run]))
        at = 0
        for op, t, _ in run:
            n = int(t.shape[0])
            out[id(op)] = (key, made[key], slice(at, at + n))
            at += n
        run.clear()

    for op in ops:
        if not (isinstance(op, MatMul) and op.q8):
            close()
            continue
        t = gf.tensor(op.weight)
        if not mmq.supports(t.qtype):
            close()
            continue
        lay = mmq.layout(t.qtype)
        if run and (run[0][0].src != op.src or run[0][2] != lay):
            close()
        run.append((op, t, lay))
    close()
    return out


class _Rows:
    """Where a batch's rows live: positions, slots and store rows, which rows are generated, and per
    sequence its block tables (computed once per step, used by every layer). tables and phys are
    keyed by whether a layer is a sliding-window one (its own store and tables)."""

    def __init__(self, pos: np.ndarray | None, slots: np.ndarray, tables: dict[bool, dict[int, np.ndarray]],
                 phys: dict[bool, np.ndarray], generated: np.ndarray | None = None):
        self.pos, self.slots, self.tables, self.phys = pos, slots, tables, phys
        self.generated = generated
        n = len(slots)
        gen = np.zeros(n, bool) if generated is None else np.asarray(generated, bool)
        if pos is None:  # the head's rows: no positions, so every row alone
            gen = np.ones(n, bool)
        # The rows each matmul takes one at a time (generated) and the rest, found once a step.
        self.one: list[int] = np.flatnonzero(gen).tolist()
        self.rest = np.flatnonzero(~gen)
        self.ropes: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # a rope table per RopeSpec, this step's positions
        self._groups: dict[bool, list] = {}
        self._blocks: dict[int, list] = {}

    @classmethod
    def only(cls, n: int) -> "_Rows":
        """The head's n output rows, known by nothing else: each one alone (gemv)."""
        empty = np.zeros(0, np.int64)
        return cls(None, np.zeros(n, np.int64), {}, {False: empty, True: empty})

    def blocks(self, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """rows (prompt rows) by (sequence, position // BLOCK): (block index, the rows, their offsets)."""
        hit = self._blocks.get(id(rows))
        if hit is None:
            got = []
            if len(rows):
                p, s = self.pos[rows], self.slots[rows]
                keys = s.astype(np.int64) * (1 << 32) + p // BLOCK
                for k in np.unique(keys):
                    m = keys == k
                    got.append((int(k & 0xFFFFFFFF), rows[m], p[m] % BLOCK))
            hit = self._blocks[id(rows)] = (rows, got)  # rows kept: its id stays unique while cached
        return hit[1]

    def groups(self, bs: int, windowed: bool = False) -> list[tuple[list, list]]:
        """Per sequence, what every attention layer of the step (of one kind: windowed or not) reads,
        found once a step: its prompt rows' blocks as (rows, offsets, store rows of keys 0 ..
        (b + 1) * BLOCK, the block's positions), and its generated rows as (row, store rows of its
        own keys). The keys keep that shape whatever the window, so a row's sums do not depend on
        which blocks went back; a released block's entry reads block 0 (masked)."""
        if windowed not in self._groups:
            groups = self._groups[windowed] = []
            gen = self.generated
            for s in np.unique(self.slots):
                sel = np.flatnonzero(self.slots == s)
                table = np.maximum(self.tables[windowed][int(s)], 0)
                one = gen[sel] if gen is not None else np.zeros(len(sel), bool)
                blocks = []
                for b, rows, offs in self.blocks(sel[~one]):
                    j = np.arange((b + 1) * BLOCK)
                    page = j // bs
                    # keys past the table are masked (causal): any store row (row 0) stands in for them
                    keys = np.where(page < len(table), table[np.minimum(page, len(table) - 1)] * bs + j % bs, 0)
                    blocks.append((rows, offs, keys, b * BLOCK + np.arange(BLOCK)))
                decoded = []
                for r in sel[one]:
                    j = np.arange(int(self.pos[r]) + 1)
                    decoded.append((int(r), table[j // bs] * bs + j % bs))
                groups.append((blocks, decoded))
        return self._groups[windowed]

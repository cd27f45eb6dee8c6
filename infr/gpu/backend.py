"""Executes a plan on a WebGPU device: the same ops as the numpy reference.

At load: weights are uploaded once in their GGUF block layout, activation
buffers are planned from the op list, and for a batch shape (T tokens, n
logit rows) every pipeline, params buffer and bind group is built once and
cached (the ops become dispatches in infr/gpu/lowering.py; the cache and
the forms a step takes are infr/gpu/graphs.py). A forward call
then writes the token ids, each row's position and sequence slot (`rows`)
and the state buffer (live rows), encodes the prebuilt dispatches in one
compute pass and reads the logits back. The KV cache is paged
(docs/gpu_kernels.md; infr/gpu/kvstore.py, with the sliding-window layers'
store and table apart): one sequence is slot 0 over an identity block table;
`run_rows` runs rows of several sequences against a caller's table.

WebGPU forbids binding one buffer as read-only and writable in a dispatch,
so an op that writes a buffer it also reads (`x = x + o`, in-place norms)
writes the other half of a ping-pong pair.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict, deque
from collections.abc import Callable, Generator

import numpy as np

from infr.batch import Batch, OutputRow, StepResult
from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.kvpool import KVBudget, store_sizes
from infr.memory import free_device_bytes
from infr.numerics import check_supported, has_penalties
from infr.gpu import host_moe as HM
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_deltanet as KDN
from infr.gpu import kernels_mask as KMask
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_moe as KMoE
from infr.gpu import kernels_sample as KSA
from infr.gpu import profile
from infr.gpu import tuning as TU
from infr.gpu.device import Device, get_device
from infr.gpu.graphs import MAX_LOGIT_ROWS, Graphs
from infr.gpu.kvstore import KVStore
from infr.gpu.lowering import find_stacks
from infr.gpu.runtime import Dispatch, Kernels, Recording, encode_all, storage
from infr.plan import Plan, bind
from infr.sampling import SamplingParams, host_sample

MAX_BATCH = 512  # tokens per forward pass (llama.cpp's default ubatch); longer prompts run in chunks
TOKEN_LOG = 4096  # greedy tokens decoded on the GPU before the host must read them
TOKENS_PER_SUBMIT = 8
MAX_SEQS = 64  # sequence slots of the block table (run_rows)


def forward_chunks(backend, tokens, start: int, n_logits: int) -> tuple[np.ndarray, int, list[int]]:
    """forward()'s checks and chunking, one device or a split (infr/gpu/split.py): the ids, the
    logit rows (1 .. MAX_LOGIT_ROWS) and the chunks' bounds, MAX_BATCH rows each, the last one
    holding every logit row."""
    ids = np.asarray(tokens, dtype=np.uint32)
    if start + len(ids) > backend.n_ctx:
        raise InfrError(f"context full: {start + len(ids)} tokens do not fit in a context of {backend.n_ctx}")
    if len(ids) and int(ids.max()) >= backend.plan.spec.n_vocab:
        raise InfrError(f"token id out of range 0..{backend.plan.spec.n_vocab - 1}")
    n_logits = max(1, min(n_logits, len(ids)))
    if n_logits > MAX_LOGIT_ROWS:
        raise InfrError(f"at most {MAX_LOGIT_ROWS} logit rows per call on the GPU backend")
    bounds = list(range(0, len(ids), MAX_BATCH)) + [len(ids)]
    if len(ids) - bounds[-2] < n_logits:
        bounds[-2] = len(ids) - n_logits
    return ids, n_logits, bounds


class GPUBackend(Graphs):
    name = "gpu"
    max_rows = MAX_BATCH  # every step buffer holds MAX_BATCH rows

    def __init__(self, gf: GGUFFile, plan: Plan, n_ctx: int, dev: Device | None = None, kernels: Kernels | None = None,
                 progress=None, kv_blocks: "int | KVBudget | None" = None, block_size: int = KS.BLOCK_SIZE,
                 max_seqs: int = MAX_SEQS, batch_tokens: int | None = None, cpu_moe: int = 0):
        """`batch_tokens`: the engine's rows a step; given, the sliding-window layers' store is
        sized for max_seqs sequences' windows (kvpool.store_sizes), else as large as the full one.
        `cpu_moe`: the experts of the first cpu_moe MoE layers stay in host memory and run on the
        CPU reference (infr/gpu/host_moe.py)."""
        self.gf, self.plan, self.n_ctx = gf, plan, n_ctx
        self.block_size, self.max_seqs, self.batch_tokens = block_size, max_seqs, batch_tokens
        self.kv_blocks = kv_blocks  # the KV store's size in blocks (None: one context's worth; a KVBudget: free VRAM's)
        self.dev = dev or get_device()
        self.name = "dawn" if self.dev.dawn else "gpu"
        profile.install_from_env()
        self.kern = (kernels or _shared_kernels(self.dev)).rounding(plan.q8_rounding)  # the plan's 8-bit rounding
        for name in plan.weights():
            check_supported(gf.tensor(name))
        self.host_moe = HM.host_layers(plan, cpu_moe)  # layers whose experts run on the host
        host_banks = HM.host_banks(plan, self.host_moe)
        if self.host_moe:
            self.multi_step = 1  # a host round trip every step: the engine calls step(), one at a time
        self.weights: dict[str, list] = {}  # matrices: row chunks; vectors: [buffer]
        self.vram = 0
        self._progress = progress  # optional callable(stage, done, total): load progress bars (infr/notebook.py)
        weight_bytes = sum(gf.tensor(n).nbytes for n in plan.weights() if n not in host_banks)
        # Matmuls sharing their input (q, k, v) run as one GEMV over their rows stacked at upload.
        self.stacks = find_stacks(plan, gf, self.dev.max_binding)
        stacked = {name for names in self.stacks for name in names}
        for names in self.stacks:
            tensors = [gf.tensor(n) for n in names]
            self.weights[names] = KM.upload_stacked(self.dev, tensors, label="+".join(names))
            self.vram += sum(t.nbytes for t in tensors)
            self._report("upload", self.vram, weight_bytes)
        self.stack_bias = {}
        for names, biases in self.stacks.items():
            if any(biases):
                parts = [np.asarray(gf.tensor(b).raw, np.float32) if b else np.zeros(gf.tensor(n).shape[0], np.float32)
                         for n, b in zip(names, biases)]
                self.stack_bias[names] = storage(self.dev, np.concatenate(parts), label="stacked bias")
        own = KDN.RecurrentStates.tensors(plan)  # the DeltaNet's small weights: f32, with its state
        for name in plan.weights():
            if name in stacked or name in host_banks or name in own:
                continue
            t = gf.tensor(name)
            if name in plan.expert_banks:  # by expert ranges; the router picks experts on the GPU
                self.weights[name] = KMoE.upload_bank(self.dev, t)
            elif len(t.shape) == 2:
                self.weights[name] = KM.upload_weight(self.dev, t)
            else:
                self.weights[name] = [storage(self.dev, np.asarray(t.raw, np.float32), label=name)]
            self.vram += t.nbytes
            self._report("upload", self.vram, weight_bytes)
        self.plan = plan = bind(plan, gf)  # shapes checked; each matmul's numerics (MatMul.q8) set
        self.widths = plan.widths
        # the DeltaNet layers' per-slot state (kernels_deltanet); empty for a plan without them
        self.recurrent = KDN.RecurrentStates(self.dev, gf, plan, max_seqs, MAX_BATCH)
        self.vram += self.recurrent.vram
        self._own_state()
        self._report("graph", 1, 1)
        self._progress = None  # load only: later shapes build silently

    def _own_state(self) -> None:
        """What one sequence needs besides the weights: activations, ids, rows and
        state, the paged KV cache (n_blocks blocks, an identity block table for
        slot 0) and the graphs that bind them (the decode graph built now)."""
        spec, BS = self.plan.spec, self.block_size
        self.blocks_per_seq = -(-self.n_ctx // BS)  # a block table row: one context
        widest = max(la.attention.n_kv_heads * max(la.attention.head_dim, la.attention.v_head_dim)
                     for la in spec.layers) * 2  # bytes a token takes in one layer's K or V buffer
        # the stores, shared by every slot (a KVBudget is sized now: the weights are in)
        self.n_blocks, self.n_window_blocks = store_sizes(
            self, self.plan, self.kv_blocks, BS, self.blocks_per_seq, self.max_seqs if self.batch_tokens else None,
            self.batch_tokens, self.dev.max_binding // (widest * BS))
        self.buffers: dict[str, list] = {}
        for name in self.widths:
            self.buffers[name] = [self._activation(name, 0)]
        self.tail = storage(self.dev, MAX_LOGIT_ROWS * spec.n_embd * 4, label="x_tail")
        self.ids = storage(self.dev, MAX_BATCH * 4, label="ids")
        self.state = storage(self.dev, 16, label="state")
        self.rows = storage(self.dev, MAX_BATCH * 8, label="rows")
        self.kv = KVStore(self.dev, self.plan, self.state, self.rows, self.n_blocks, self.n_window_blocks, BS,
                          self.blocks_per_seq, self.max_seqs)
        self.k_cache, self.v_cache = self.kv.k, self.kv.v
        self.paging = self.kv.paging[False]  # the full layers' (and every kernel's that reads rows alone)
        self.vram += self.kv.vram
        self.token_log = storage(self.dev, 4 * TOKEN_LOG, label="token_log")
        self._free_staging: list = []  # mappable buffers the decode steps' token ids come back in
        self._graphs: OrderedDict[tuple[int, int, bool, bool], tuple] = OrderedDict()
        self._graph(1, 1)  # the decode graph: built at load
        if self._has_spans(1):  # and its form for steps past split_from keys
            self._graph(1, 1, True)

    def _activation(self, name: str, i: int):
        rows = MAX_LOGIT_ROWS if name == "logits" else MAX_BATCH
        self.vram += rows * self.widths[name] * 4
        return storage(self.dev, rows * self.widths[name] * 4, label=f"{name}.{i}")

    def _report(self, stage: str, done: int, total: int) -> None:
        if getattr(self, "_progress", None) is not None:
            self._progress(stage, done, total)

    # --- execution

    def forward(self, tokens, start: int, n_logits: int = 1) -> np.ndarray:
        ids, n_logits, bounds = forward_chunks(self, tokens, start, n_logits)
        out = []
        pos = start
        self._identity_table()
        if self.recurrent:
            self.recurrent.check_rows(np.arange(start, start + len(ids)), np.zeros(len(ids), np.int64))
        for a, b in zip(bounds[:-1], bounds[1:]):
            last = b == len(ids)
            out = self._run(ids[a:b], np.arange(pos, pos + b - a), np.zeros(b - a, np.uint32), n_logits if last else 0)
            pos += b - a
            if self.recurrent:
                self.recurrent.advance([pos - 1], [0])
        return out

    def run_rows(self, ids, positions, slots, block_table, n_logit_rows: int = 1, pad_to: int | None = None,
                 decode: bool | None = None) -> np.ndarray:
        """One forward pass over arbitrary rows: row t is token ids[t] at
        positions[t] of sequence slot slots[t], whose keys live in the blocks
        `block_table` gives it ([n_slots, blocks_per_seq] with n_slots <= max_seqs, or
        flat: entry s * blocks_per_seq + b is slot s's logical block b; uploaded as
        is). Every key a row attends, 0 .. positions[t] of its sequence, is in
        the cache or among the rows of this call. Returns the logits of the last
        n_logit_rows rows, [n_logit_rows, n_vocab].

        `pad_to`: run the graph of that many rows (>= len(ids)), the rows past
        len(ids) padding (the backend keeps graphs per batch shape). `decode`: the
        rows are a batched decode step (each sequence few rows; attention per row
        up to kernels_attention.DECODE_MAX_T rows); None decides from the slots."""
        ids = np.asarray(ids, np.uint32).reshape(-1)
        pos = np.asarray(positions, np.int64).reshape(-1)
        slot = np.asarray(slots, np.int64).reshape(-1)
        n, T = len(ids), max(len(ids), pad_to or 0)
        if not n or len(pos) != n or len(slot) != n:
            raise InfrError("run_rows needs one position and one slot per token id, and at least one row")
        if T > MAX_BATCH:
            raise InfrError(f"at most {MAX_BATCH} rows per forward pass, got {T}")
        if int(ids.max()) >= self.plan.spec.n_vocab:
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")
        per = self.blocks_per_seq
        if pos.min() < 0 or pos.max() >= per * self.block_size:
            raise InfrError(f"positions must lie in 0..{per * self.block_size - 1}")
        table = np.asarray(block_table, np.int64).reshape(-1)
        n_slots = table.size // per  # the table's first rows: slots 0 .. n_slots - 1
        if not 1 <= n_slots <= self.max_seqs or table.size % per:
            raise InfrError(f"the block table is 1..{self.max_seqs} slots of {per} entries, "
                            f"got {table.size} entries")
        if table.min() < 0 or table.max() >= self.n_blocks:
            raise InfrError(f"block table entries must lie in 0..{self.n_blocks - 1}")
        if slot.min() < 0 or slot.max() >= n_slots:
            raise InfrError(f"sequence slots must lie in 0..{n_slots - 1} (the table's rows)")
        if not 1 <= n_logit_rows <= min(n, MAX_LOGIT_ROWS):
            raise InfrError(f"n_logit_rows must lie in 1..{min(n, MAX_LOGIT_ROWS)}")
        if self.recurrent:
            self.recurrent.check_rows(pos, slot)
        self.kv.write(table)  # every layer kind reads this one table
        if decode is None:
            decode = int(np.bincount(slot).max()) <= KA.SPLIT_MAX_T
        ids_t = np.zeros(T, np.uint32)
        ids_t[:n] = ids
        pos_t, slot_t = np.zeros(T, np.uint32), np.zeros(T, np.uint32)
        pos_t[:n], slot_t[:n] = pos, slot
        out = self._run(ids_t, pos_t, slot_t, n_logit_rows, n_live=n, decode=decode)
        if self.recurrent:
            self.recurrent.advance(pos, slot)
        return out

    def _identity_table(self) -> None:
        """Slot 0 over blocks 0 .. n_blocks - 1 again (forward and the decode loops; run_rows writes others)."""
        self.kv.set_identity()

    def _run(self, ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, n_logits: int,
             n_live: int | None = None, decode: bool = False) -> np.ndarray:
        """The graph for len(ids) rows, the first n_live live (default all); the
        logits of live rows n_live - n_logits .. n_live - 1."""
        T = len(ids)
        n = T if n_live is None else n_live
        q = self.dev.device.queue
        q.write_buffer(self.ids, 0, ids)
        KS.write_rows(self.dev, self.paging, positions, slots, n)
        far = self._far(int(np.max(positions[:n])), 1, T, decode)
        body, head, x_buf = self._graph(T, n_logits, far, decode)
        timer = profile.timer_for(self.dev)
        if timer is not None and (len(body) + len(head) + 2 > timer.room or isinstance(body, HM.HostRecording)):
            timer = None  # too many dispatches for one query set, or host steps: this call goes untimed
        with profile.HostClock(timer, "encode"):
            enc = self._encode_body(self.dev.device.create_command_encoder(), body, timer, n)
            if n_logits:
                if n_logits != T:  # the head runs on the last live rows only
                    width = self.plan.spec.n_embd * 4
                    enc.copy_buffer_to_buffer(x_buf, (n - n_logits) * width, self.tail, 0, n_logits * width)
                _encode(enc, head, timer)
            cmd = profile.finish_encoder(enc, timer, T)
        with profile.HostClock(timer, "submit"):
            q.submit([cmd])
        if not n_logits:
            return np.zeros((0, self.plan.spec.n_vocab), np.float32)
        vocab = self.plan.spec.n_vocab
        logits_buf = self._logits_buffer(T, n_logits, far, decode)
        with profile.HostClock(timer, "wait"):
            raw = np.frombuffer(q.read_buffer(logits_buf, 0, n_logits * vocab * 4), np.float32)
        return raw.reshape(n_logits, vocab).copy()

    def _encode_body(self, enc, body, timer, n: int):
        """The graph body into enc; the encoder to go on in. A body with host MoE steps (cpu_moe)
        submits what precedes each step, runs it on the first n rows (the live ones) and goes on in
        a new encoder. A step of n >= submit_min_t rows submits all but the last of submit_parts
        parts of its body as it encodes them (infr.gpu.tuning: the GPU starts while the host goes on)."""
        if not isinstance(body, HM.HostRecording):
            tu = TU.current()
            split = tu.submit_parts > 1 and timer is None and n >= tu.submit_min_t
            pieces = body.parts(tu.submit_parts) if split else [body]
            for piece in pieces[:-1]:
                _encode(enc, piece)
                self.dev.device.queue.submit([enc.finish()])
                enc = self.dev.device.create_command_encoder()
            _encode(enc, pieces[-1], timer)
            return enc
        for part in body.parts:
            if isinstance(part, HM.HostMoE):
                self.dev.device.queue.submit([enc.finish()])
                part.run(self.dev, n)
                enc = self.dev.device.create_command_encoder()
            else:
                _encode(enc, part)
        return enc

    @property
    def kv_bytes_per_token(self) -> int:
        return self.plan.kv_bytes_per_token()

    # --- the engine's step

    def step(self, batch: Batch) -> StepResult:
        """Every row of the batch in one pass (graphs per power-of-two bucket of rows and of
        output rows). Greedy output rows take their token from an argmax on the GPU, sampled rows
        without a host sampler from the GPU's sampler (kernels_sample.StepSampling), a grammar's
        mask applied there first (kernels_mask); only the ids come back. Rows that ask for logits
        or carry a host sampler read their logits back and are sampled on the host."""
        outs = batch.outputs
        n, L = batch.rows, len(outs)
        if not 1 <= n <= MAX_BATCH:
            raise InfrError(f"a step runs 1..{MAX_BATCH} rows, got {n}")
        if L > MAX_LOGIT_ROWS:
            raise InfrError(f"a step samples at most {MAX_LOGIT_ROWS} rows, got {L}")
        if int(batch.tokens.max()) >= self.plan.spec.n_vocab or int(batch.tokens.min()) < 0:
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")
        if int(batch.positions.max()) >= self.blocks_per_seq * self.block_size:
            raise InfrError(f"context full: position {int(batch.positions.max())} is past {self.n_ctx}")
        sampled = [i for i, o in enumerate(outs) if _gpu_samples(o)]
        for i in sampled:
            if not self.samples(outs[i].params):
                raise InfrError("these sampling settings need a host sampler (penalty window too long)")
        if self.recurrent:
            self.recurrent.check_rows(batch.positions, batch.slots)
        out_rows = [o.row for o in outs]
        T, Lb = _bucket(n), _bucket(L) if L else 0
        if Lb == T and out_rows != list(range(L)):  # the head must read the tail copy, not the rows in place
            T = min(2 * T, MAX_BATCH)
        self._load_rows(batch, T)
        q = self.dev.device.queue
        decode = int(np.bincount(batch.slots).max()) <= KA.SPLIT_MAX_T
        far = self._far(int(batch.positions.max()), 1, T, decode)
        body, head, x_buf = self._graph(T, Lb, far, decode)
        tail: list[Dispatch] = []
        on_gpu: set[int] = set()
        if L:
            logits_buf = self._logits_buffer(T, Lb, far, decode)
            # Rows under a grammar that the GPU samples: their masks in one write, applied first.
            masked = [i for i, o in enumerate(outs)
                      if o.mask is not None and not o.want_logits and (_gpu_greedy(o) or i in sampled)]
            masked = self._masks().load(outs, masked) if masked else []
            tail = ([self._masks().dispatch(logits_buf, len(masked))] if masked else []) + self._argmax_rows(logits_buf, Lb)
            drawn = [i for i in sampled if outs[i].mask is None or i in masked]
            ss = self._sampling()
            tail += ss.dispatches(logits_buf, self.step_tokens, ss.load(
                [(i, i, 2 * outs[i].row, outs[i].params, _seed(outs[i].params), outs[i].history) for i in drawn]))
            on_gpu = {i for i, o in enumerate(outs) if not o.want_logits and (
                (_gpu_greedy(o) and (o.mask is None or i in masked)) or i in drawn)}
        timer = profile.timer_for(self.dev)
        if timer is not None and (len(body) + len(head) + len(tail) + 5 > timer.room
                                  or isinstance(body, HM.HostRecording)):
            timer = None  # too many dispatches for one query set, or host steps: this step goes untimed
        with profile.HostClock(timer, "encode"):
            enc = self._encode_body(self.dev.device.create_command_encoder(), body, timer, n)
        if self.recurrent:
            self.recurrent.advance(batch.positions, batch.slots)
        if not L:
            with profile.HostClock(timer, "submit"):
                q.submit([profile.finish_encoder(enc, timer, T)])
            return StepResult([])
        if Lb != T:  # the output rows' hidden states, in order, into the head's input
            width = self.plan.spec.n_embd * 4
            i = 0
            while i < L:
                j = i
                while j + 1 < L and out_rows[j + 1] == out_rows[j] + 1:
                    j += 1
                enc.copy_buffer_to_buffer(x_buf, out_rows[i] * width, self.tail, i * width, (j - i + 1) * width)
                i = j + 1
        with profile.HostClock(timer, "encode"):
            _encode(enc, Recording(head.dispatches + tail), timer)
            cmd = profile.finish_encoder(enc, timer, T)
        with profile.HostClock(timer, "submit"):
            q.submit([cmd])
        with profile.HostClock(timer, "wait"):
            tokens = np.frombuffer(q.read_buffer(self.step_tokens, 0, 4 * L), np.uint32).tolist()
        host = [i for i in range(L) if i not in on_gpu]
        res = StepResult(tokens)
        if host:
            vocab = self.plan.spec.n_vocab
            last = max(host) + 1
            logits = np.frombuffer(q.read_buffer(logits_buf, 0, last * vocab * 4), np.float32).reshape(last, vocab)
            for i in host:
                res.tokens[i] = host_sample(outs[i], logits[i])
                if outs[i].want_logits:
                    res.logits[i] = logits[i].copy()
        return res

    def free_memory(self) -> tuple[int, str] | None:
        return free_device_bytes(self.dev)

    def warm(self, rows: int, far: bool = False) -> None:
        """Record the greedy decode step of `rows` rows' bucket (its far form with `far`, where it has
        one) and compile its pipelines: decode_steps' recording where the engine runs several steps a
        call, else step()'s graph. The first served stream of a bucket paid for it: the 8B's first
        one-stream round ran 265.5 t/s against 307.9 for the next (perf/h200/s43-2026-12-07-h200.txt)."""
        T = _bucket(rows)
        if far and not self._has_spans(T, True):
            return
        if self.multi_step > 1:
            self._multi_step(T, far)
        else:
            self._graph(T, T, far, True)

    # --- checkpoints of a recurrent model's per-sequence state

    def save_state(self, slot: int) -> object:
        """An opaque snapshot of every DeltaNet layer's state of slot as it stands after the last step:
        a copy on the GPU (no read-back), with the position it stands at."""
        return self.recurrent.save(slot)

    def load_state(self, slot: int, snap: object, pos: int) -> None:
        """Slot's state becomes snap (save_state's), standing at position pos: its next row is pos."""
        self.recurrent.load(slot, snap, pos)

    def samples(self, params: SamplingParams) -> bool:
        """Whether step() draws rows with these settings on the GPU (a row without a host sampler):
        any settings whose penalty window the penalty kernel takes."""
        return KSA.supports(params, self.n_ctx)

    def _sampling(self) -> KSA.StepSampling:
        """The step's samplers (one slot per output row), made at the first step that needs them."""
        if not hasattr(self, "_step_sampling"):
            self._step_sampling = KSA.StepSampling(self.kern, self.plan.spec.n_vocab, self.n_ctx, self.rows,
                                                   MAX_LOGIT_ROWS)
        return self._step_sampling

    def _masks(self) -> KMask.StepMasks:
        """The grammar masks' buffer and dispatches, made at the first step with a masked row."""
        if not hasattr(self, "_step_masks"):
            self._step_masks = KMask.StepMasks(self.kern, self.plan.spec.n_vocab)
        return self._step_masks

    def _load_rows(self, batch: Batch, T: int) -> None:
        """The batch's block tables, token ids and rows (T of them, those past the batch padding) to the GPU."""
        n = batch.rows
        self.kv.load(batch.tables, batch.window_tables)
        q = self.dev.device.queue
        ids = np.zeros(T, np.uint32)
        pos, slots = np.zeros(T, np.uint32), np.zeros(T, np.uint32)
        ids[:n], pos[:n], slots[:n] = batch.tokens, batch.positions, batch.slots
        q.write_buffer(self.ids, 0, ids)
        KS.write_rows(self.dev, self.paging, pos, slots, n)

    multi_step = 64  # decode steps the engine may run per call of decode_steps (tokens stream back every few)

    def decode_steps(self, batch: Batch, k: int, stop: Callable[[], bool] | None = None, per_submit: int = 4,
                     depth: int = 3) -> Generator[list[int], None, None]:
        """k steps of a batch of decode rows (row t: one sequence's next token, every row an
        output row), tokens kept on the GPU: each step's argmax, or a sampled row's GPU sampler
        (seeded: the draw hashes (seed, position), as step() draws it), writes the next step's
        ids, the step kernel logs them and advances every row. Yields each step's tokens, in row
        order, as they come back: each submit of `per_submit` steps copies its part of the token
        log into a staging buffer mapped asynchronously, and `depth` submits stay in flight, so the
        host hands out tokens while the GPU runs the next steps. Once `stop()` is true no more
        steps are submitted and those in flight are still yielded, so the caller keeps every step
        that ran (a recurrent model's state cannot be rewound). Closing the iterator early lets
        the steps in flight finish (their KV lies past what the caller keeps). The caller owns
        blocks for every position the k steps write. Bad input raises here, at the call."""
        L = batch.rows
        outs = batch.outputs
        if self.host_moe:
            raise InfrError("decode_steps keeps tokens on the GPU, which a model with experts on the CPU "
                            "(cpu_moe) cannot: run step() (multi_step is 1)")
        if L != len(outs) or [o.row for o in outs] != list(range(L)):
            raise InfrError("decode_steps runs a batch whose every row is an output row, in order")
        if any(o.mask is not None or o.want_logits or o.sampler is not None or has_penalties(o.params)
               for o in outs):
            raise InfrError("decode_steps runs rows without masks, logits, host samplers or penalties")
        if not 1 <= k <= TOKEN_LOG // max(L, 1):
            raise InfrError(f"decode_steps runs 1..{TOKEN_LOG // L} steps of {L} rows")
        last = int(batch.positions.max()) + k - 1
        if last >= self.blocks_per_seq * self.block_size:
            raise InfrError(f"context full: position {last} is past {self.n_ctx}")
        if self.recurrent:
            self.recurrent.check_rows(batch.positions, batch.slots)
        T = _bucket(L)
        self._load_rows(batch, T)
        q = self.dev.device.queue
        q.write_buffer(self.state, 0, KS.pack_state(int(batch.positions[0]), L))  # [2]: no token logged yet
        timer = profile.timer_for(self.dev)
        # The sampled rows' settings, written once for every step of the call.
        draws = self._sampling().load([(t, t, 2 * t, o.params, _seed(o.params), ())
                                       for t, o in enumerate(outs) if not o.params.greedy])
        steps = {far: self._multi_step(T, far, draws) for far in (False, True)}
        if timer is not None:  # every dispatch timed: as many steps per submit as one query set holds
            longest = max(len(r) for r in steps.values())
            per_submit = max(1, min(per_submit, (profile.CAPACITY - 1) // longest))
            if longest + 1 > profile.CAPACITY:
                timer = None
        # every step submitted advances the rows' recurrent state, those in flight when closed early too
        ran = (lambda done: self.recurrent.advance(batch.positions, batch.slots, done)) if self.recurrent else None
        return self._stream_steps(steps, int(batch.positions.max()), L, k, per_submit, depth, timer, ran, stop)

    def _stream_steps(self, steps, start: int, L: int, k: int, per_submit: int, depth: int, timer, ran=None,
                      stop=None):
        q = self.dev.device.queue
        pending: deque = deque()
        done = 0
        try:
            while done < k or pending:
                if stop is not None and done < k and stop():
                    k = done  # submit no more; what is in flight still comes back
                while done < k and len(pending) < depth:
                    n = min(per_submit, k - done)
                    with profile.HostClock(timer, "encode"):
                        enc = self.dev.device.create_command_encoder()
                        # the longest row decides near or far keys
                        encode_all(enc, [(steps[far], times) for far, times in self.spans(start + done, n)], timer)
                        buf = self._staging(4 * n * L)
                        enc.copy_buffer_to_buffer(self.token_log, 4 * done * L, buf, 0, 4 * n * L)
                        cmd = profile.finish_encoder(enc, timer, n)  # the profile counts steps as its tokens
                    with profile.HostClock(timer, "submit"):
                        q.submit([cmd])
                    pending.append((buf, buf.map_async("READ", 0, 4 * n * L), n))
                    done += n
                buf, promise, n = pending.popleft()
                with profile.HostClock(timer, "wait"):
                    promise.sync_wait()
                tokens = np.frombuffer(buf.read_mapped(0, 4 * n * L), np.uint32).reshape(n, L).tolist()
                buf.unmap()
                self._free_staging.append(buf)
                yield from tokens
        finally:  # closed early, or failed: settle the maps in flight
            if ran is not None:
                ran(done)
            for buf, promise, _ in pending:
                try:
                    promise.sync_wait()
                    buf.unmap()
                    self._free_staging.append(buf)
                except Exception:  # the device is gone: nothing to keep
                    pass

    def _staging(self, size: int):
        """A mappable buffer of at least `size` bytes for token ids, from the free ring."""
        BU = self.dev.api.BufferUsage
        for i, buf in enumerate(self._free_staging):
            if buf.size >= size:
                return self._free_staging.pop(i)
        return self.dev.device.create_buffer(size=max(256, -(-size // 256) * 256),
                                             usage=BU.MAP_READ | BU.COPY_DST,
                                             label="token staging")

    def decode_greedy(self, token: int, start: int, n: int, per_submit: int = TOKENS_PER_SUBMIT) -> list[int]:
        """n greedy steps of one sequence, from `token` at position `start`: one row of
        decode_steps (the engine's multi-step decode) in slot 0 over the identity block table
        forward() fills. Tests and profiles of a single stream take this entry."""
        if start + n > self.n_ctx:
            raise InfrError(f"context full: {start + n} tokens do not fit in a context of {self.n_ctx}")
        if n > TOKEN_LOG:
            raise InfrError(f"at most {TOKEN_LOG} greedy tokens per call")
        if n <= 0:
            return []
        if self.host_moe:  # host steps in every forward pass: one step at a time
            out = [int(token)]
            for i in range(n):
                out.append(int(np.argmax(self.forward([out[-1]], start + i)[-1])))
            return out[1:]
        batch = Batch.build([(0, [int(token)], start, list(range(self.blocks_per_seq)), start)],
                            [OutputRow(0, SamplingParams(temperature=0.0))])
        return [row[0] for row in self.decode_steps(batch, n, per_submit=per_submit)]


def _bucket(n: int) -> int:
    """The graph size that runs n rows: the next power of two (at most MAX_BATCH)."""
    return min(MAX_BATCH, 1 << max(0, (n - 1).bit_length()))


def _gpu_greedy(row) -> bool:
    """Whether the GPU's argmax is this row's token: greedy without penalties."""
    return row.params.greedy and not has_penalties(row.params)


def _gpu_samples(row) -> bool:
    """Whether the GPU's sampler draws this output row: sampled, no host sampler, no logits wanted."""
    return row.sampler is None and not row.want_logits and not row.params.greedy


def _seed(params: SamplingParams) -> int:
    """A sampled row's seed: its own (the engine gives every request one), else a fresh one."""
    return int(params.seed) if params.seed is not None else secrets.randbits(63)


def _encode(enc, recording: Recording, timer=None) -> None:
    recording.encode_passes(enc, timer=timer)


_KERNELS: dict[int, Kernels] = {}


def _shared_kernels(dev: Device) -> Kernels:
    """One pipeline cache per device, shared by every model and session in the process."""
    k = _KERNELS.get(id(dev))
    if k is None:
        k = _KERNELS[id(dev)] = Kernels(dev)
    return k

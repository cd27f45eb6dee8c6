"""Executes a plan on a WebGPU device: the same ops as the numpy reference.

At load: weights are uploaded once in their GGUF block layout, activation
buffers are planned from the op list, and for a batch shape (T tokens, n
logit rows) every pipeline, params buffer and bind group is built once and
cached. A forward call then writes the token ids and the state buffer
(first position, T), encodes the prebuilt dispatches in one compute pass and
reads the logits back.

WebGPU forbids binding one buffer as read-only and writable in a dispatch,
so an op that writes a buffer it also reads (`x = x + o`, in-place norms)
writes the other half of a ping-pong pair.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from infr.errors import InfrError
from infr.gguf_file import GGUFFile
from infr.numerics import check_supported
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_gemm as KG
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_q8 as KQ
from infr.gpu import profile
from infr.gpu.device import Device, get_device
from infr.gpu.runtime import Dispatch, Kernels, Recording, storage
from infr.ops import Add, Attention, Embed, GatedAct, MatMul, RMSNorm, Rope, Softcap, StoreKV
from infr.plan import Plan

MAX_BATCH = 512  # tokens per forward pass (llama.cpp's default ubatch); longer prompts run in chunks
MAX_LOGIT_ROWS = 32
SHAPE_CACHE = 6  # distinct (T, n_logits) graphs kept built
TOKEN_LOG = 4096  # greedy tokens decoded on the GPU before the host must read them
TOKENS_PER_SUBMIT = 8


class GPUBackend:
    name = "gpu"

    def __init__(self, gf: GGUFFile, plan: Plan, n_ctx: int, dev: Device | None = None, kernels: Kernels | None = None,
                 progress=None):
        self.gf, self.plan, self.n_ctx = gf, plan, n_ctx
        self.dev = dev or get_device()
        profile.install_from_env()
        self.kern = kernels or _shared_kernels(self.dev)
        spec = plan.spec
        for name in plan.weights():
            check_supported(gf.tensor(name))
        self.weights: dict[str, list] = {}  # matrices: row chunks; vectors: [buffer]
        self.vram = 0
        self._progress = progress  # optional callable(stage, done, total): load progress bars (infr/notebook.py)
        weight_bytes = sum(gf.tensor(n).nbytes for n in plan.weights())
        # Matmuls sharing their input (q, k, v) run as one GEMV over their rows stacked at upload.
        self.stacks = _find_stacks(plan, gf, self.dev.max_binding)
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
        for name in plan.weights():
            if name in stacked:
                continue
            t = gf.tensor(name)
            if len(t.shape) == 2:
                self.weights[name] = KM.upload_weight(self.dev, t)
            else:
                self.weights[name] = [storage(self.dev, np.asarray(t.raw, np.float32), label=name)]
            self.vram += t.nbytes
            self._report("upload", self.vram, weight_bytes)
        self.widths = _buffer_widths(plan, gf)
        self._own_state()
        self._report("graph", 1, 1)
        self._progress = None  # load only: later shapes build silently

    def _own_state(self) -> None:
        """What one sequence needs besides the weights: activations, ids and state,
        the KV cache and the graphs that bind them (the decode graph built now)."""
        spec, n_ctx = self.plan.spec, self.n_ctx
        self.buffers: dict[str, list] = {}
        for name in self.widths:
            self.buffers[name] = [self._activation(name, 0)]
        self.tail = storage(self.dev, MAX_LOGIT_ROWS * spec.n_embd * 4, label="x_tail")
        self.ids = storage(self.dev, MAX_BATCH * 4, label="ids")
        self.state = storage(self.dev, 16, label="state")
        self.token_log = storage(self.dev, 4 * TOKEN_LOG, label="token_log")
        self.k_cache, self.v_cache = {}, {}
        for layer in spec.layers:
            a = layer.attention
            self.k_cache[layer.index] = storage(self.dev, n_ctx * a.n_kv_heads * a.head_dim * 2, label="k")
            self.v_cache[layer.index] = storage(self.dev, n_ctx * a.n_kv_heads * a.v_head_dim * 2, label="v")
            self.vram += n_ctx * a.n_kv_heads * (a.head_dim + a.v_head_dim) * 2
        self._graphs: OrderedDict[tuple[int, int, bool], tuple] = OrderedDict()
        self._graph(1, 1)  # the decode graph: built at load
        if self._has_spans(1):  # and its form for steps past split_from keys
            self._graph(1, 1, True)

    def fork(self) -> "GPUBackend":
        """Another sequence over the same uploaded weights: its own KV cache,
        activations and graphs (a serve slot). `vram` of the fork counts only
        what it adds. Calls on forks must not overlap (one queue; the serve
        slots take a lock around each forward pass)."""
        twin = object.__new__(GPUBackend)
        for name in ("gf", "plan", "n_ctx", "dev", "kern", "weights", "stacks", "stack_bias", "widths"):
            setattr(twin, name, getattr(self, name))
        twin.vram, twin._progress = 0, None
        twin._own_state()
        return twin

    def _activation(self, name: str, i: int):
        rows = MAX_LOGIT_ROWS if name == "logits" else MAX_BATCH
        self.vram += rows * self.widths[name] * 4
        return storage(self.dev, rows * self.widths[name] * 4, label=f"{name}.{i}")

    def _report(self, stage: str, done: int, total: int) -> None:
        if getattr(self, "_progress", None) is not None:
            self._progress(stage, done, total)

    # --- execution

    def forward(self, tokens, start: int, n_logits: int = 1) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.uint32)
        if start + len(ids) > self.n_ctx:
            raise InfrError(f"context full: {start + len(ids)} tokens do not fit in a context of {self.n_ctx}")
        if len(ids) and int(ids.max()) >= self.plan.spec.n_vocab:
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")
        n_logits = max(1, min(n_logits, len(ids)))
        if n_logits > MAX_LOGIT_ROWS:
            raise InfrError(f"at most {MAX_LOGIT_ROWS} logit rows per call on the GPU backend")
        out = []
        pos = start
        # Chunks of MAX_BATCH; the last chunk carries the logit rows (it must hold all of them).
        bounds = list(range(0, len(ids), MAX_BATCH)) + [len(ids)]
        if len(ids) - bounds[-2] < n_logits:
            bounds[-2] = len(ids) - n_logits
        for a, b in zip(bounds[:-1], bounds[1:]):
            last = b == len(ids)
            out = self._run(ids[a:b], pos, n_logits if last else 0)
            pos += b - a
        return out

    def _run(self, ids: np.ndarray, start: int, n_logits: int) -> np.ndarray:
        T = len(ids)
        q = self.dev.device.queue
        q.write_buffer(self.ids, 0, ids)
        q.write_buffer(self.state, 0, KS.pack_state(start, T))
        far = self._far(start, T)
        body, head, x_buf = self._graph(T, n_logits, far)
        timer = profile.timer_for(self.dev)
        if timer is not None and len(body) + len(head) + 2 > timer.room:
            timer = None  # too many dispatches for one query set: this call goes untimed
        with profile.HostClock(timer, "encode"):
            enc = self.dev.device.create_command_encoder()
            _encode(enc, body, timer)
            if n_logits:
                if n_logits != T:  # the head runs on the last rows only
                    width = self.plan.spec.n_embd * 4
                    enc.copy_buffer_to_buffer(x_buf, (T - n_logits) * width, self.tail, 0, n_logits * width)
                _encode(enc, head, timer)
            cmd = profile.finish_encoder(enc, timer, T)
        with profile.HostClock(timer, "submit"):
            q.submit([cmd])
        if not n_logits:
            return np.zeros((0, self.plan.spec.n_vocab), np.float32)
        vocab = self.plan.spec.n_vocab
        logits_buf = self._logits_buffer(T, n_logits, far)
        with profile.HostClock(timer, "wait"):
            raw = np.frombuffer(q.read_buffer(logits_buf, 0, n_logits * vocab * 4), np.float32)
        return raw.reshape(n_logits, vocab).copy()

    def decode_greedy(self, token: int, start: int, n: int, per_submit: int = TOKENS_PER_SUBMIT) -> list[int]:
        """n greedy steps that never leave the GPU: argmax writes the next token
        where the embedding reads it and a step kernel advances the position.
        The host only encodes (token t+1 while the GPU runs token t) and reads
        the token log once at the end."""
        if start + n > self.n_ctx:
            raise InfrError(f"context full: {start + n} tokens do not fit in a context of {self.n_ctx}")
        if n > TOKEN_LOG:
            raise InfrError(f"at most {TOKEN_LOG} greedy tokens per call")
        q = self.dev.device.queue
        q.write_buffer(self.ids, 0, np.array([token], np.uint32))
        q.write_buffer(self.state, 0, KS.pack_state(start, 1))
        steps = {far: self._decode_step(far) for far in (False, True)}
        timer = profile.timer_for(self.dev)
        if timer is not None:  # every dispatch timed: as many steps per submit as one query set holds
            longest = max(len(st) for st in steps.values())
            per_submit = max(1, min(per_submit, (profile.CAPACITY - 1) // longest))
            if longest + 1 > profile.CAPACITY:
                timer = None
        done = 0
        while done < n:
            k = min(per_submit, n - done)
            with profile.HostClock(timer, "encode"):
                enc = self.dev.device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                for far, times in self.spans(start + done, k):  # step i runs token start + i
                    steps[far].encode(cpass, times=times, timer=timer)
                cpass.end()
                cmd = profile.finish_encoder(enc, timer, k)
            with profile.HostClock(timer, "submit"):
                q.submit([cmd])
            done += k
        with profile.HostClock(timer, "wait"):
            out = np.frombuffer(q.read_buffer(self.token_log, 0, 4 * n), np.uint32).tolist()
        return out

    def _decode_step(self, far: bool = False) -> Recording:
        far = far and self._has_spans(1)
        if not hasattr(self, "_steps"):
            self._steps = {}
        if far not in self._steps:
            body, head, _ = self._graph(1, 1, far)
            logits = self._logits_buffer(1, 1, far)
            argmax = KS.argmax_dispatches(self.kern, logits, self.ids, self.plan.spec.n_vocab)
            pipe = self.kern.pipeline("step", "main")
            advance = Dispatch(pipe, self.kern.bind(pipe, [self.ids, self.state, self.token_log]), (1, 1, 1), "step")
            self._steps[far] = Recording(body.dispatches + head.dispatches + argmax + [advance])
        return self._steps[far]

    # --- which graph a step takes: near or far keys (kernels_attention.attention_dispatches' span)

    def _has_spans(self, T: int) -> bool:
        """Whether graphs for T tokens come in a near and a far form."""
        known = self.__dict__.setdefault("_span_forms", {})
        if T not in known:
            known[T] = any(KA.attention_mode(T, la.attention.head_dim, la.attention.v_head_dim, self.n_ctx) == "switch"
                           for la in self.plan.spec.layers)
        return known[T]

    def _far(self, start: int, T: int) -> bool:
        """Whether a batch of T tokens at `start` takes the far graph (its last token sees more
        than split_from keys: split-K attention), rather than the near one (one pass)."""
        return start + T > KA.split_from() and self._has_spans(T)

    def spans(self, start: int, k: int) -> list[tuple[bool, int]]:
        """k one-token steps running tokens start .. start + k - 1: (far, steps) runs in order."""
        cut = min(k, max(0, KA.split_from() - start))  # steps whose token sees at most split_from keys
        if not self._has_spans(1):
            return [(False, k)]
        return [(far, n) for far, n in ((False, cut), (True, k - cut)) if n]

    def decode_stream(self, logits, context, n: int, params, **kw):
        """n tokens sampled on the GPU after `context` (in the cache; `logits` its
        last position's), streamed as they come back (infr/gpu/decode.py)."""
        return self.resident().stream(logits, context, n, params, **kw)

    def can_sample(self, params) -> bool:
        """Whether decode_stream runs these sampling settings on the GPU."""
        return self.resident().supports(params)

    def resident(self):
        if not hasattr(self, "_resident"):
            from infr.gpu.decode import ResidentDecoder

            self._resident = ResidentDecoder(self)
        return self._resident

    def _logits_buffer(self, T: int, n_logits: int, far: bool = False):
        self._graph(T, n_logits, far)
        return self._graphs[(T, n_logits, far and self._has_spans(T))][3]

    # --- lowering

    def _graph(self, T: int, n_logits: int, far: bool = False):
        """(body, head, x buffer) for a batch of T tokens; `far`: the form for batches whose last
        token sees more than split_from keys (the same graph where T has one form)."""
        far = far and self._has_spans(T)
        key = (T, n_logits, far)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key][:3]
        lower = _Lowering(self, T, far)
        body = []
        ops = list(self.plan.embed + self.plan.layers)
        i = 0
        while i < len(ops):
            self._report("graph", i, len(ops) + 1)  # pipelines compile as the first layer lowers
            lower.ahead = ops[i + 1] if i + 1 < len(ops) else None
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            fused = lower.gate_up(*ops[i : i + 3]) if _is_gate_up(ops[i : i + 3]) else None
            stack = _stack_at(ops, i)
            if stack in self.stacks:  # q, k, v from one GEMV over stacked rows
                body += lower.stacked(ops[i : i + len(stack)], stack)
                i += len(stack)
            elif fused is not None:  # act(Wg·h) * (Wu·h) in one dispatch
                body += fused
                i += 3
            elif _is_rope_store(ops[i : i + 3]):  # rope(q), rope(k), kv store in one dispatch
                body += lower.rope_store(*ops[i : i + 3])
                i += 3
            elif _is_residual(ops[i], nxt):  # x = x + W·h in one dispatch
                body += lower.matmul_residual(ops[i], nxt)
                i += 2
            else:
                body += lower.op(ops[i])
                i += 1
        x_buf = lower.current("x")
        head = []
        if n_logits:
            if n_logits != T:
                lower.rows = n_logits
                lower.bind_external("x", self.tail)
            for j, op in enumerate(self.plan.head):
                lower.ahead = self.plan.head[j + 1] if j + 1 < len(self.plan.head) else None
                head += lower.op(op)
        logits = lower.current("logits") if n_logits else None
        body, head = Recording(body), Recording(head)  # prepared once, re-encoded every call
        self._graphs[key] = (body, head, x_buf, logits)
        while len(self._graphs) > SHAPE_CACHE:
            self._graphs.popitem(last=False)
        return body, head, x_buf

    @property
    def dispatches_per_token(self) -> int:
        body, head, _ = self._graph(1, 1)
        return len(body) + len(head)


class _Lowering:
    """Turns plan ops into dispatches for one batch shape, tracking which
    physical buffer holds each named value."""

    def __init__(self, be: GPUBackend, T: int, far: bool = False):
        self.be, self.k, self.rows = be, be.kern, T
        self.span = "far" if far else "near"  # which attention a "switch" layer keeps
        self.phys = {name: 0 for name in be.buffers}
        self.external: dict[str, object] = {}
        self.ahead = None  # the next plan op (a norm feeding a Q4_K GEMV also rounds its output)
        self.q8 = None  # (buffer, K, scratch): whose rounded rows the q8 scratch holds (kernels_q8)

    def current(self, name: str):
        if name in self.external:
            return self.external[name]
        return self.be.buffers[name][self.phys[name]]

    def bind_external(self, name: str, buf) -> None:
        self.external[name] = buf

    def target(self, name: str, *reads: str):
        """The buffer to write `name` into; the other half of its pair if the op also reads it."""
        self.external.pop(name, None)
        pair = self.be.buffers[name]
        if name in reads:
            self.phys[name] ^= 1
            if len(pair) == 1:  # the second half, made the first time a shape needs it
                pair.append(self.be._activation(name, 1))
        if self.q8 is not None and self.q8[0] is pair[self.phys[name]]:
            self.q8 = None  # overwritten: its rounded rows are stale
        return pair[self.phys[name]]

    def q8_input(self, x, K: int) -> tuple[list[Dispatch], object]:
        """x rounded for the Q4_K GEMV: the q8 scratch when it already holds x
        (q, k, v or gate, up after one norm), else a quantize dispatch first."""
        if self.q8 is not None and self.q8[0] is x and self.q8[1] == K:
            return [], self.q8[2]
        d, xq = KQ.quantize_dispatch(self.k, x, K, self.rows)
        self.q8 = (x, K, xq)
        return [d], xq

    def _gemv_q8(self, t, x) -> tuple[list[Dispatch], object]:
        """([], None) unless weight t runs the int8 GEMV on this graph's batches."""
        if KG.use_gemm(self.rows, self.be.dev) or not KQ.takes_q8(t):
            return [], None
        return self.q8_input(x, int(t.shape[-1]))

    def _mmq(self, t, x):
        """(quantize dispatches, rounded x) when weight t runs the Q4_K int8 GEMM
        (kernels_mmq) on this graph's batches, else None."""
        if not KMQ.use_mmq(self.rows, self.be.dev, t):
            return None
        return self.q8_input(x, int(t.shape[-1]))

    def _matmul(self, t, chunks, x, y, bias, resid=None) -> list[Dispatch]:
        """y = W·x (+ bias) (+ resid) by the kernel this batch takes for weight t."""
        if (mq := self._mmq(t, x)) is not None:  # batches: int8 tiled GEMM
            return mq[0] + KMQ.mmq_dispatches(self.k, t, chunks, mq[1], y, bias, self.rows, resid=resid)
        if KG.use_gemm(self.rows, self.be.dev):  # batches: tiled GEMM
            return KG.gemm_dispatches(self.k, t, chunks, x, y, bias, self.rows, resid=resid)
        pre, xq = self._gemv_q8(t, x)
        return pre + KM.matmul_dispatches(self.k, t, chunks, x, y, bias, self.rows, resid=resid, xq=xq)

    def matmul_residual(self, mm: MatMul, add: Add) -> list[Dispatch]:
        be = self.be
        x = self.current(mm.src)
        resid = self.current(add.dst)
        y = self.target(add.dst, add.dst)  # the other half of the pair: y never aliases resid
        bias = be.weights[mm.bias][0] if mm.bias else None
        return self._matmul(be.gf.tensor(mm.weight), be.weights[mm.weight], x, y, bias, resid=resid)

    def stacked(self, mms: list[MatMul], names: tuple) -> list[Dispatch]:
        be = self.be
        x = self.current(mms[0].src)
        ys = [self.target(m.dst, m.src) for m in mms]
        tensors = [be.gf.tensor(n) for n in names]
        mixed = KM.is_mixed(tensors)
        if mixed and any(KMQ.use_mmq(self.rows, be.dev, t) for t in tensors):
            # A batch over a mixed stack (Q4_K q, k and Q6_K v): each matrix its own kernel, on a view of its rows.
            parts = KM.stack_parts(tensors, be.weights[names])
            return [d for m, t, part, y in zip(mms, tensors, parts, ys)
                    for d in self._matmul(t, part, x, y, be.weights[m.bias][0] if m.bias else None)]
        if not mixed and (mq := self._mmq(tensors[0], x)) is not None:
            return mq[0] + KMQ.stacked_dispatches(self.k, tensors, be.weights[names], mq[1], ys,
                                                  be.stack_bias.get(names), self.rows)
        if KG.use_gemm(self.rows, self.be.dev):
            return KG.stacked_gemm_dispatches(self.k, tensors, be.weights[names], x, ys, be.stack_bias.get(names),
                                              self.rows)
        pre, xq = self._gemv_q8(tensors[0], x)
        return pre + KM.stacked_dispatches(self.k, tensors, be.weights[names], x, ys, be.stack_bias.get(names),
                                           self.rows, xq=xq)

    def gate_up(self, mg: MatMul, mu: MatMul, act: GatedAct) -> list[Dispatch] | None:
        be = self.be
        x = self.current(mg.src)
        tg, tu = be.gf.tensor(mg.weight), be.gf.tensor(mu.weight)
        chunks_g, chunks_u = be.weights[mg.weight], be.weights[mu.weight]
        if KMQ.use_mmq(self.rows, be.dev, tg) and KM.can_fuse_gate_up(tg, tu, chunks_g, chunks_u):
            y = self.target(act.dst, mg.src)
            pre, xq = self.q8_input(x, int(tg.shape[-1]))
            return pre + KMQ.gate_up_dispatches(self.k, tg, tu, chunks_g, chunks_u, xq, y, act.act, self.rows)
        # Batches: None, so gate and up run as two GEMMs and the activation as its own dispatch
        # (as do a pair of two types where the int8 GEMM takes either).
        mmq_either = KMQ.use_mmq(self.rows, be.dev, tg) or KMQ.use_mmq(self.rows, be.dev, tu)
        if KG.use_gemm(self.rows, self.be.dev) or not KM.can_pair(tg, tu, chunks_g, chunks_u) or mmq_either:
            return None  # checked before target() so a refusal leaves the buffer tracking untouched
        y = self.target(act.dst, mg.src)
        pre, xq = self._gemv_q8(tg, x)
        return pre + KM.gate_up_dispatches(self.k, tg, tu, chunks_g, chunks_u, x, y, act.act, self.rows, xq=xq)

    def rope_store(self, rq: Rope, rk: Rope, st: StoreKV) -> list[Dispatch]:
        be, r = self.be, rq.rope
        a = be.plan.spec.layers[st.layer].attention
        factors = be.weights[r.freq_factors][0] if r.freq_factors else None
        return [KA.rope_kv_dispatch(self.k, self.current(rq.buf), self.current(rk.buf), self.current(st.v),
                                    be.k_cache[st.layer], be.v_cache[st.layer], be.state, rq.n_heads, rk.n_heads,
                                    a.head_dim, a.v_head_dim, r.n_rot, r.theta, r.freq_scale, r.style, self.rows,
                                    factors=factors)]

    def _feeds_gemv_q8(self, name: str, width: int) -> bool:
        """Whether the next op multiplies value `name` (width values a token) in
        the Q4_K GEMV: its producer then writes it rounded too."""
        nxt = self.ahead
        return (
            width % 256 == 0 and (not KG.use_gemm(self.rows, self.be.dev) or KMQ.use_mmq(self.rows, self.be.dev))
            and isinstance(nxt, MatMul) and nxt.src == name and KQ.takes_q8(self.be.gf.tensor(nxt.weight))
        )

    def op(self, op) -> list[Dispatch]:
        be, T = self.be, self.rows
        w = be.widths
        if isinstance(op, MatMul):
            x = self.current(op.src)
            bias = be.weights[op.bias][0] if op.bias else None
            t = be.gf.tensor(op.weight)
            y = self.target(op.dst, op.src)
            return self._matmul(t, be.weights[op.weight], x, y, bias)
        if isinstance(op, RMSNorm):
            x = self.current(op.src)
            y = self.target(op.dst, op.src)
            g = be.weights[op.weight][0]
            if op.group in (None, w[op.src]) and self._feeds_gemv_q8(op.dst, w[op.src]):  # also rounded
                d, xq = KQ.rmsnorm_q8_dispatch(self.k, x, g, y, w[op.src], op.eps, T)
                self.q8 = (y, w[op.src], xq)
                return [d]
            return [KS.rmsnorm_dispatch(self.k, x, g, y, w[op.src], op.group, op.eps, T)]
        if isinstance(op, Rope):
            r = op.rope
            factors = be.weights[r.freq_factors][0] if r.freq_factors else None
            x = self.current(op.buf)
            return [KS.rope_dispatch(self.k, x, be.state, op.n_heads, op.head_dim, r.n_rot, r.theta,
                                     r.freq_scale, r.style, T, factors=factors)]
        if isinstance(op, StoreKV):
            a = be.plan.spec.layers[op.layer].attention
            return [KS.kv_store_dispatch(self.k, self.current(op.k), self.current(op.v), be.k_cache[op.layer],
                                         be.v_cache[op.layer], be.state, a.n_kv_heads, a.head_dim, a.v_head_dim, T)]
        if isinstance(op, Attention):
            a = op.spec
            q = self.current(op.q)
            out = self.target(op.dst, op.q)
            layers = [la.attention for la in be.plan.spec.layers]
            scratch = lambda: KA.scratch_for(be, self.k, T, be.n_ctx, max(x.n_heads for x in layers),
                                             max(x.v_head_dim for x in layers))
            K = a.n_heads * a.v_head_dim
            fuse = KS.can_round_output(a.n_heads, a.v_head_dim) and self._feeds_gemv_q8(op.dst, K)
            xq = KQ.scratch(self.k, K, T) if fuse else None
            ds = KA.attention_dispatches(self.k, q, be.k_cache[op.layer], be.v_cache[op.layer], out, be.state,
                                         scratch, a.n_heads, a.n_kv_heads, a.head_dim, a.v_head_dim, a.scale,
                                         a.sliding_window, a.softcap, T, n_ctx=be.n_ctx, xq=xq, span=self.span)
            if xq is not None:
                self.q8 = (out, K, xq)  # the o projection reads the rounded copy
            return ds
        if isinstance(op, GatedAct):
            g, u = self.current(op.gate), self.current(op.up)
            y = self.target(op.dst, op.gate, op.up)
            return [KS.gated_dispatch(self.k, g, u, y, T * w[op.gate], op.act)]
        if isinstance(op, Add):
            a, b = self.current(op.a), self.current(op.b)
            y = self.target(op.dst, op.a, op.b)
            return [KS.add_dispatch(self.k, a, b, y, T * w[op.a])]
        if isinstance(op, Embed):
            t = be.gf.tensor(op.table)
            y = self.target(op.dst)
            return KM.embed_dispatches(self.k, t, be.weights[op.table], be.ids, y, op.scale, T)
        if isinstance(op, Softcap):
            return [KS.softcap_dispatch(self.k, self.current(op.buf), T * w[op.buf], op.cap)]
        raise NotImplementedError(type(op).__name__)


def _stack_run(ops, i: int) -> list[MatMul]:
    """The matmuls from ops[i] on that read one input (2 or 3, none reading another's output)."""
    run: list[MatMul] = []
    for op in ops[i : i + 3]:
        if not isinstance(op, MatMul) or (run and op.src != run[0].src) or op.dst == op.src:
            break
        if any(op.src == m.dst or op.dst == m.dst for m in run):
            break
        run.append(op)
    return run if len(run) >= 2 else []


def _stack_at(ops, i: int) -> tuple:
    return tuple(m.weight for m in _stack_run(ops, i))


def _find_stacks(plan: Plan, gf: GGUFFile, max_binding: int) -> dict[tuple, tuple]:
    """Weight-name tuples to stack -> their bias names. gate||up followed by its
    activation is left to the fused gate_up kernel."""
    ops = list(plan.layers)
    out = {}
    i = 0
    while i < len(ops):
        run = _stack_run(ops, i)
        if not run or _is_gate_up(ops[i : i + 3]):
            i += 1
            continue
        if KM.can_stack([gf.tensor(m.weight) for m in run], max_binding):
            out[tuple(m.weight for m in run)] = tuple(m.bias for m in run)
        i += len(run)
    return out


def _is_gate_up(ops) -> bool:
    """MatMul(g, h), MatMul(u, h), GatedAct(g, u): both products read only by the activation."""
    if len(ops) != 3:
        return False
    mg, mu, act = ops
    return (
        isinstance(mg, MatMul) and isinstance(mu, MatMul) and isinstance(act, GatedAct)
        and mg.src == mu.src and not mg.bias and not mu.bias
        and (act.gate, act.up) == (mg.dst, mu.dst) and mg.dst != mu.dst
    )


def _is_rope_store(ops) -> bool:
    """Rope(q), Rope(k) with one RopeSpec, then StoreKV of that k: one rope_kv dispatch."""
    if len(ops) != 3:
        return False
    rq, rk, st = ops
    return (
        isinstance(rq, Rope) and isinstance(rk, Rope) and isinstance(st, StoreKV)
        and rq.rope == rk.rope and rq.head_dim == rk.head_dim and rk.buf == st.k
        and len({rq.buf, rk.buf, st.v}) == 3 and rq.head_dim <= 512
    )


def _is_residual(op, nxt) -> bool:
    """MatMul(o) then Add(x, x, o): the plan's residual adds. The matmul's own
    output is read by that Add alone (the plan builder writes it so)."""
    return (
        isinstance(op, MatMul) and isinstance(nxt, Add) and nxt.dst != op.dst
        and {nxt.a, nxt.b} == {nxt.dst, op.dst}
    )


def _encode(enc, recording: Recording, timer=None) -> None:
    cp = enc.begin_compute_pass()
    recording.encode(cp, timer=timer)
    cp.end()


def _buffer_widths(plan: Plan, gf: GGUFFile) -> dict[str, int]:
    spec = plan.spec
    widths: dict[str, int] = {}

    def put(name: str, width: int) -> None:
        widths[name] = max(widths.get(name, 0), width)

    for op in plan.ops:
        if isinstance(op, Embed):
            put(op.dst, spec.n_embd)
        elif isinstance(op, MatMul):
            put(op.dst, gf.tensor(op.weight).shape[0])
        elif isinstance(op, Attention):
            put(op.dst, op.spec.n_heads * op.spec.v_head_dim)
        elif isinstance(op, (RMSNorm,)):
            put(op.dst, widths[op.src])
        elif isinstance(op, GatedAct):
            put(op.dst, widths[op.gate])
        elif isinstance(op, Add):
            put(op.dst, widths[op.a])
    return widths


_KERNELS: dict[int, Kernels] = {}


def _shared_kernels(dev: Device) -> Kernels:
    """One pipeline cache per device, shared by every model and session in the process."""
    k = _KERNELS.get(id(dev))
    if k is None:
        k = _KERNELS[id(dev)] = Kernels(dev)
    return k

"""The GPU backend's graphs: the plan lowered (infr/gpu/lowering.py) into recorded dispatches
per batch shape, kept in a small cache, and which form a step takes.

A shape is (T rows, n logit rows, far, decode): `far` is the form for batches whose longest row
sees more than split_from keys (split-K attention; the same graph where T has one form),
`decode` a batched decode step past SPLIT_MAX_T rows. GPUBackend holds these as methods
(this class is its graph half): they read its plan, kernels, weights and buffers.
"""

from __future__ import annotations

from infr.gpu import host_moe as HM
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as KS
from infr.gpu.lowering import Lowering
from infr.gpu.runtime import Dispatch, Recording, storage

MAX_LOGIT_ROWS = 64  # output rows of one step: every running sequence's (backend.MAX_SEQS)
SHAPE_CACHE = 24  # distinct (T, n_logits) graphs kept built: the engine's row and output buckets


class Graphs:
    """The graph half of GPUBackend (self is the backend)."""

    def _multi_step(self, T: int, far: bool, draws: "KSA.Draws | None" = None) -> Recording:
        """One step of T decode rows (the graph with every row an output row): argmax into ids,
        the loaded samplers (`draws`, StepSampling.load's) over their rows' ids, then the step
        kernel's `batch` entry."""
        far = far and self._has_spans(T, True)
        cache = self.__dict__.setdefault("_multi", {})
        logits = self._logits_buffer(T, T, far, True)
        key = (T, far, draws)
        if key in cache:  # the least recently used goes first: a warmed shape stays while streams take it
            cache[key] = cache.pop(key)
        else:
            body, head, _ = self._graph(T, T, far, True)
            argmax = KS.argmax_dispatches(self.kern, logits, self.ids, self.plan.spec.n_vocab, T)
            pipe = self.kern.pipeline("step", "batch")
            advance = Dispatch(pipe, self.kern.bind(pipe, [self.ids, self.state, self.token_log, self.rows]),
                               (1, 1, 1), "step")
            if len(cache) >= SHAPE_CACHE:
                cache.pop(next(iter(cache)))
            cache[key] = Recording(body.dispatches + head.dispatches + argmax
                                   + self._sampling().dispatches(logits, self.ids, draws) + [advance])
        return cache[key]

    def _argmax_rows(self, logits_buf, rows: int) -> list[Dispatch]:
        """argmax of each of the first `rows` rows of a logits buffer into step_tokens (built once per buffer)."""
        cache = self.__dict__.setdefault("_argmaxes", {})
        key = (id(logits_buf), rows)
        if key not in cache:
            if not hasattr(self, "step_tokens"):
                self.step_tokens = storage(self.dev, 4 * MAX_LOGIT_ROWS, label="step_tokens")
            cache[key] = (logits_buf, KS.argmax_dispatches(self.kern, logits_buf, self.step_tokens,
                                                           self.plan.spec.n_vocab, rows))
        return cache[key][1]


    # --- which graph a step takes: near or far keys (kernels_attention.attention_dispatches' span)

    def _has_spans(self, T: int, decode: bool = False) -> bool:
        """Whether graphs for T rows come in a near and a far form."""
        known = self.__dict__.setdefault("_span_forms", {})
        if (T, decode) not in known:
            known[(T, decode)] = any(
                KA.attention_mode(T, la.attention.head_dim, la.attention.v_head_dim, self.n_ctx, decode) == "switch"
                for la in self.plan.spec.layers)
        return known[(T, decode)]

    def _far(self, start: int, T: int, rows: int | None = None, decode: bool = False) -> bool:
        """Whether a batch whose longest row is the last of T tokens from `start` (its
        row sees start + T keys) takes the far graph (more than split_from keys:
        split-K attention), rather than the near one (one pass); `rows`: the
        graph's rows when they are not T (run_rows: T = 1 at the longest row's position)."""
        return start + T > KA.split_from() and self._has_spans(rows or T, decode)

    def spans(self, start: int, k: int) -> list[tuple[bool, int]]:
        """k one-token steps running tokens start .. start + k - 1: (far, steps) runs in order."""
        cut = min(k, max(0, KA.split_from() - start))  # steps whose token sees at most split_from keys
        if not self._has_spans(1):
            return [(False, k)]
        return [(far, n) for far, n in ((False, cut), (True, k - cut)) if n]

    def _logits_buffer(self, T: int, n_logits: int, far: bool = False, decode: bool = False):
        self._graph(T, n_logits, far, decode)
        decode = decode and T > KA.SPLIT_MAX_T
        return self._graphs[(T, n_logits, far and self._has_spans(T, decode), decode)][3]

    # --- lowering

    def _graph(self, T: int, n_logits: int, far: bool = False, decode: bool = False):
        """(body, head, x buffer) for a batch of T rows; `far`: the form for batches whose longest
        row sees more than split_from keys (the same graph where T has one form); `decode`: a
        batched decode step (kernels_attention.attention_mode; the same graph up to SPLIT_MAX_T rows)."""
        decode = decode and T > KA.SPLIT_MAX_T
        far = far and self._has_spans(T, decode)
        key = (T, n_logits, far, decode)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key][:3]
        lower = Lowering(self, T, far, decode)
        body = []
        ops = list(self.plan.embed + self.plan.layers)
        walk = ops + list(self.plan.head)  # what reads a norm's output (Lowering.norm_in)
        i = 0  # the group's first op in `ops`
        for g in self.plan.groups:  # the runs the plan names for fusion (infr/fusion.py)
            self._report("graph", i, len(ops) + 1)  # pipelines compile as the first layer lowers
            lower.ahead, lower.ahead2 = _next_two(ops, i)
            stack = tuple(m.weight for m in g.stack()) or None
            fused = None
            if g.kind == "gate_up":  # ahead: what reads the pair's output (down's GEMV: the pair rounds it too)
                lower.ahead, lower.ahead2 = _next_two(ops, i + len(g.ops) - 1)
                fused = lower.gate_up(*g.ops)
            if g.kind == "norm_rope_store":  # QK-norms, rope(q), rope(k), kv store in one dispatch
                fused = lower.norm_rope_store(g.ops)
            if g.kind == "moe_post_norms":  # the experts' sum, both post-norms and their add in the combine
                fused = lower.moe_post_norms(*g.ops)
            if g.kind == "moe_residual_norm":  # the experts' sum into x and the next norm of x, rounded for the
                lower.ahead, lower.ahead2 = _next_two(ops, i + 2)  # GEMV after it, in the combine
                fused = lower.moe_residual_norm(*g.ops)
                if fused is None:  # the residual group's kernels, then the norm alone
                    lower.ahead, lower.ahead2 = _next_two(ops, i)
                    fused = lower.residual(*g.ops[:2])
                    lower.ahead, lower.ahead2 = _next_two(ops, i + 2)
                    lower.after = (walk, i + 2)
                    fused += lower.op(g.ops[2])
                    lower.after = None
            if g.kind == "norm_twins":  # two norms of one row (and a Mul) in one dispatch, rounded for the
                lower.ahead, lower.ahead2 = _next_two(ops, i + len(g.ops) - 1)  # GEMV (the experts) after it
                fused = lower.norm_twins(*g.ops)
            if g.kind == "qkv_rope_store":  # q, k, v from one GEMV that also rotates and stores them
                mms, rope = list(g.stack()), g.ops[3:]
                fused = lower.stacked_rope(mms, stack, *rope) if stack in self.stacks else None
                if fused is None:  # the stack, then rope(q), rope(k) and the store: two groups' kernels
                    body += (lower.stacked(mms, stack) if stack in self.stacks
                             else [d for op in mms for d in lower.op(op)])
                    fused = lower.rope_store(*rope)
                body += fused
            elif stack in self.stacks:  # q, k, v from one GEMV over stacked rows
                body += lower.stacked(list(g.ops), stack)
            elif fused is not None:  # act(Wg·h) * (Wu·h) (or the norms and ropes) in one dispatch
                body += fused
            elif g.kind == "rope_store":  # rope(q), rope(k), kv store in one dispatch
                body += lower.rope_store(*g.ops)
            elif g.kind == "residual":  # x = x + W·h in one dispatch (a MoE's in its combine)
                body += lower.residual(*g.ops)
            elif g.kind in ("norm_residual", "norm_residual_norm"):  # x = (x + norm(o)) (* scale) in one dispatch,
                lower.ahead, lower.ahead2 = _next_two(ops, i + len(g.ops) - 1)  # with its rounding (or the next
                body += lower.norm_residual(*g.ops)  # norm's) for the GEMV that reads it
            else:  # one op, or a group no kernel fuses here: its ops one by one
                for j, op in enumerate(g.ops):
                    lower.ahead, lower.ahead2 = _next_two(ops, i + j)
                    lower.after = (walk, i + j)
                    body += lower.op(op)
                    lower.after = None
            i += len(g.ops)
        x_buf = lower.current("x")
        ends = {name: lower.current(name) for name in self.plan.carried}  # what a layer split hands on
        head = []
        if n_logits:
            if n_logits != T:
                lower.rows = n_logits
                lower.bind_external("x", self.tail)
            for j, op in enumerate(self.plan.head):
                lower.ahead, lower.ahead2 = _next_two(self.plan.head, j)
                lower.after = (self.plan.head, j)
                head += lower.op(op)
                lower.after = None
        logits = lower.current("logits") if n_logits and self.plan.head else None  # a split's first parts: no head
        body, head = HM.recording(body), Recording(head)  # prepared once, re-encoded every call
        self._graphs[key] = (body, head, x_buf, logits, ends)
        while len(self._graphs) > SHAPE_CACHE:
            self._graphs.popitem(last=False)
        return body, head, x_buf

    def _ends(self, T: int, far: bool = False, decode: bool = False) -> dict:
        """The buffers holding the carried values (Plan.carried) after the body of the headless
        graph of T rows: what a layer split's part hands to the next (infr/gpu/split.py)."""
        self._graph(T, 0, far, decode)
        decode = decode and T > KA.SPLIT_MAX_T
        return self._graphs[(T, 0, far and self._has_spans(T, decode), decode)][4]

    @property
    def dispatches_per_token(self) -> int:
        body, head, _ = self._graph(1, 1)
        return len(body) + len(head)


def _next_two(ops, i: int):
    """The two plan ops after ops[i] (None past the end): what a norm's output feeds."""
    return tuple(ops[j] if j < len(ops) else None for j in (i + 1, i + 2))

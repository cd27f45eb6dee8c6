"""The plan's fusion groups: its op list cut into runs a backend may take as one kernel.

Kinds: "qkv" (two or three matmuls of one input: one GEMV over stacked rows),
"qkv_rope_store" (a qkv of q, k and v, then the rope_store of those three: the GEMV may rotate and
store them itself), "gate_up" (the gate and up matmuls and their activation), "rope_store" (rope of
q and k, then the KV store of that k), "norm_rope_store" (a rope_store with the
per-head RMSNorms of its q, k or v before or after the ropes: QK-norm families),
"residual" (a matmul or MoE and the add of its output into the stream), "norm_residual"
(a post-norm and the add of its output into the stream, and a Mul of the stream after it:
gemma's post-norms, gemma4's layer_output_scale), "norm_residual_norm" (a norm_residual and the
whole-row RMSNorm of the new stream after it: gemma's pre-FFN norm, the next layer's input norm),
"norm_twins" (two whole-row RMSNorms of one input into two buffers, the second's in-place Mul after
them: gemma4's expert input and router input, from one sum of squares), "moe_post_norms" (a MoE, the
RMSNorm of its output and of another row f, both in place, and f + the MoE's: gemma4's block end),
"moe_residual_norm" (a MoE, the residual add of its output, and the whole-row RMSNorm of the new stream
after them: the next layer's input norm) and "op" (one op alone). The groups are part of the plan,
so a backend reads them instead of matching on op order; running a group's ops
one after another always gives its result, which is what the CPU reference does
and what the GPU does where a fused kernel does not apply (weights too large
for one binding, gate and up of shapes it cannot pair).
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.ops import Add, GatedAct, MatMul, MoE, Mul, Op, RMSNorm, Rope, StoreKV


@dataclass(frozen=True)
class Group:
    # qkv | qkv_rope_store | gate_up | rope_store | norm_rope_store | residual | norm_residual | norm_residual_norm
    # | norm_twins | moe_post_norms | moe_residual_norm | op
    kind: str
    ops: tuple[Op, ...]

    def stack(self) -> tuple[Op, ...]:
        """The matmuls of a qkv or qkv_rope_store group (those run as one stacked product); () otherwise."""
        return self.ops if self.kind == "qkv" else self.ops[:3] if self.kind == "qkv_rope_store" else ()


def groups(ops) -> tuple[Group, ...]:
    """ops cut into groups, in order (their ops, concatenated, are `ops`)."""
    ops = list(ops)
    out: list[Group] = []
    i = 0
    while i < len(ops):
        run = _stack_run(ops, i)
        nrs = _norm_rope_store(ops, i)
        if is_gate_up(ops[i : i + 3]):
            g = Group("gate_up", tuple(ops[i : i + 3]))
        elif run and _stores_stack(run, ops[i + len(run) : i + len(run) + 3]):
            g = Group("qkv_rope_store", tuple(ops[i : i + 6]))
        elif run:
            g = Group("qkv", tuple(run))
        elif nrs:
            g = Group("norm_rope_store", tuple(nrs))
        elif is_rope_store(ops[i : i + 3]):
            g = Group("rope_store", tuple(ops[i : i + 3]))
        elif is_moe_post_norms(ops[i : i + 4]):
            g = Group("moe_post_norms", tuple(ops[i : i + 4]))
        elif i + 2 < len(ops) and is_moe_residual_norm(ops[i : i + 3]):
            g = Group("moe_residual_norm", tuple(ops[i : i + 3]))
        elif i + 1 < len(ops) and is_residual(ops[i], ops[i + 1]):
            g = Group("residual", tuple(ops[i : i + 2]))
        elif i + 1 < len(ops) and is_norm_residual(ops[i], ops[i + 1]):
            scaled = i + 2 < len(ops) and isinstance(ops[i + 2], Mul) and ops[i + 2].buf == ops[i + 1].dst
            n = 3 if scaled else 2
            if i + n < len(ops) and is_stream_norm(ops[i + n], ops[i + 1].dst) and ops[i + n].dst != ops[i].src:
                g = Group("norm_residual_norm", tuple(ops[i : i + n + 1]))
            else:
                g = Group("norm_residual", tuple(ops[i : i + n]))
        elif n := _norm_twins(ops, i):
            g = Group("norm_twins", tuple(ops[i : i + n]))
        else:
            g = Group("op", (ops[i],))
        out.append(g)
        i += len(g.ops)
    return tuple(out)


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


def _stores_stack(run: list[MatMul], ops) -> bool:
    """q, k, v (the run), then the rope_store of exactly those three buffers."""
    if len(run) != 3 or not is_rope_store(ops):
        return False
    rq, rk, st = ops
    return (rq.buf, rk.buf, st.v) == tuple(m.dst for m in run)


def is_gate_up(ops) -> bool:
    """MatMul(g, h), MatMul(u, h), GatedAct(g, u): both products read only by the activation."""
    if len(ops) != 3:
        return False
    mg, mu, act = ops
    return (
        isinstance(mg, MatMul) and isinstance(mu, MatMul) and isinstance(act, GatedAct)
        and mg.src == mu.src and not mg.bias and not mu.bias
        and (act.gate, act.up) == (mg.dst, mu.dst) and mg.dst != mu.dst
    )


def is_rope_store(ops) -> bool:
    """Rope(q), Rope(k) with one RopeSpec, then StoreKV of that k: one rope_kv dispatch."""
    if len(ops) != 3:
        return False
    rq, rk, st = ops
    return (
        isinstance(rq, Rope) and isinstance(rk, Rope) and isinstance(st, StoreKV)
        and rq.rope == rk.rope and rq.head_dim == rk.head_dim and rk.buf == st.k
        and len({rq.buf, rk.buf, st.v}) == 3 and rq.head_dim <= 512
    )


def _head_norms(ops, i: int) -> list[RMSNorm]:
    """The in-place per-head RMSNorms from ops[i] on (at most three: q, k, v), one eps."""
    run: list[RMSNorm] = []
    for op in ops[i : i + 3]:
        if not (isinstance(op, RMSNorm) and op.dst == op.src and op.group) or any(op.dst == n.dst for n in run):
            break
        if run and op.eps != run[0].eps:
            break
        run.append(op)
    return run


def _norm_rope_store(ops, i: int) -> list[Op]:
    """Per-head RMSNorms of q, k or v, then rope(q), rope(k) and the store (gemma, qwen3),
    or rope(q), rope(k), the norms, then the store (llama4's norm after rope); [] if neither."""
    before = _head_norms(ops, i)
    if before and is_rope_store(ops[i + len(before) : i + len(before) + 3]):
        rq, rk, st = ops[i + len(before) : i + len(before) + 3]
        if {n.dst for n in before} <= {rq.buf, rk.buf, st.v}:
            return ops[i : i + len(before) + 3]
    if len(ops) > i + 2 and isinstance(ops[i], Rope):
        after = _head_norms(ops, i + 2)
        run = ops[i : i + 2] + after + ops[i + 2 + len(after) : i + 3 + len(after)]
        if after and is_rope_store(run[:2] + run[-1:]) and {n.dst for n in after} <= {run[0].buf, run[1].buf}:
            return run
    return []


def split_norm_rope_store(ops) -> tuple[list[RMSNorm], bool, tuple[Rope, Rope, StoreKV]]:
    """A norm_rope_store group's (norms, whether they come after the ropes, (rope q, rope k, store))."""
    ops = list(ops)
    if isinstance(ops[0], Rope):
        return ops[2:-1], True, (ops[0], ops[1], ops[-1])
    return ops[:-3], False, tuple(ops[-3:])


def is_residual(op, nxt) -> bool:
    """MatMul(o) or MoE(o), then Add(x, x, o): the plan's residual adds. The op's own
    output is read by that Add alone (the plan builder writes it so)."""
    return (
        isinstance(op, (MatMul, MoE)) and isinstance(nxt, Add) and nxt.dst != op.dst
        and {nxt.a, nxt.b} == {nxt.dst, op.dst}
    )


def is_moe_residual_norm(ops) -> bool:
    """MoE(o), Add(x, x, o), then RMSNorm of whole rows of x into another buffer (the MoE's input h too, as the
    plan writes the next layer's: the sum runs after every read of h, and reads no h itself)."""
    if len(ops) != 3:
        return False
    moe, add, norm = ops
    return isinstance(moe, MoE) and is_residual(moe, add) and is_stream_norm(norm, add.dst)


def is_norm_residual(norm, add) -> bool:
    """RMSNorm(o) of whole rows, then Add(x, x, o): the norm's output read by that Add alone (the
    plan builder writes post-norms so)."""
    return (
        isinstance(norm, RMSNorm) and isinstance(add, Add) and norm.group is None
        and {add.a, add.b} == {add.dst, norm.dst} and add.dst != norm.dst and norm.src != add.dst
    )


def is_stream_norm(op, stream: str) -> bool:
    """RMSNorm of whole rows of the stream into another buffer (a norm_residual's next norm)."""
    return isinstance(op, RMSNorm) and op.src == stream and op.group is None and op.dst != stream


def _norm_twins(ops, i: int) -> int:
    """How many ops from ops[i] form a norm_twins group: RMSNorm(a, x), RMSNorm(b, x) of whole rows with
    one eps into two other buffers (3 with a Mul of b after them); 0 if they do not."""
    a, b = ops[i : i + 2] if i + 1 < len(ops) else (None, None)
    if not (isinstance(a, RMSNorm) and isinstance(b, RMSNorm) and a.src == b.src and a.eps == b.eps
            and a.group is None and b.group is None and len({a.src, a.dst, b.dst}) == 3):
        return 0
    if i + 2 < len(ops) and is_norm_residual(b, ops[i + 2]):
        return 0  # b is a post-norm whose add takes it (norm_residual)
    return 3 if i + 2 < len(ops) and isinstance(ops[i + 2], Mul) and ops[i + 2].buf == b.dst else 2


def is_moe_post_norms(ops) -> bool:
    """MoE(m), RMSNorm(m, m), RMSNorm(f, f) of whole rows, Add(f, f, m)."""
    if len(ops) != 4:
        return False
    moe, nm, nf, add = ops
    return (
        isinstance(moe, MoE) and isinstance(nm, RMSNorm) and isinstance(nf, RMSNorm) and isinstance(add, Add)
        and nm.src == nm.dst == moe.dst and nf.src == nf.dst != moe.dst and nm.group is None and nf.group is None
        and add.dst == nf.dst and (add.a, add.b) == (nf.dst, moe.dst)
    )

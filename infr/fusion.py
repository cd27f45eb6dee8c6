"""The plan's fusion groups: its op list cut into runs a backend may take as one kernel.

Kinds: "qkv" (two or three matmuls of one input: one GEMV over stacked rows),
"gate_up" (the gate and up matmuls and their activation), "rope_store" (rope of
q and k, then the KV store of that k), "residual" (a matmul and the add of its
output into the stream) and "op" (one op alone). The groups are part of the plan,
so a backend reads them instead of matching on op order; running a group's ops
one after another always gives its result, which is what the CPU reference does
and what the GPU does where a fused kernel does not apply (weights too large
for one binding, gate and up of shapes it cannot pair).
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.ops import Add, GatedAct, MatMul, Op, Rope, StoreKV


@dataclass(frozen=True)
class Group:
    kind: str  # qkv | gate_up | rope_store | residual | op
    ops: tuple[Op, ...]


def groups(ops) -> tuple[Group, ...]:
    """ops cut into groups, in order (their ops, concatenated, are `ops`)."""
    ops = list(ops)
    out: list[Group] = []
    i = 0
    while i < len(ops):
        run = _stack_run(ops, i)
        if is_gate_up(ops[i : i + 3]):
            g = Group("gate_up", tuple(ops[i : i + 3]))
        elif run:
            g = Group("qkv", tuple(run))
        elif is_rope_store(ops[i : i + 3]):
            g = Group("rope_store", tuple(ops[i : i + 3]))
        elif i + 1 < len(ops) and is_residual(ops[i], ops[i + 1]):
            g = Group("residual", tuple(ops[i : i + 2]))
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


def is_residual(op, nxt) -> bool:
    """MatMul(o) then Add(x, x, o): the plan's residual adds. The matmul's own
    output is read by that Add alone (the plan builder writes it so)."""
    return (
        isinstance(op, MatMul) and isinstance(nxt, Add) and nxt.dst != op.dst
        and {nxt.a, nxt.b} == {nxt.dst, op.dst}
    )

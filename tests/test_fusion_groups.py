"""The plan's fusion groups (infr/fusion.py) on the three real models: they cut the
body into runs without losing or reordering an op, and each layer's runs are the
ones its family fuses on the GPU (q|k|v stacked with rope + KV store after it, gate||up, the
residual adds folded into the matmuls before them; Gemma-3's post-norms take its
residual adds, and its QK-norms join rope + KV store)."""

from __future__ import annotations

import pytest

from infr import fusion
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.ops import MatMul
from infr.plan import build_plan

LLAMA_LAYER = ["op:RMSNorm", "qkv_rope_store", "op:Attention", "residual", "op:RMSNorm", "gate_up", "residual"]
# Gemma-3's post-norms take the norm of the new stream after them too: the pre-FFN norm, and the next
# layer's input norm (so the first layer's input norm stands alone and the last layer's post-norm ends
# the body without one).
GEMMA3_LAYER = ["qkv", "norm_rope_store", "op:Attention", "op:MatMul", "norm_residual_norm",
                "gate_up", "op:MatMul", "norm_residual_norm"]
LAYERS = {"smollm2_path": LLAMA_LAYER, "qwen_coder_path": LLAMA_LAYER, "gemma3_path": GEMMA3_LAYER}


def _expected(fixture: str, n_layers: int) -> list[str]:
    if fixture != "gemma3_path":
        return ["op:Embed"] + LLAMA_LAYER * n_layers
    return ["op:Embed", "op:RMSNorm"] + (GEMMA3_LAYER * n_layers)[:-1] + ["norm_residual"]


def _kind(g: fusion.Group) -> str:
    return g.kind if g.kind != "op" else f"op:{type(g.ops[0]).__name__}"


@pytest.mark.parametrize("fixture", list(LAYERS))
def test_groups_cover_the_body_in_order(request, fixture):
    plan = build_plan(build_spec(open_gguf(request.getfixturevalue(fixture))))
    groups = plan.groups
    assert [op for g in groups for op in g.ops] == list(plan.embed + plan.layers)
    kinds = [_kind(g) for g in groups]
    assert kinds == _expected(fixture, len(plan.spec.layers))
    for g in groups:
        if g.stack():  # every product reads the norm's output; the stack ends at v
            assert len({m.src for m in g.stack()}) == 1 and [m.dst for m in g.stack()] == ["q", "k", "v"]
        if g.kind == "residual":
            mm, add = g.ops
            assert isinstance(mm, MatMul) and add.dst == "x" and mm.dst in (add.a, add.b)


def test_groups_of_a_short_list():
    """Runs where the kinds meet: gate||up wins over a two-matmul stack, a matmul whose
    output another matmul reads is no stack, and an op list may end on any op."""
    from infr.models.spec import Activation
    from infr.ops import Add, GatedAct

    ops = [MatMul("g", "h", "wg"), MatMul("u", "h", "wu"), GatedAct("a", "g", "u", Activation.SILU),
           MatMul("o", "a", "wd"), Add("x", "x", "o"), MatMul("p", "x", "w1"), MatMul("r", "p", "w2")]
    assert [g.kind for g in fusion.groups(ops)] == ["gate_up", "residual", "op", "op"]
    assert [g.kind for g in fusion.groups(ops[:2])] == ["qkv"]


def test_norm_rope_store_groups():
    """Per-head in-place norms of q, k or v before rope(q), rope(k), store (gemma, qwen3), or
    between the ropes and the store (llama4) join them; a norm of another buffer, a whole-row norm
    or a norm with its own output does not."""
    from infr.models.spec import RopeSpec, RopeStyle
    from infr.ops import RMSNorm, Rope, StoreKV

    r = RopeSpec(RopeStyle.NEOX, 1e4, 8, 1.0)
    rq, rk, st = Rope("q", 4, 8, r), Rope("k", 2, 8, r), StoreKV(0, "k", "v")
    nq, nk, nv = RMSNorm("q", "q", "wq", 1e-6, 8), RMSNorm("k", "k", "wk", 1e-6, 8), RMSNorm("v", "v", None, 1e-6, 8)
    assert [g.kind for g in fusion.groups([nv, nq, nk, rq, rk, st])] == ["norm_rope_store"]
    assert [g.kind for g in fusion.groups([rq, rk, nq, nk, st])] == ["norm_rope_store"]
    norms, after, triple = fusion.split_norm_rope_store(fusion.groups([rq, rk, nq, nk, st])[0].ops)
    assert after and norms == [nq, nk] and triple == (rq, rk, st)
    assert [g.kind for g in fusion.groups([nq, nk, rq, rk, st])][0] == "norm_rope_store"
    other = RMSNorm("h", "h", "w", 1e-6, 8)  # not q, k or v of the store
    assert [g.kind for g in fusion.groups([other, rq, rk, st])] == ["op", "rope_store"]
    whole = RMSNorm("q", "q", "wq", 1e-6)  # no group: a row norm, not per head
    assert [g.kind for g in fusion.groups([whole, rq, rk, st])] == ["op", "rope_store"]
    moved = RMSNorm("q2", "q", "wq", 1e-6, 8)  # writes elsewhere: the rope reads q, not q2
    assert [g.kind for g in fusion.groups([moved, rq, rk, st])] == ["op", "rope_store"]


@pytest.mark.parametrize("fixture", list(LAYERS))
def test_plan_widths_are_the_files_shapes(request, fixture):
    """Plan.widths (what the GPU sizes its buffers by) from the family's declared widths:
    every matmul's output is its weight's rows, every norm and add keeps its input's width."""
    from infr.plan import check_shapes

    gf = open_gguf(request.getfixturevalue(fixture))
    plan = build_plan(build_spec(gf))
    check_shapes(plan, gf)
    w = plan.widths
    for op in plan.ops:
        if isinstance(op, MatMul):
            assert w[op.dst] >= int(gf.tensor(op.weight).shape[0]) and w[op.src] == int(gf.tensor(op.weight).shape[-1])
    assert w["x"] == plan.spec.n_embd and w["logits"] == plan.spec.n_vocab


def test_mislabelled_file_fails_at_load_with_the_tensor(smollm2_path):
    """Metadata that disagrees with a tensor's shape (here a wrong feed_forward_length) is refused
    with the tensor's name, before any backend sizes a buffer by it."""
    import dataclasses

    from infr.errors import InfrError
    from infr.plan import check_shapes

    gf = open_gguf(smollm2_path)
    spec = build_spec(gf)
    layers = list(spec.layers)
    layers[3] = dataclasses.replace(layers[3], ffn=dataclasses.replace(layers[3].ffn, hidden=layers[3].ffn.hidden + 64))
    with pytest.raises(InfrError, match=r"blk\.3\.ffn_gate\.weight is 1536 x 576, but the model's metadata makes it"):
        check_shapes(build_plan(dataclasses.replace(spec, layers=tuple(layers))), gf)


def test_norm_twins_and_the_moe_block_end():
    """Two whole-row norms of one row (and a Mul of the second) are one group, unless the second is a
    post-norm whose add takes it; a MoE, both in-place post-norms and f + m are one group."""
    from infr.models.spec import MoESpec
    from infr.ops import Add, MoE, Mul, RMSNorm

    a, b, mul = RMSNorm("h", "x", "w1", 1e-6), RMSNorm("r", "x", None, 1e-6), Mul("r", "s", 0.5)
    assert [g.kind for g in fusion.groups([a, b, mul])] == ["norm_twins"]
    assert [g.kind for g in fusion.groups([a, b])] == ["norm_twins"]
    assert [g.kind for g in fusion.groups([a, RMSNorm("r", "x", None, 1e-5)])] == ["op", "op"]  # two eps
    assert [g.kind for g in fusion.groups([a, b, Add("y", "y", "r")])] == ["op", "norm_residual"]
    moe = MoE("m", "h", "router", 0, MoESpec(n_expert=4, n_used=2, hidden=8), ("gu", "d"))
    end = [moe, RMSNorm("m", "m", "w2", 1e-6), RMSNorm("f", "f", "w3", 1e-6), Add("f", "f", "m")]
    assert [g.kind for g in fusion.groups(end)] == ["moe_post_norms"]
    assert [g.kind for g in fusion.groups(end[:3] + [Add("f", "m", "f")])][0] != "moe_post_norms"
    # a MoE, its residual add and the next norm of the new stream (qwen3moe's block end, the next layer's input norm)
    nxt = [moe, Add("x", "x", "m"), RMSNorm("h", "x", "w4", 1e-6)]  # into the MoE's input buffer, as plans write it
    assert [g.kind for g in fusion.groups(nxt)] == ["moe_residual_norm"]
    assert [g.kind for g in fusion.groups(nxt[:2] + [RMSNorm("x", "x", "w4", 1e-6)])] == ["residual", "op"]  # in place
    assert [g.kind for g in fusion.groups(nxt[:2] + [RMSNorm("h2", "y", "w4", 1e-6)])] == ["residual", "op"]  # another row
    assert [g.kind for g in fusion.groups(nxt[:2])] == ["residual"]

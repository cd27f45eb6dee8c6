"""Each matmul's input numerics are part of the plan (MatMul.q8, set by infr.plan.bind from the
weight's type when the file is opened), and the CPU reference rounds exactly where the plan says.

Real files: SmolLM2 (Q4_1, its head Q8_0), Qwen2.5-Coder and Gemma 3 (Q4_K_M mixes: Q4_K, Q5_0,
Q6_K, Q8_0) round every matmul's activations to 8 bits; an F16 and a BF16 file (synth) round none.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.numerics import Q8_ACTIVATIONS
from infr.ops import MatMul
from infr.plan import bind, build_plan

REAL = {"smollm2_path": {Q.Q4_1, Q.Q8_0}, "qwen_coder_path": {Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0},
        "gemma3_path": {Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0}}


def _matmuls(plan) -> list[MatMul]:
    return [op for op in plan.ops if isinstance(op, MatMul)]


@pytest.mark.parametrize("fixture", list(REAL))
def test_bind_marks_every_matmul_of_a_real_model(fixture, request):
    gf = open_gguf(request.getfixturevalue(fixture))
    plan = build_plan(build_spec(gf))
    assert all(m.q8 is None for m in _matmuls(plan)) and not plan.bound  # the spec alone does not know
    bound = bind(plan, gf)
    types = {m.weight: gf.tensor(m.weight).qtype for m in _matmuls(bound)}
    assert set(types.values()) == REAL[fixture]  # the types this file holds, all rounding ones
    assert all(m.q8 is True for m in _matmuls(bound))
    # the rest of the plan is untouched: the same ops with the mark added, the same groups
    assert [replace(op, q8=None) if isinstance(op, MatMul) else op for op in bound.ops] == list(plan.ops)
    assert [(g.kind, len(g.ops)) for g in bound.groups] == [(g.kind, len(g.ops)) for g in plan.groups]
    assert all(m.q8 for g in bound.groups for m in g.ops if isinstance(m, MatMul))
    assert bind(bound, gf) is bound  # marked already: as it is


@pytest.mark.parametrize("wtype", ["F16", "BF16"])
def test_float_weights_multiply_unrounded_activations(wtype, tmp_path):
    spec = synth.SynthSpec("llama", n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, n_ff=128,
                           n_vocab=96, ctx=32, weight_type=wtype)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    bound = bind(build_plan(build_spec(gf)), gf)
    types = {gf.tensor(m.weight).qtype for m in _matmuls(bound)}
    assert types and not types & Q8_ACTIVATIONS
    assert [m.q8 for m in _matmuls(bound)] == [False] * len(_matmuls(bound))


def test_engine_and_backend_share_the_bound_plan(smollm2_path):
    model = Model(smollm2_path, n_ctx=32, backend="cpu")
    assert model.plan.bound and model.backend.plan is model.plan


def test_cpu_rounds_where_the_plan_says(smollm2_path):
    """The CPU backend takes each matmul's numerics from the op: unmarking one matmul (layer 0's
    ffn_down) changes the logits, marking it back by hand gives bind's logits bit for bit, and a
    backend given an unbound plan binds it the same way."""
    gf = open_gguf(smollm2_path)
    plan = build_plan(build_spec(gf))
    bound = bind(plan, gf)
    ids = [1, 504, 3403, 314, 260, 2378, 28, 10, 77, 1900, 5, 42]
    want = CPUBackend(gf, bound, 16).forward(ids, 0, n_logits=len(ids))
    assert np.array_equal(CPUBackend(gf, plan, 16).forward(ids, 0, n_logits=len(ids)), want)

    def marked(q8: bool):
        layers = tuple(replace(op, q8=q8) if isinstance(op, MatMul) and op.weight == "blk.0.ffn_down.weight"
                       else replace(op, q8=True) if isinstance(op, MatMul) else op for op in plan.layers)
        head = tuple(replace(op, q8=True) if isinstance(op, MatMul) else op for op in plan.head)
        return replace(plan, layers=layers, head=head)

    off = CPUBackend(gf, marked(False), 16)
    assert off.plan.bound and not [m for m in _matmuls(off.plan) if m.weight == "blk.0.ffn_down.weight"][0].q8
    unrounded = off.forward(ids, 0, n_logits=len(ids))
    assert not np.array_equal(unrounded, want)
    assert np.array_equal(CPUBackend(gf, marked(True), 16).forward(ids, 0, n_logits=len(ids)), want)

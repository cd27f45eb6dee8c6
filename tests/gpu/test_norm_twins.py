"""Two norms of one row in one dispatch (fusion.py's norm_twins; rmsnorm_q8.wgsl with
rmsnorm_twin_on.wgsl): gemma4's expert input (pre_ffw_norm_2, rounded for the experts' int8 GEMV) and
its router input (the weightless norm times ffn_gate_inp.scale / sqrt(n_embd)) from one sum of squares.
Word for word what rmsnorm_q8 and a second rmsnorm_q8 then the Mul write; a 26B-style layer at a
256-wide stream takes it (three dispatches fewer: the second norm, the Mul, the experts' quantize) and
follows the CPU reference, with its block end (the experts' sum, both post-norms, their add) in the
combine (moe_combine_norms)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infr.gpu import kernels_gemma4 as KG4
from infr.gpu import kernels_q8 as KQ
from infr.gpu.runtime import read, run, storage

from closeness import assert_follows_greedy, assert_logits_close
from test_tint import _Recorder, _tint_errors, tint  # noqa: F401  tint: Dawn's Null device (skips without wgpudawn)


def _words(gpu, buf, n):
    return read(gpu, buf, np.uint32, count=n)


@pytest.mark.parametrize("width,T,w2_width,weighted", [
    (256, 1, 256, False),  # gemma4: a weightless twin, a vector after it
    (2816, 3, 2816, False),  # the 26B's stream: three workgroups a row
    (512, 2, 1, True),  # a one-value Mul, a weighted twin
    (768, 2, 0, True),  # no Mul (scale 1, one 1.0)
])
def test_twin_equals_two_norms_and_the_mul(gpu, kernels, width, T, w2_width, weighted):
    rng = np.random.default_rng(width + T)
    x = storage(gpu, (rng.standard_normal((T, width)) * 3).astype(np.float32))
    ga = storage(gpu, rng.uniform(0.5, 1.5, width).astype(np.float32))
    gb = storage(gpu, rng.uniform(0.5, 1.5, width).astype(np.float32) if weighted else np.ones(width, np.float32))
    w2 = storage(gpu, rng.uniform(-2, 2, w2_width).astype(np.float32) if w2_width else np.ones(1, np.float32))
    scale = 0.0625 if w2_width else 1.0
    n = T * width

    # unfused: the norm (rounded), the second norm, the Mul in place
    ya, yb = storage(gpu, 4 * n), storage(gpu, 4 * n)
    d, xq = KQ.rmsnorm_q8_dispatch(kernels, x, ga, ya, width, 1e-6, T)
    run(gpu, [d])
    want_q = _words(gpu, xq, T * KQ.words(width))
    d2, _ = KQ.rmsnorm_q8_dispatch(kernels, x, gb, yb, width, 1e-6, T)
    ds = [d2] + ([KG4.mul_dispatch(kernels, yb, w2, n, w2_width, scale)] if w2_width else [])
    run(gpu, ds)
    want = [_words(gpu, ya, n), _words(gpu, yb, n)]

    za, zb = storage(gpu, 4 * n), storage(gpu, 4 * n)
    d, xq = KQ.rmsnorm_q8_dispatch(kernels, x, ga, za, width, 1e-6, T, twin=(gb, zb, scale, w2, max(w2_width, 1)))
    assert d.label == "rmsnorm_q8_twin"
    run(gpu, [d])
    np.testing.assert_array_equal(_words(gpu, za, n), want[0])
    np.testing.assert_array_equal(_words(gpu, zb, n), want[1])
    np.testing.assert_array_equal(_words(gpu, xq, T * KQ.words(width)), want_q)
    assert not np.array_equal(want[0], want[1])


def test_a_26b_style_layer_takes_the_twin_and_follows_the_cpu_reference(gpu, tmp_path):
    from infr import synth
    from infr.cpu.backend import CPUBackend
    from infr.gguf_file import open_gguf
    from infr.gpu.backend import GPUBackend
    from infr.models import build_spec
    from infr.plan import build_plan

    spec = replace(synth.PRESETS["tiny-gemma4-moe"], n_embd=256, n_ff_exp=64, weight_type="Q8_0",
                   name="gemma4-moe-256")
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "g4moe.gguf"))
    plan = build_plan(build_spec(gf))
    assert [g.kind for g in plan.groups].count("norm_twins") == spec.n_layers
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    labels = [d.label for d in g._multi_step(1, False).dispatches]
    assert labels.count("rmsnorm_q8_twin") == spec.n_layers and "mul" not in labels, labels
    # and the block's end in the experts' combine: both post-norms and their add (moe_post_norms)
    assert sum(lb.startswith("moe_combine_norms") for lb in labels) == spec.n_layers, labels
    # (one rmsnorm_add left: the last layer's final post-norm, with no next layer's norm to take)
    assert labels.count("rmsnorm_add") == 1 and not any(lb.startswith("moe_combine ") for lb in labels), labels
    # the experts read the twin's rounded rows: no quantize before their pair
    for i, lb in enumerate(labels):
        if "_expert_gate_up" in lb:
            assert not labels[i - 1].startswith("quantize_q8") and labels[i - 1].startswith("moe_route"), labels
    prompt = np.random.default_rng(22).integers(0, plan.spec.n_vocab, 20).tolist()
    assert_logits_close(g.forward(prompt, 0, n_logits=20), c.forward(prompt, 0, n_logits=20), True)
    first = int(np.argmax(g.forward(prompt[:6], 0)[-1]))
    got = [first] + g.decode_greedy(first, 6, 10)
    assert_follows_greedy(c, prompt[:6], got)


def test_twin_passes_tint(gpu, tint):  # noqa: F811
    """rmsnorm_q8 with and without its twin, in both roundings, compiles under Tint (tests/gpu/test_tint.py)."""
    asked: set = set()
    for mode in ("infr", "llamacpp"):
        for twin in ("on", "off"):
            _Recorder(gpu, asked).pipeline("rmsnorm_q8", TWIN=f"// #include rmsnorm_twin_{twin}", Q8_ROUND=mode)
    assert len(asked) == 4
    errors = _tint_errors(tint, asked)
    assert not errors, errors

"""The activation rounding's two modes (infr.numerics.ROUNDINGS) on the CPU: llama.cpp's differs
from infr's where it should, the integer lanes' parts (infr/cpu/mmq.py) are numerics' rounding in
either mode, and a plan carries the mode (Plan.q8_rounding) to the reference's matmuls.
The GPU kernels' side: tests/gpu/test_q8.py; against llama.cpp itself: tests/test_moe_exact.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infr import synth
from infr.cpu import mmq
from infr.cpu.backend import CPUBackend
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.numerics import INFR, LLAMACPP, ROUNDINGS, q8_parts, quantize_q8
from infr.plan import build_plan


def _x(t: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, k)) * rng.uniform(0.01, 100, (t, 1))).astype(np.float32)
    x[0, :32] = 0.0
    return x


def test_llamacpp_rounding_differs_from_infrs():
    """The f16 scale, and q where x * (127 / max) and x / d fall on either side of a half step
    (rare: they differ by an ulp or so)."""
    x = _x(256, 4096, 1)
    qi, di = q8_parts(x, INFR)
    ql, dl = q8_parts(x, LLAMACPP)
    assert (di != dl).mean() > 0.5  # most f32 scales are not f16 values
    np.testing.assert_array_equal(dl, di.astype(np.float16).astype(np.float32))
    assert 0 < (qi != ql).sum() < 1e-4 * qi.size
    assert np.abs(qi - ql).max() == 1 and np.abs(ql).max() == 127


def test_ties_round_half_to_even_in_both_modes():
    e = np.float32(0.25)  # max 127 e: d = e and 127 / max = 1 / e exactly, so x / e are the halves themselves
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5], np.float32)
    x = np.zeros((1, 32), np.float32)
    x[0, : len(halves)] = halves * e
    x[0, -1] = 127 * e
    for mode in ROUNDINGS:
        q, d = q8_parts(x, mode)
        assert float(d[0, 0, 0]) == e
        np.testing.assert_array_equal(q[0, 0, : len(halves)], [0, 2, 2, -0, -2, -2, 126, -126])


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_integer_lanes_take_the_modes_rounding(mode):
    x = _x(5, 256, 2)
    q, d, s = mmq.quantize(x, mode)
    wq, wd = q8_parts(x, mode)
    np.testing.assert_array_equal(q, wq.reshape(5, 256))
    np.testing.assert_array_equal(d, wd.reshape(5, 8))
    np.testing.assert_array_equal(s, wd.reshape(5, 8) * wq.sum(-1))
    np.testing.assert_array_equal(mmq.dequantized(q, d), quantize_q8(x, mode))


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rounding") / "tiny-llama-q8_0.gguf"
    return open_gguf(synth.write_gguf(replace(synth.PRESETS["tiny-llama"], weight_type="Q8_0"), path))


def test_plan_refuses_an_unknown_rounding(q8_file):
    with pytest.raises(ValueError, match="infr, llamacpp"):
        replace(build_plan(build_spec(q8_file)), q8_rounding="nearest")


def test_the_reference_rounds_as_its_plan_says(q8_file):
    """The same Q8_0 file in each mode: prompt rows (float products of the rounded input) and a
    decode row (the integer lanes) both change with the mode, by little."""
    plan = build_plan(build_spec(q8_file))
    ids = [1, 7, 42, 3, 99]
    out = {}
    for mode in ROUNDINGS:
        be = CPUBackend(q8_file, replace(plan, q8_rounding=mode), 64)
        out[mode] = (be.forward(ids, 0, n_logits=len(ids)), be.forward([5], len(ids)))
    for a, b in zip(out[INFR], out[LLAMACPP]):
        assert not np.array_equal(a, b)
        np.testing.assert_allclose(a, b, atol=0.05 * np.abs(a).max())

"""Integer sums of 8-bit activations and weight lanes (infr/cpu/mmq.py): a row's result alone equals
its result in any batch, bit for bit, and is the matmul the reference means.

- the lanes and scales give back the dequantized weights bit for bit (every type with lanes);
- mmq.quantize is numerics.quantize_q8 in parts;
- mmq.matmul of 8 different rows at once equals each row alone (and any subset, any order);
- it is close to the float product quantize_q8(x) @ W;
- the CPU backend: 8 sequences' decode rows in one step give each row's logits alone, bit for bit,
  also with prompt rows of another sequence in the step.
The llama.cpp fixtures (tests/test_generation.py, tests/test_engine.py) cover the real models' tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from infr.batch import Batch, OutputRow
from infr.cpu import dequant, mmq
from infr.cpu.backend import CPUBackend
from infr.engine import Model
from infr.numerics import Q8_ACTIVATIONS, quantize_q8
from infr.sampling import SamplingParams

TYPES = sorted(mmq._KERNELS, key=lambda q: q.name)
GREEDY = SamplingParams(temperature=0.0)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _blocks(qtype, n: int, k: int, seed: int, finite: bool = False) -> np.ndarray:
    """Random [n, k] blocks; finite: every scale a finite f16 of moderate size."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (n * k // block, size), dtype=np.uint8)
    if finite:
        with np.errstate(all="ignore"):
            w = dequant.dequantize(raw, qtype, (n * k // block, block))
        bad = ~np.isfinite(w).all(axis=1) | (np.abs(w).max(axis=1) > 1e4)
        ok = raw[~bad]
        raw[bad] = ok[np.arange(int(bad.sum())) % len(ok)]
    return raw


def test_every_q8_type_but_iq4_has_lanes():
    assert {q.name for q in Q8_ACTIVATIONS} - {q.name for q in TYPES} == {"IQ4_NL", "IQ4_XS"}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_lanes_give_back_the_weights(qtype):
    n, k = 300, 512  # several kernel chunks of whole rows
    raw = _blocks(qtype, n, k, int(qtype))
    with np.errstate(all="ignore"):
        want = dequant.dequantize(raw, qtype, (n, k))
        w = mmq.lanes(raw, qtype, (n, k))
        got = w.q * w.a[:, None, :]  # [groups, G, N]: a q, then + m as dequant does
        if w.m is not None:
            got += w.m[:, None, :]
    assert w.q.dtype == np.float32 and np.array_equal(w.q, np.rint(w.q)) and np.abs(w.q).max() <= 128
    got = got.transpose(2, 0, 1).reshape(n, k)
    nan = np.isnan(want)  # (a NaN's sign may differ: q * dl - ml against q * dl + (-ml))
    assert nan.any() and np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(_bits(got[~nan]), _bits(want[~nan]))


def test_quantize_is_quantize_q8_in_parts():
    x = np.random.default_rng(1).standard_normal((5, 256)).astype(np.float32)
    x[1, :32] = 0  # a zero block: d = 0, q = 0
    x[2, 40] = 1e30
    q, d, s = mmq.quantize(x)
    np.testing.assert_array_equal(_bits(mmq.dequantized(q, d)), _bits(quantize_q8(x)))
    assert np.abs(q).max() <= 127 and np.array_equal(q, np.rint(q))
    np.testing.assert_array_equal(s, d * q.reshape(5, 8, 32).sum(-1))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_row_batched_equals_it_alone(qtype):
    n, k = 640, 1536
    w = mmq.lanes(_blocks(qtype, n, k, 7, finite=True), qtype, (n, k))
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((8, k)).astype(np.float32) * rng.uniform(0.01, 100, (8, 1)).astype(np.float32)
    q, d, s = mmq.quantize(x)
    together = mmq.matmul(q, d, s, w)
    for i in range(8):
        alone = mmq.matmul(q[i : i + 1], d[i : i + 1], s[i : i + 1], w)
        np.testing.assert_array_equal(_bits(alone[0]), _bits(together[i]))
    for sel in ([5, 2], [7, 0, 3], [1, 6, 4, 0, 2]):  # other batch sizes and orders
        np.testing.assert_array_equal(_bits(mmq.matmul(q[sel], d[sel], s[sel], w)), _bits(together[sel]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_close_to_the_float_product(qtype):
    n, k = 256, 512
    raw = _blocks(qtype, n, k, 3, finite=True)
    w = mmq.lanes(raw, qtype, (n, k))
    x = np.random.default_rng(2).standard_normal((3, k)).astype(np.float32)
    got = mmq.matmul(*mmq.quantize(x), w)
    want = quantize_q8(x).astype(np.float64) @ dequant.dequantize(raw, qtype, (n, k)).T.astype(np.float64)
    scale = np.abs(quantize_q8(x)).astype(np.float64) @ np.abs(dequant.dequantize(raw, qtype, (n, k))).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30)


# ---------------------------------------------------------------- the backend


@pytest.fixture(scope="module", params=["smollm2_path", "gemma3_path"])
def backend(request):
    model = Model(request.getfixturevalue(request.param), n_ctx=128, backend="cpu")
    return CPUBackend(model.gguf, model.plan, 128, kv_blocks=10 * (128 // 16), max_seqs=10)


def _table(be: CPUBackend, slot: int) -> list[int]:
    return list(range(slot * be.blocks_per_seq, (slot + 1) * be.blocks_per_seq))


def _step(be: CPUBackend, rows: list[tuple[int, int, int, bool]]) -> dict[int, np.ndarray]:
    """rows (slot, token, position, generated); logits of every generated row, by slot."""
    slots = sorted({r[0] for r in rows})
    out = [OutputRow(i, GREEDY, want_logits=True) for i, r in enumerate(rows) if r[3]]
    batch = Batch(np.array([r[1] for r in rows], np.int32), np.array([r[2] for r in rows], np.int32),
                  np.array([r[0] for r in rows], np.int32), {s: _table(be, s) for s in slots}, out,
                  generated=np.array([r[3] for r in rows]))
    res = be.step(batch)
    return {rows[o.row][0]: res.logits[i] for i, o in enumerate(out)}


def test_eight_decode_rows_batched_equal_each_alone(backend):
    be = backend
    assert be.lanes, "the model's matmuls take the integer path"
    rng = np.random.default_rng(0)
    prompts = {s: rng.integers(10, 1000, 5 + 3 * s).tolist() for s in range(8)}
    for s, p in prompts.items():
        _step(be, [(s, t, i, False) for i, t in enumerate(p)])
    nxt = {s: int(rng.integers(10, 1000)) for s in prompts}
    rows = [(s, nxt[s], len(prompts[s]), True) for s in range(8)]
    alone = {s: _step(be, [r])[s] for s, r in zip(range(8), rows)}
    together = _step(be, rows[::-1])  # one step, another order
    mixed = _step(be, rows[:3] + [(9, t, i, False) for i, t in enumerate(range(40, 60))] + rows[3:])
    for s in range(8):
        np.testing.assert_array_equal(_bits(together[s]), _bits(alone[s]), err_msg=f"slot {s}")
        np.testing.assert_array_equal(_bits(mixed[s]), _bits(alone[s]), err_msg=f"slot {s} with prompt rows")

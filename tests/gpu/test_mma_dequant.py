"""The tensor-core tiles' f16 weight rows (wgsl/mma_dequant.wgsl, kernels_mmq.weight_rows) against
gguf's dequantizer, for every block reader: each value is the block's value rounded to f16, a pair's
up rows follow its gate rows, each half padded to 128 rows with copies of its last row.

The pass uses no subgroup matrices, so it runs on lavapipe too (the tiles that read its rows run
only on Dawn with tensor cores: test_mma.py checks them against the tiles converting their own).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_quant_kernels import make_weight, reference  # tests/gpu is on sys.path (prepend import mode)

from gguf import GGMLQuantizationType as Q

from infr.errors import UnsupportedError
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu.runtime import read, run, storage

# (rows, K): rows not whole 64-row workgroups; K of 9 and 17 stages of 64 values, so the last of
# a workgroup's eight stages is partial (32-value types), or whole 256s (super-block types).
SHAPES = {32: [(70, 576), (200, 1088)], 256: [(70, 768), (129, 1280)]}


@pytest.fixture(autouse=True)
def f16(gpu):
    if not gpu.has("shader-f16"):
        pytest.skip(f"{gpu.name} offers no shader-f16: the f16 weight pass feeds only the tensor-core tiles, which "
                    "need it too (lavapipe and NVIDIA have it, so CI runs these)")


def _case(kernels, q, rows: int, K: int, pair: bool, rng, direct: bool = False, ts=None):
    ts = ts or [make_weight(q, rows, K, rng) for _ in range(2 if pair else 1)]
    bufs = [KM.upload_weight(kernels.dev, t)[0][0] for t in ts]
    p = storage(kernels.dev, KMQ._params(q, K, rows, 0, rows, 1, False, False), uniform=True)
    d, w16 = KMQ.weight_rows(kernels, q, p, bufs, K, rows, direct=direct)
    run(kernels.dev, [d])
    padded = -(-rows // 128) * 128
    got = read(kernels.dev, w16, dtype=np.float16, count=padded * K * len(ts)).reshape(len(ts), padded, K)
    return ts, got, padded


def _close(name, got, want):
    """Each value is a q + b in f32, then converted to f16 (WGSL lets it round either way: within one
    f16 step, 2^-10 relative) of the f64 value, plus the f32 products' rounding."""
    err = np.abs(got.astype(np.float64) - want)
    bound = 2.0**-10 * np.abs(want) + 2.0**-20 * np.abs(want).max() + 2.0**-24
    assert (err <= bound).all(), f"{name}: worst {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("pair", [False, True], ids=["plain", "pair"])
@pytest.mark.parametrize("qtype", list(KMQ.READERS), ids=lambda q: q.name.lower())
def test_rows_are_the_blocks_values_in_f16(gpu, kernels, qtype, pair):
    qk, _ = KM.block_shape(qtype)
    rng = np.random.default_rng([int(qtype), pair])
    for rows, K in SHAPES[qk]:
        ts, got, padded = _case(kernels, qtype, rows, K, pair, rng)
        for half, t in zip(got, ts):
            _close(f"{qtype.name} {rows}x{K}", half[:rows], reference(t))
            # rows up to the 128-row padding copy the last row
            np.testing.assert_array_equal(half[rows:], np.broadcast_to(half[rows - 1], (padded - rows, K)))


@pytest.mark.parametrize("pair", [False, True], ids=["plain", "pair"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0], ids=lambda q: q.name.lower())
def test_direct_units_give_the_same_values(gpu, kernels, qtype, pair):
    """The direct conversion of the tensor-core tiles that dequantize no rows first (kernels_mma.DIRECT_TILE,
    mma_direct_TYPE.wgsl's unit_f16: fetched units straight into f16, no int8 lanes staged), run here by the
    pass's DIRECT form: the same bits as the staged conversion, so within the bound of gguf's values. Q6_K
    rows of 1280 values are 1050 bytes, so every other row's blocks start 2 bytes past a word (as Q8_0's and
    Q5_0's 34- and 22-byte blocks do within rows)."""
    assert KM.wgsl_name(qtype) in KMA.DIRECT_TYPES
    rng = np.random.default_rng([int(qtype), pair, 3])
    for rows, K in SHAPES[KM.block_shape(qtype)[0]]:
        ts, want, _ = _case(kernels, qtype, rows, K, pair, rng)
        _, got, _ = _case(kernels, qtype, rows, K, pair, rng, direct=True, ts=ts)
        for half, t in zip(got, ts):
            _close(f"{qtype.name} {rows}x{K} direct", half[:rows], reference(t))
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_direct_form_only_for_its_types(kernels):
    with pytest.raises(UnsupportedError, match="no direct conversion of iq4_xs"):
        KMQ.dequant_pipeline(kernels, Q.IQ4_XS, False, direct=True)


@pytest.mark.parametrize("sizes", [(256, 128, 128), (200, 100, 60)], ids=lambda s: "+".join(map(str, s)))
def test_mixed_stack_rows(gpu, kernels, sizes):
    """A Q4_K_M layer's mixed q|k|v (Q4_K q and k, a Q6_K v) as the tensor-core tile reads it: each
    matrix's pass reads a view of the stacked upload and writes its rows at its first row of one f16
    buffer; passes of whole 64-row workgroups run into the next matrix's rows, which its own pass (later
    in the same pass) writes over, and the last fills the 128-row padding with its last row."""
    K = 512
    rng = np.random.default_rng(sum(sizes))
    ts = [make_weight(q, n, K, rng) for q, n in zip((Q.Q4_K, Q.Q4_K, Q.Q6_K), sizes)]
    chunks = KM.upload_stacked(kernels.dev, ts, label="qkv")
    passes, w16 = KMQ.mixed_weight_rows(kernels, ts, chunks)
    assert [d.label.split()[0] for d in passes] == ["mma_dequant_q4_k", "mma_dequant_q4_k", "mma_dequant_q6_k"]
    run(kernels.dev, passes)
    N = sum(sizes)
    padded = -(-N // 128) * 128
    got = read(kernels.dev, w16, dtype=np.float16, count=padded * K).reshape(padded, K)
    first = 0
    for t, n in zip(ts, sizes):
        _close(f"{t.qtype.name} rows {first}..{first + n}", got[first: first + n], reference(t))
        first += n
    np.testing.assert_array_equal(got[N:], np.broadcast_to(got[N - 1], (padded - N, K)))

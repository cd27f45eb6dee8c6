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

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_mmq as KMQ
from infr.gpu.runtime import read, run, storage

# (rows, K): rows not whole 64-row workgroups; K of 9 and 17 stages of 64 values, so the last of
# a workgroup's eight stages is partial (32-value types), or whole 256s (super-block types).
SHAPES = {32: [(70, 576), (200, 1088)], 256: [(70, 768), (129, 1280)]}


def _case(kernels, q, rows: int, K: int, pair: bool, rng):
    ts = [make_weight(q, rows, K, rng) for _ in range(2 if pair else 1)]
    bufs = [KM.upload_weight(kernels.dev, t)[0][0] for t in ts]
    p = storage(kernels.dev, KMQ._params(q, K, rows, 0, rows, 1, False, False), uniform=True)
    d, w16 = KMQ.weight_rows(kernels, q, p, bufs, K, rows)
    run(kernels.dev, [d])
    padded = -(-rows // 128) * 128
    got = read(kernels.dev, w16, dtype=np.float16, count=padded * K * len(ts)).reshape(len(ts), padded, K)
    return ts, got, padded


@pytest.mark.parametrize("pair", [False, True], ids=["plain", "pair"])
@pytest.mark.parametrize("qtype", list(KMQ.READERS), ids=lambda q: q.name.lower())
def test_rows_are_the_blocks_values_in_f16(gpu, kernels, qtype, pair):
    if not gpu.has("shader-f16"):
        pytest.skip(f"{gpu.name} has no shader-f16")
    qk, _ = KM.block_shape(qtype)
    rng = np.random.default_rng([int(qtype), pair])
    for rows, K in SHAPES[qk]:
        ts, got, padded = _case(kernels, qtype, rows, K, pair, rng)
        for half, t in zip(got, ts):
            want = reference(t)
            # each value is a q + b in f32, then converted to f16 (WGSL lets it round either way:
            # within one f16 step, 2^-10 relative) of the f64 value, plus the f32 products' rounding
            err = np.abs(half[:rows].astype(np.float64) - want)
            bound = 2.0**-10 * np.abs(want) + 2.0**-20 * np.abs(want).max() + 2.0**-24
            assert (err <= bound).all(), f"{qtype.name} {rows}x{K}: worst {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"
            # rows up to the 128-row padding copy the last row
            np.testing.assert_array_equal(half[rows:], np.broadcast_to(half[rows - 1], (padded - rows, K)))

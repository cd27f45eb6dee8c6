"""infr.cpu.dequant equals gguf's dequantizers bit for bit, and load_all equals one-by-one loading.

Random blocks cover every bit pattern a kernel unpacks (scales that are NaN,
infinite or subnormal included); sizes cross the kernel's chunk boundary and
leave a partial chunk. tests/test_dequant.py checks the real models' tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize

from infr.cpu import dequant
from infr.cpu.weights import SUPPORTED_TYPES, WeightStore, dequantize_tensor
from infr.gguf_file import open_gguf


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=lambda q: q.name), ids=lambda q: q.name)
def test_random_blocks_equal_gguf(qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = dequant.CHUNK_VALUES // block + 37  # one whole chunk and a partial one
    raw = np.random.default_rng(int(qtype)).integers(0, 256, (n_blocks, size), dtype=np.uint8)
    ref_in = {Q.F32: np.float32, Q.F16: np.float16}
    ref_in = raw.reshape(-1).view(ref_in[qtype]) if qtype in ref_in else raw
    with np.errstate(all="ignore"):
        want = gguf_dequantize(ref_in, qtype)
        got = dequant.dequantize(raw, qtype, (n_blocks * block,))
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if qtype in dequant.KERNELS:
        assert np.isnan(want).any()  # the scales' NaN patterns were exercised


def test_every_type_of_the_real_models_has_a_kernel(smollm2_path, gemma3_path, qwen_coder_path):
    for p in (smollm2_path, gemma3_path, qwen_coder_path):
        for t in open_gguf(p).tensors.values():
            assert t.qtype in dequant.KERNELS or t.qtype == Q.F32, t.type_name


def test_load_all_equals_one_by_one(smollm2_path):
    gf = open_gguf(smollm2_path)
    names = [n for n in gf.tensors if n != "token_embd.weight"]
    store = WeightStore(gf)
    store.load_all(names + names[:3], skip=frozenset({names[-1]}))  # repeats and a skipped name
    assert names[-1] not in store._cache
    for name in names[:-1]:
        w = store[name]
        assert w.dtype == np.float32 and w.flags.c_contiguous and w.shape == gf.tensor(name).shape, name
        np.testing.assert_array_equal(_bits(w), _bits(dequantize_tensor(gf.tensor(name))), err_msg=name)
    np.testing.assert_array_equal(store[names[-1]], dequantize_tensor(gf.tensor(names[-1])))

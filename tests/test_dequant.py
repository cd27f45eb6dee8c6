"""The reference backend's weights equal gguf's dequantizers on the real models.

Covers every tensor type the three real models hold (F32, Q4_1, Q4_K, Q5_0,
Q6_K, Q8_0): whole matrices as the backend loads them, embedding rows
gathered from raw blocks, and the numpy (rows, cols) orientation.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from infr.cpu.weights import WeightStore, dequantize_rows
from infr.gguf_file import open_gguf

MODELS = ["smollm2_path", "gemma3_path", "qwen_coder_path"]


def _one_of_each_type(gf):
    seen = {}
    for t in gf.tensors.values():
        if t.type_name not in seen or (t.raw.nbytes < seen[t.type_name].raw.nbytes and len(t.shape) == 2):
            seen[t.type_name] = t
    return seen


@pytest.mark.parametrize("fixture", MODELS)
def test_every_type_equals_gguf(fixture, request):
    gf = open_gguf(request.getfixturevalue(fixture))
    store = WeightStore(gf)
    types = _one_of_each_type(gf)
    assert "F32" in types and len(types) >= 3
    for name, t in types.items():
        ours = store[t.name]
        ref = dequantize(np.array(t.raw), t.qtype).reshape(t.shape)
        assert ours.shape == t.shape and ours.dtype == np.float32, name
        np.testing.assert_array_equal(ours, ref, err_msg=f"{t.name} ({name})")
        assert np.isfinite(ours).all(), name


@pytest.mark.parametrize("fixture", MODELS)
def test_embedding_rows_gathered_from_blocks(fixture, request):
    gf = open_gguf(request.getfixturevalue(fixture))
    t = gf.tensor("token_embd.weight")
    ids = np.array([0, 1, 17, t.shape[0] // 2, t.shape[0] - 1])
    rows = dequantize_rows(t, ids)
    full_rows = dequantize(np.array(t.raw[ids]), t.qtype)
    np.testing.assert_array_equal(rows, full_rows)
    assert rows.shape == (len(ids), t.shape[1])


def test_types_present(smollm2_path, gemma3_path, qwen_coder_path):
    # The union the issue names: the test above must have seen each of these.
    present = set()
    for p in (smollm2_path, gemma3_path, qwen_coder_path):
        present |= {t.type_name for t in open_gguf(p).tensors.values()}
    assert present == {"F32", "Q4_1", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}


def test_matrix_orientation_matches_gguf_dims(smollm2_path):
    # GGUF lists ffn_up as [576, 1536] (fastest first): 1536 outputs of 576 inputs.
    gf = open_gguf(smollm2_path)
    assert gf.tensor("blk.0.ffn_up.weight").shape == (1536, 576)
    assert WeightStore(gf)["blk.0.ffn_down.weight"].shape == (576, 1536)

"""A model split into shards (`name-0000i-of-0000n.gguf`) loads as one."""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from infr.cpu.backend import CPUBackend
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.plan import build_plan
from infr.synth import PRESETS, write_gguf


def _split(src, stem, max_tensors: int):
    """Rewrite src as shards with gguf's own split writer."""
    r = GGUFReader(src)
    w = GGUFWriter(stem, r.fields["general.architecture"].contents(), split_max_tensors=max_tensors)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), kind, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), kind)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_split_model_equals_single_file(tmp_path):
    single = write_gguf(PRESETS["tiny-llama"], tmp_path / "one.gguf")
    _split(single, tmp_path / "model.gguf", max_tensors=7)
    shards = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert len(shards) >= 3
    whole, split = open_gguf(single), open_gguf(shards[1])  # any shard opens the set
    assert split.paths == shards
    assert set(split.tensors) == set(whole.tensors)
    for name, t in whole.tensors.items():
        np.testing.assert_array_equal(np.asarray(split.tensor(name).raw), np.asarray(t.raw), err_msg=name)
    ids = [1, 5, 9, 2, 7]
    a = CPUBackend(whole, build_plan(build_spec(whole)), 16).forward(ids, 0, n_logits=5)
    b = CPUBackend(split, build_plan(build_spec(split)), 16).forward(ids, 0, n_logits=5)
    np.testing.assert_array_equal(a, b)

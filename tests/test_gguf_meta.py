"""infr.gguf_meta reads what gguf's own reader reads: every key, every value, every tensor.

The oracle is `gguf.GGUFReader` with each field decoded as infr decoded it
before the fast reader existed. Real models, a synthetic model, and small
files written by gguf's writer for the edge cases of the bulk string path
(empty strings, long ones, NUL bytes, bytes that are not UTF-8, big-endian).
Bad files give one GGUFError line, never another exception.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from infr import gguf_meta
from infr.errors import GGUFError
from infr.gguf_file import open_gguf
from infr.synth import PRESETS, write_gguf

MODELS = ["smollm2_path", "gemma3_path", "qwen_coder_path"]


class _Reader(GGUFReader):
    """gguf's reader over a plain ndarray view of its memmap (indexing a memmap is ~10x slower)."""

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


def _field_value(field):
    """How infr decoded a gguf ReaderField before infr.gguf_meta."""
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        sub = types[-1] if len(types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if not field.data:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([field.parts[i] for i in field.data])
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", errors="replace")
    value = field.parts[-1][0]
    if types[0] == GGUFValueType.BOOL:
        return bool(value)
    if types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(value)
    return int(value)


def _assert_same(ours, ref, key):
    if isinstance(ref, np.ndarray):
        assert isinstance(ours, np.ndarray), key
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, key
        assert ours.tobytes() == ref.tobytes(), key
    elif isinstance(ref, list):
        assert isinstance(ours, list) and ours == ref, key
    else:
        assert type(ours) is type(ref) and ours == ref, (key, ours, ref)


def _assert_matches_gguf(path: Path) -> gguf_meta.GGUFMeta:
    ours = gguf_meta.read(path)
    reader = _Reader(path)
    ref = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref)
    for key, value in ref.items():
        _assert_same(ours.metadata[key], value, key)
    assert ours.version == int(reader.fields["GGUF.version"].parts[0][0])
    assert ours.data_offset == reader.data_offset and ours.alignment == reader.alignment
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for t, r in zip(ours.tensors, reader.tensors):
        assert (t.qtype, t.offset, t.nbytes) == (r.tensor_type, r.data_offset, r.n_bytes), t.name
        assert t.shape == tuple(reversed(r.shape.tolist())), t.name
    return ours


@pytest.mark.parametrize("fixture", MODELS)
def test_real_model_matches_gguf_reader(fixture, request):
    path = request.getfixturevalue(fixture)
    ours = _assert_matches_gguf(path)
    tokens = ours.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, gguf_meta.StrArray) and tokens.text is not None  # the bulk path ran
    # Tensors through GGUFFile: the same bytes, dtypes and shapes as gguf's views.
    gf, reader = open_gguf(path), _Reader(path)
    for r in reader.tensors:
        raw = gf.tensor(r.name).raw
        want = np.asarray(r.data)
        if want.dtype not in (np.float32, np.float16):
            want = want.view(np.uint8)
        assert raw.dtype == want.dtype and raw.shape == want.shape, r.name
        assert not raw.flags.writeable and np.array_equal(raw.view(np.uint8), want.view(np.uint8)), r.name


def test_numeric_arrays_are_views_of_the_mapping(gemma3_path):
    meta = gguf_meta.read(gemma3_path)
    scores = meta.metadata["tokenizer.ggml.scores"]
    assert scores.dtype == np.float32 and np.shares_memory(scores, meta.buf) and not scores.flags.writeable


def test_synthetic_model_matches_gguf_reader(tmp_path):
    for preset in ("tiny-llama", "tiny-gemma3"):
        _assert_matches_gguf(write_gguf(PRESETS[preset], tmp_path / f"{preset}.gguf"))


def _write(path: Path, kv: dict, endian=GGUFEndian.LITTLE, alignment: int | None = None) -> Path:
    """A small file: the given keys (value, type[, sub type]) and one F32 tensor."""
    w = GGUFWriter(str(path), "llama", endianess=endian)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (value, vtype, *sub) in kv.items():
        w.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


S, A = GGUFValueType.STRING, GGUFValueType.ARRAY
CLEAN = [f"tok{i}" for i in range(200)] + ["é", "日本語", "🙂", " lead", "trail ", "a b", "\n\t"]
STRING_CASES = {
    "clean": CLEAN,
    # empty strings (two together, and first and last), lengths past one byte
    "empty_and_long": ["", *CLEAN[:80], "", "", "x" * 256, "y" * 300, "", "z" * 1000, "w" * 512, ""],
    "nul_inside": [*CLEAN[:100], "a\x00b", "\x00lead", "trail\x00\x00\x00\x00\x00\x00\x00"],
    "not_utf8": [*CLEAN[:100], b"\xff\xfe", b"ok\xc3", b"\xe6\x97", "fine"],
    "past_64k": [*CLEAN[:100], "q" * 70000, "after"],
}


@pytest.mark.parametrize("case", STRING_CASES)
@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["le", "be"])
def test_string_arrays_match_gguf_reader(tmp_path, case, endian):
    values = STRING_CASES[case]
    path = _write(tmp_path / "s.gguf", {"test.strings": (values, A, S), "test.after": ("end", S)}, endian)
    ours = _assert_matches_gguf(path)
    got = ours.metadata["test.strings"]
    assert len(got) == len(values) and ours.metadata["test.after"] == "end"
    if case == "clean" and endian == GGUFEndian.LITTLE:
        assert got.text is not None and got.blob is not None  # decoded in bulk
        assert [got.blob[s : s + n].tobytes().decode() for s, n in zip(got.starts, got.lens)] == values


def test_bulk_and_loop_give_the_same_strings(tmp_path, monkeypatch):
    path = _write(tmp_path / "s.gguf", {"test.strings": (STRING_CASES["empty_and_long"], A, S)})
    bulk = gguf_meta.read(path).metadata["test.strings"]
    monkeypatch.setattr(gguf_meta, "_BULK_MIN", 1 << 60)
    loop = gguf_meta.read(path).metadata["test.strings"]
    assert bulk == loop and loop.text is None


@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["le", "be"])
def test_every_value_type(tmp_path, endian):
    kv = {
        "v.u8": (255, GGUFValueType.UINT8), "v.i8": (-128, GGUFValueType.INT8),
        "v.u16": (65535, GGUFValueType.UINT16), "v.i16": (-32768, GGUFValueType.INT16),
        "v.u32": (4_000_000_000, GGUFValueType.UINT32), "v.i32": (-2_000_000_000, GGUFValueType.INT32),
        "v.u64": (2**64 - 1, GGUFValueType.UINT64), "v.i64": (-(2**63), GGUFValueType.INT64),
        "v.f32": (0.1, GGUFValueType.FLOAT32), "v.f64": (0.1, GGUFValueType.FLOAT64),
        "v.true": (True, GGUFValueType.BOOL), "v.false": (False, GGUFValueType.BOOL),
        "v.str": ("héllo", S), "v.empty": ("", S),
        "a.i32": ([1, -2, 3], A, GGUFValueType.INT32), "a.f32": ([0.5, -1.5], A, GGUFValueType.FLOAT32),
        "a.u64": ([1, 2**64 - 1], A, GGUFValueType.UINT64), "a.bool": ([True, False, True], A, GGUFValueType.BOOL),
        "a.i8": ([-1, 1], A, GGUFValueType.INT8), "a.f64": ([1e300], A, GGUFValueType.FLOAT64),
    }  # fmt: skip
    ours = _assert_matches_gguf(_write(tmp_path / "v.gguf", kv, endian))
    meta = ours.metadata
    assert meta["v.u64"] == 2**64 - 1 and meta["v.i64"] == -(2**63) and meta["v.true"] is True
    assert meta["v.f32"] == float(np.float32(0.1)) and meta["v.f64"] == 0.1
    np.testing.assert_array_equal(meta["a.u64"], np.array([1, 2**64 - 1], np.uint64))
    assert meta["a.bool"].tolist() == [True, False, True]


def test_nested_arrays_are_lists_of_inner_values(tmp_path):
    path = _write(tmp_path / "n.gguf", {"n.ints": ([[1, 2], [3]], A, A), "n.strs": ([["a", "b"], ["c"]], A, A)})
    meta = gguf_meta.read(path).metadata
    assert [a.tolist() for a in meta["n.ints"]] == [[1, 2], [3]]
    assert meta["n.strs"] == [["a", "b"], ["c"]]


def test_custom_alignment(tmp_path):
    ours = _assert_matches_gguf(_write(tmp_path / "a.gguf", {}, alignment=64))
    assert ours.alignment == 64 and ours.data_offset % 64 == 0
    np.testing.assert_array_equal(open_gguf(tmp_path / "a.gguf").tensor("t").raw, np.arange(12).reshape(3, 4))


# --- bad files


def _patched(path: Path, marker: bytes, after: int, fmt: str, value) -> Path:
    """Overwrite the field `after` bytes past the end of `marker` (a key or tensor name)."""
    data = bytearray(path.read_bytes())
    at = data.index(marker) + len(marker) + after
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))
    return path


def _small(tmp_path: Path) -> Path:
    kv = {"test.num": (7, GGUFValueType.UINT32), "test.arr": ([1, 2, 3], A, GGUFValueType.INT32),
          "test.strings": (CLEAN, A, S)}  # fmt: skip
    return _write(tmp_path / "bad.gguf", kv)


def test_every_truncation_is_one_gguf_error(tmp_path):
    path = _small(tmp_path)
    data = path.read_bytes()
    t = gguf_meta.read(path).tensors[-1]
    end = t.offset + t.nbytes  # past it the writer only pads
    cut_file = tmp_path / "cut.gguf"
    cut_file.write_bytes(data[:end])
    assert open_gguf(cut_file).tensor("t").raw.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    cuts = sorted({*range(0, 64), *range(64, end, max(1, end // 300)), end - 1})
    for cut in cuts:
        cut_file.write_bytes(data[:cut])
        with pytest.raises(GGUFError) as e:
            open_gguf(cut_file)
        msg = str(e.value)
        assert msg.startswith("cut.gguf: ") and "\n" not in msg, (cut, msg)
        assert "truncated or corrupt GGUF file" in msg or "not a GGUF file" in msg, (cut, msg)


_TENSOR = b"\x01\x00\x00\x00\x00\x00\x00\x00t\x02\x00\x00\x00"  # tensor "t", 2 dims (then dims, type, offset)


@pytest.mark.parametrize(
    "marker,after,fmt,value,message",
    [
        (b"GGUF", 12, "<Q", 2**62, "counts"),  # kv count
        (b"GGUF", 4, "<Q", 2**62, "counts"),  # tensor count
        (b"test.num", 0, "<I", 99, "unknown value type 99"),
        (b"test.arr", 4, "<I", 77, "unknown element type 77"),
        (b"test.arr", 8, "<Q", 2**61, "past the end"),  # array length
        (b"test.strings", 8, "<Q", 2**61, "past the end"),  # string array length
        (b"test.strings", 12, "<Q", 2**40, "past the end"),  # first string's length
        (_TENSOR, -4, "<I", 100, "has 100 dimensions"),
        (_TENSOR, 16, "<I", 1000, "unknown type 1000"),
        (_TENSOR, 20, "<Q", 2**40, "ends at byte"),
        (b"test.num", 0, "<I", 5000, "unknown value type 5000"),
    ],
)
def test_corrupt_fields_are_one_gguf_error(tmp_path, marker, after, fmt, value, message):
    path = _patched(_small(tmp_path), marker, after, fmt, value)
    with pytest.raises(GGUFError, match=r"^bad.gguf: truncated or corrupt GGUF file \(\d+ bytes: .*" + message):
        open_gguf(path)


def test_duplicate_key_and_bad_alignment(tmp_path):
    path = _write(tmp_path / "d.gguf", {"test.aaa": (1, GGUFValueType.UINT32), "test.bbb": (2, GGUFValueType.UINT32)})
    path.write_bytes(path.read_bytes().replace(b"test.bbb", b"test.aaa"))
    with pytest.raises(GGUFError, match="duplicate metadata key 'test.aaa'"):
        open_gguf(path)
    path = _patched(_write(tmp_path / "a.gguf", {}, alignment=64), b"general.alignment", 4, "<I", 48)
    with pytest.raises(GGUFError, match="general.alignment 48 is not a power of two"):
        open_gguf(path)
    w_path = _write(tmp_path / "b.gguf", {"general.alignment": (64, GGUFValueType.UINT64)})
    with pytest.raises(GGUFError, match="general.alignment is not a uint32"):
        open_gguf(w_path)


def test_unsupported_version(tmp_path):
    path = _patched(_small(tmp_path), b"GGUF", 0, "<I", 1)
    with pytest.raises(GGUFError, match=r"^bad.gguf: GGUF version 1 is not supported"):
        open_gguf(path)


def test_tensor_type_table_is_ggufs():
    # Every type gguf knows has a block size, so every file gguf can read names its types.
    from gguf.constants import GGML_QUANT_SIZES

    assert set(GGML_QUANT_SIZES) <= set(GGMLQuantizationType)

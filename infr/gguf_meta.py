"""A GGUF file's header, metadata and tensor table, read in one pass over its mapped bytes.

Why not `gguf.GGUFReader`: it builds numpy views for every element of every
metadata array (two per string), so a vocabulary becomes hundreds of thousands
of Python objects before anything else happens. Opening a model through it took
1.2 s for SmolLM2-135M (49k tokens, 49k merges), 3.5 s for Qwen2.5-Coder-0.5B
(152k tokens, 151k merges) and 4.4 s for Gemma-3-270m (262k tokens with scores
and types), measured on the 2-core development machine. Here it takes about
10, 30 and 40 ms (perf/cold_start.py times the whole process).

What it returns matches gguf's reader as infr decoded it before (tests compare
every key and value): scalars as Python values, strings decoded as UTF-8 with
errors replaced, numeric arrays as read-only numpy views of the mapping, string
arrays as a `StrArray` (a list of str). String arrays are decoded in bulk: the
length prefixes are found with numpy and checked as a chain (each prefix must
point at the next), the strings decoded as one text and split. A file where
that does not work out (a string holding NUL bytes, a length past 65535, a
big-endian file) takes the plain loop, which gives the same values. Arrays of
arrays come back as lists of their inner values (gguf's reader flattens them;
no model infr reads has one). `gguf` stays the library for the rest: its
constants name the types, its writer and dequantizers serve everywhere else.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

from infr.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 64  # GGML has 4; more than this is a corrupt count, not a tensor

# value type -> (struct code, numpy dtype code) for the fixed-size scalars
_SCALARS: dict[int, tuple[str, str]] = {
    GGUFValueType.UINT8: ("B", "u1"), GGUFValueType.INT8: ("b", "i1"),
    GGUFValueType.UINT16: ("H", "u2"), GGUFValueType.INT16: ("h", "i2"),
    GGUFValueType.UINT32: ("I", "u4"), GGUFValueType.INT32: ("i", "i4"),
    GGUFValueType.FLOAT32: ("f", "f4"), GGUFValueType.BOOL: ("B", "b1"),
    GGUFValueType.UINT64: ("Q", "u8"), GGUFValueType.INT64: ("q", "i8"),
    GGUFValueType.FLOAT64: ("d", "f8"),
}  # fmt: skip
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
_STRING, _ARRAY, _BOOL = int(GGUFValueType.STRING), int(GGUFValueType.ARRAY), int(GGUFValueType.BOOL)
_BULK_MIN = 64  # shorter string arrays are cheaper in the loop
_SEP = "\x00" * 8  # a zeroed length prefix, between strings of the bulk text


class StrArray(list):
    """A GGUF string array: a list of str, plus the bulk form when it was decoded in bulk.

    `text` is every string in order, each after 8 NUL characters (its zeroed
    length prefix), and no string holds a NUL; `blob` is that text's UTF-8
    bytes, `starts`/`lens` each string's byte range in it. Users that can work
    on all strings at once (the tokenizer's merges) read these; they are None
    when the strings were decoded one by one.
    """

    text: str | None = None
    blob: np.ndarray | None = None
    starts: np.ndarray | None = None
    lens: np.ndarray | None = None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: slowest dimension first
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


@dataclass
class GGUFMeta:
    version: int
    byte_order: str  # "<" or ">"
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    alignment: int
    data_offset: int
    buf: np.ndarray  # uint8, read-only: the whole file, memory-mapped

    def tensor_data(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes as a view: F32/F16 as their dtype, every other type as uint8 rows."""
        raw = self.buf[t.offset : t.offset + t.nbytes]
        if t.qtype == GGMLQuantizationType.F32:
            return raw.view(self.byte_order + "f4").reshape(t.shape)
        if t.qtype == GGMLQuantizationType.F16:
            return raw.view(self.byte_order + "f2").reshape(t.shape)
        block, size = GGML_QUANT_SIZES[t.qtype]
        return raw.reshape(*t.shape[:-1], t.shape[-1] // block * size)


class _Corrupt(Exception):
    """Parse failure; `read` turns it into one GGUFError line."""


def read(path: Path) -> GGUFMeta:
    """Header, metadata and tensor table of one GGUF file (not a split set)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            if size < 24:
                raise _Corrupt(f"the header needs 24 bytes, the file has {size}")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return _Parser(mm, size).parse()
    except _Corrupt as e:
        raise GGUFError(f"{path.name}: truncated or corrupt GGUF file ({size} bytes: {e})") from None
    except _Unsupported as e:
        raise GGUFError(f"{path.name}: {e}") from None


class _Unsupported(Exception):
    pass


class _Parser:
    def __init__(self, mm: mmap.mmap, size: int):
        self.mm = mm
        self.buf = np.frombuffer(mm, dtype=np.uint8)
        self.size = size
        self.e = "<"
        self.vtypes: dict[str, int] = {}  # each key's value type

    # --- primitives

    def _unpack(self, fmt: str, off: int) -> tuple:
        try:
            return struct.unpack_from(self.e + fmt, self.mm, off)
        except struct.error:
            raise _Corrupt(f"a {struct.calcsize(fmt)}-byte field at byte {off} runs past the end") from None

    def _need(self, off: int, n: int, what: str) -> None:
        if n < 0 or off + n > self.size:
            raise _Corrupt(f"{what} at byte {off} needs {n} bytes, past the end")

    def _str(self, off: int, what: str = "a string") -> tuple[str, int]:
        (n,) = self._unpack("Q", off)
        self._need(off + 8, n, what)
        return self.mm[off + 8 : off + 8 + n].decode("utf-8", errors="replace"), off + 8 + n

    # --- file layout

    def parse(self) -> GGUFMeta:
        if self.mm[:4] != GGUF_MAGIC:
            raise _Corrupt(f"starts with {self.mm[:4]!r}, expected {GGUF_MAGIC!r}")
        (version,) = struct.unpack_from("<I", self.mm, 4)
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.e = ">"
            (version,) = struct.unpack_from(">I", self.mm, 4)
        if version not in SUPPORTED_VERSIONS:
            raise _Unsupported(f"GGUF version {version} is not supported (infr reads versions 2 and 3)")
        n_tensors, n_kv = self._unpack("QQ", 8)
        off = 24
        if n_kv > self.size or n_tensors > self.size:
            raise _Corrupt(f"the header counts {n_kv} keys and {n_tensors} tensors")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, off = self._str(off, "a key")
            (vtype,) = self._unpack("I", off)
            if key in metadata:
                raise _Corrupt(f"duplicate metadata key {key!r}")
            self.vtypes[key] = vtype
            metadata[key], off = self._value(vtype, off + 4, key)
        infos, off = self._tensor_infos(off, n_tensors)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in metadata and self.vtypes["general.alignment"] != GGUFValueType.UINT32:
            raise _Corrupt("general.alignment is not a uint32")
        if alignment <= 0 or alignment & (alignment - 1):
            raise _Corrupt(f"general.alignment {alignment} is not a power of two")
        data_offset = off + (-off % alignment)
        tensors = [self._tensor(data_offset, *info) for info in infos]
        return GGUFMeta(version, self.e, metadata, tensors, alignment, data_offset, self.buf)

    def _value(self, vtype: int, off: int, key: str) -> tuple[Any, int]:
        if vtype == _STRING:
            return self._str(off)
        scalar = _SCALARS.get(vtype)
        if scalar is not None:
            (v,) = self._unpack(scalar[0], off)
            off += struct.calcsize(scalar[0])
            if vtype == _BOOL:
                return v != 0, off
            return (float(v) if vtype in _FLOATS else int(v)), off
        if vtype == _ARRAY:
            return self._array(off, key)
        raise _Corrupt(f"metadata key {key!r} has unknown value type {vtype}")

    def _array(self, off: int, key: str) -> tuple[Any, int]:
        itype, count = self._unpack("IQ", off)
        off += 12
        if itype == _STRING:
            self._need(off, 8 * count, f"array {key!r}")
            return self._strings(off, count)
        scalar = _SCALARS.get(itype)
        if scalar is not None:
            width = int(scalar[1][1:])
            self._need(off, width * count, f"array {key!r}")
            if count == 0:
                return np.zeros(0, dtype=np.float32), off
            dtype = np.dtype("?" if itype == _BOOL else self.e + scalar[1])
            value = self.buf[off : off + width * count].view(dtype)
            if not dtype.isnative:  # a big-endian file: native values, as gguf's reader gives
                value = value.astype(dtype.newbyteorder("="))
            return value, off + width * count
        if itype == _ARRAY:
            self._need(off, 12 * count, f"array {key!r}")
            out = []
            for _ in range(count):
                value, off = self._array(off, key)
                out.append(value)
            return out, off
        raise _Corrupt(f"array {key!r} has unknown element type {itype}")

    def _tensor_infos(self, off: int, count: int) -> tuple[list[tuple], int]:
        infos = []
        names: set[str] = set()
        for _ in range(count):
            name, off = self._str(off, "a tensor name")
            (n_dims,) = self._unpack("I", off)
            if n_dims > _MAX_DIMS:
                raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
            dims = self._unpack("Q" * n_dims, off + 4)
            qtype, rel = self._unpack("IQ", off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            if name in names:
                raise _Corrupt(f"duplicate tensor {name!r}")
            names.add(name)
            infos.append((name, dims, qtype, rel))
        return infos, off

    def _tensor(self, data_offset: int, name: str, dims: tuple[int, ...], qtype: int, rel: int) -> TensorInfo:
        try:
            q = GGMLQuantizationType(qtype)
            block, size = GGML_QUANT_SIZES[q]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor {name!r} has unknown type {qtype}") from None
        shape = tuple(reversed(dims))  # GGUF lists dims fastest-first
        if q not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) and (not shape or shape[-1] % block):
            raise _Corrupt(f"tensor {name!r}: row of {shape[-1] if shape else 0} values is not whole {q.name} blocks")
        n = 1
        for d in dims:
            n *= d
        nbytes = n * size // block
        start = data_offset + rel
        if start + nbytes > self.size:
            raise _Corrupt(f"tensor {name!r} ends at byte {start + nbytes}")
        return TensorInfo(name, q, shape, start, nbytes)

    # --- string arrays

    def _strings(self, off: int, count: int) -> tuple[StrArray, int]:
        if count >= _BULK_MIN and self.e == "<":
            got = self._strings_bulk(off, count)
            if got is not None:
                return got
        return self._strings_loop(off, count)

    def _strings_loop(self, off: int, count: int) -> tuple[StrArray, int]:
        out = StrArray()
        unpack, mm, size = struct.Struct(self.e + "Q").unpack_from, self.mm, self.size
        for _ in range(count):
            if off + 8 > size:
                raise _Corrupt(f"a string at byte {off} runs past the end")
            (n,) = unpack(mm, off)
            end = off + 8 + n
            if end > size:
                raise _Corrupt(f"a string at byte {off} needs {n} bytes, past the end")
            out.append(mm[off + 8 : end].decode("utf-8", errors="replace"))
            off = end
        return out, off

    def _strings_bulk(self, off: int, count: int) -> tuple[StrArray, int] | None:
        """All strings at once, or None where the layout defeats the shortcut.

        A length below 65536 is two bytes and six zeros, and a string rarely
        starts with a NUL, so each prefix is the last 8 bytes of a run of >= 6
        zeros. Those are candidates; they are the prefixes exactly when each
        one's length leads to the next, checked for all of them.
        """
        window = 24 * count + 4096
        while True:
            stop = min(self.size, off + window)
            r = self.buf[off:stop]
            z = r == 0
            c = np.flatnonzero(z[:-1] & ~z[1:]) - 7  # each zero run ending before a nonzero byte
            c = c[c >= 0]
            c = c[z[c + 2] & z[c + 3] & z[c + 4] & z[c + 5] & z[c + 6]]
            m = min(len(c), count)
            if m == 0 or c[0] != 0:
                return None
            c = c[:m]
            lens = r[c].astype(np.int64) | (r[c + 1].astype(np.int64) << 8)
            nxt = c + 8 + lens
            if not np.array_equal(nxt[:-1], c[1:]):
                return None  # a candidate that is no prefix, or a prefix missed
            if m == count and nxt[-1] <= len(r):
                break
            if stop == self.size:
                return None  # the loop says where the array runs out
            window *= 2
        end = int(nxt[-1])
        blob = r[:end].copy()
        blob[c] = 0
        blob[c + 1] = 0
        if np.count_nonzero(blob == 0) != 8 * count:
            return None  # some string holds a NUL: the separators would be ambiguous
        raw = blob.tobytes()
        try:
            text = raw.decode("utf-8")
            pieces = text.split(_SEP)
        except UnicodeDecodeError:  # a string is not UTF-8: decode it alone, errors replaced
            text = None
            pieces = [
                p.encode("utf-8", "surrogateescape").decode("utf-8", errors="replace") if _has_escape(p) else p
                for p in raw.decode("utf-8", "surrogateescape").split(_SEP)
            ]
        if len(pieces) != count + 1 or pieces[0]:
            return None
        out = StrArray(pieces[1:])
        if text is not None:
            out.text, out.blob, out.starts, out.lens = text, blob, c + 8, lens
        return out, off + end


_ESCAPED = re.compile("[\udc80-\udcff]")  # surrogateescape's stand-ins for bytes that are not UTF-8


def _has_escape(s: str) -> bool:
    return _ESCAPED.search(s) is not None

"""GGUF access through the `gguf` package: memory-mapped, split files merged.

A `GGUFFile` holds decoded metadata and a name -> `Tensor` table whose
`.raw` is a read-only memmap view of the tensor's bytes in its GGUF block
layout. Nothing is read into memory until a caller touches `.raw`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES

from infr.errors import GGUFError

GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix, cols contiguous
    raw: np.ndarray  # uint8 (quantized) or the element dtype, GGUF byte layout

    @property
    def type_name(self) -> str:
        return self.qtype.name

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


class GGUFFile:
    """One model: metadata from the first shard, tensors from every shard."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.paths = split_paths(self.path)
        self._readers = [_open_reader(p) for p in self.paths]
        self.metadata: dict[str, Any] = _decode_fields(self._readers[0])
        self.tensors: dict[str, Tensor] = {}
        for path_, reader in zip(self.paths, self._readers):
            for t in reader.tensors:
                self.tensors[t.name] = _make_tensor(path_, reader, t)
        declared = self.metadata.get("split.tensors.count")
        if declared is not None and declared != len(self.tensors):
            raise GGUFError(
                f"{self.path.name}: split model declares {declared} tensors but its "
                f"{len(self.paths)} files hold {len(self.tensors)}"
            )

    @property
    def arch(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path.name}: no general.architecture in metadata")
        return arch

    @property
    def file_size(self) -> int:
        return sum(p.stat().st_size for p in self.paths)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """Read `{arch}.{suffix}`, e.g. arch_key('block_count')."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path.name}: missing metadata key {key!r}")
        return self.metadata[key]

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path.name}: missing tensor {name!r}") from None

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def param_count(self) -> int:
        return sum(int(np.prod(t.shape)) for t in self.tensors.values())


def split_paths(path: Path) -> list[Path]:
    """All shards of a split model given any shard, in order; else [path]."""
    m = _SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    paths = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise GGUFError(f"{path.name}: split model is missing {', '.join(missing)}")
    return paths


class _Reader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memmap.

    Indexing an np.memmap costs ~10x an ndarray's (subclass finalisation);
    the reader indexes once per metadata element, so a 262k-token vocabulary
    took 16 s. The view still maps the file: nothing is read eagerly.
    """

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


def _open_reader(path: Path) -> GGUFReader:
    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path.name}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        reader = _Reader(path, "r")
    except (ValueError, IndexError, OverflowError, MemoryError, UnicodeDecodeError) as e:
        size = path.stat().st_size
        raise GGUFError(f"{path.name}: truncated or corrupt GGUF file ({size} bytes: {e})") from None
    _check_complete(path, reader)
    return reader


def _check_complete(path: Path, reader: GGUFReader) -> None:
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise GGUFError(
                f"{path.name}: truncated file: tensor {t.name!r} ends at byte {end} "
                f"but the file has {size} bytes"
            )


def _make_tensor(path: Path, reader: GGUFReader, t: Any) -> Tensor:
    qtype = GGMLQuantizationType(int(t.tensor_type))
    # GGUF lists dims fastest-first; numpy wants slowest-first.
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    raw = t.data
    if qtype in GGML_QUANT_SIZES and raw.dtype != np.uint8 and qtype not in _PLAIN:
        raw = raw.view(np.uint8)
    return Tensor(name=t.name, qtype=qtype, shape=shape, raw=raw)


_PLAIN = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}


def _decode_fields(reader: GGUFReader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = _field_value(field)
    return out


def _field_value(field: Any) -> Any:
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[-1] if len(types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if sub == GGUFValueType.ARRAY:
            return field.contents()
        if not field.data:
            return np.zeros(0, dtype=np.float32)
        # Numeric arrays: one contiguous numpy array (scores, token types).
        return np.concatenate([field.parts[i] for i in field.data])
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", errors="replace")
    value = field.parts[-1][0]
    if types[0] == GGUFValueType.BOOL:
        return bool(value)
    if types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(value)
    return int(value)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile(path)

"""GGUF access: memory-mapped, split files merged.

A `GGUFFile` holds decoded metadata and a name -> `Tensor` table whose
`.raw` is a read-only view of the mapped tensor bytes in its GGUF block
layout. Nothing is read into memory until a caller touches `.raw`. The
header, metadata and tensor table come from `infr.gguf_meta` (one pass, no
object per vocabulary entry: it says why and what it saves); the types are
`gguf`'s.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from infr import gguf_meta
from infr.errors import GGUFError
from infr.gguf_meta import GGUF_MAGIC, GGUFMeta

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
        self._metas = [_read(p) for p in self.paths]
        self.metadata: dict[str, Any] = self._metas[0].metadata
        self.tensors: dict[str, Tensor] = {}
        for meta in self._metas:
            for t in meta.tensors:
                self.tensors[t.name] = Tensor(t.name, t.qtype, t.shape, meta.tensor_data(t))
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


def _read(path: Path) -> GGUFMeta:
    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path.name}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    return gguf_meta.read(path)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    return GGUFFile(path)

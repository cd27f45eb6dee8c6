"""On-disk cache of a SentencePiece vocabulary's derived merges, keyed by the GGUF file.

Deriving the merge list from the scores (infr.tokenizer_merges._merges_from_scores) is
the one costly step of building a large SentencePiece tokenizer: 2-3 s for
Gemma 3's 262k tokens on the 2-core development machine with its cores shared,
where reading the cached pairs back takes 2 ms and making them the merge list
0.45 s. The cache holds the merges as token-id pairs, 8 bytes a merge (4 MB
for Gemma 3).

The key is the file's resolved path, size, mtime and inode plus `VERSION`
(raise it when the derivation changes); a file that changed gets a new key.
A cache file is trusted only whole: magic, counts, size, CRC-32 of the pairs
and every id in range. Anything else, or any I/O error, means "not cached":
the merges are derived again and the file rewritten (atomically), never an
error. Small vocabularies are not cached: deriving theirs is cheap.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from infr import offline

log = logging.getLogger(__name__)

VERSION = 1
MIN_TOKENS = 32768  # below this the derivation takes milliseconds
_MAGIC = b"INFRSPM1"
_HEADER = struct.Struct("<8sQQI")  # magic, n_tokens, n_merges, crc32 of the pairs


def cache_dir() -> Path:
    return offline.cache_dir().parent / "tokenizer"


def cache_file(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = f"{VERSION}|{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    return cache_dir() / f"spm-merges-{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"


def load(gguf_path: Path, n_tokens: int) -> np.ndarray | None:
    """The cached (n, 2) int32 id pairs for this file, or None if there is no sound cache."""
    try:
        path = cache_file(gguf_path)
        with open(path, "rb") as f:
            head = f.read(_HEADER.size)
            if len(head) != _HEADER.size:
                return None
            magic, n_tok, n_merges, crc = _HEADER.unpack(head)
            if magic != _MAGIC or n_tok != n_tokens or path.stat().st_size != _HEADER.size + 8 * n_merges:
                return _stale(path, "header")
            pairs = np.fromfile(f, dtype="<i4", count=2 * n_merges)
    except (OSError, ValueError, struct.error):
        return None
    if len(pairs) != 2 * n_merges or zlib.crc32(pairs.tobytes()) != crc:
        return _stale(path, "checksum")
    if n_merges and (pairs.min() < 0 or pairs.max() >= n_tokens):
        return _stale(path, "ids")
    return pairs.reshape(-1, 2).astype(np.int32, copy=False)


def save(gguf_path: Path, n_tokens: int, pairs: np.ndarray) -> None:
    """Write the cache for this file; a failure is logged and otherwise ignored."""
    data = np.ascontiguousarray(pairs, dtype="<i4").tobytes()
    try:
        path = cache_file(gguf_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, n_tokens, len(data) // 8, zlib.crc32(data)))
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("tokenizer cache not written: %s", e)


def _stale(path: Path, why: str) -> None:
    log.debug("tokenizer cache %s is unsound (%s); deriving the merges again", path.name, why)
    return None

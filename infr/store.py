"""Resolve what a user typed as MODEL into a GGUF path.

A `.gguf` path, an offline model name (infr.offline), or a Hugging Face ref
`[hf:]org/repo[:QUANT]` / `org/repo/path/file.gguf` found in the standard
Hugging Face cache (the one llama.cpp and huggingface_hub share).
"""

from __future__ import annotations

import re
from pathlib import Path

from infr import offline
from infr.errors import InfrError

DEFAULT_QUANT = "Q4_K_M"
SIDE_FILES = re.compile(r"(mmproj|imatrix|mtp)", re.IGNORECASE)


def resolve(ref: str | None) -> Path:
    if not ref:
        return offline.ensure(offline.DEFAULT_MODEL)
    path = Path(ref).expanduser()
    if path.exists():
        return path
    if offline.lookup(ref):
        return offline.ensure(ref)
    if ref.endswith(".gguf") and "/" not in ref.removeprefix("hf:"):
        raise InfrError(f"no such file: {ref}")
    repo_ref = ref.removeprefix("hf:")
    if re.fullmatch(r"[\w.-]+/[\w.-]+(/.+\.gguf|:[\w.-]+)?", repo_ref):
        return _from_hf_cache(repo_ref)
    known = ", ".join(offline.MODELS)
    raise InfrError(f"no such model {ref!r}: not a file, not an offline model ({known}), not org/repo[:quant]")


def quant_matches(filename: str, quant: str) -> bool:
    """QUANT matches on token boundaries, case-insensitively: Q4_K_M in x-Q4_K_M.gguf; Q2_0 not in
    PQ2_0, Q4_K not in Q4_K_M."""
    stem = filename.rsplit("/", 1)[-1]
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", stem, re.IGNORECASE) is not None


def _from_hf_cache(ref: str) -> Path:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    parts = ref.split("/", 2)
    repo_id = "/".join(parts[:2])
    file_in_repo = parts[2] if len(parts) == 3 else None
    quant = DEFAULT_QUANT
    if ":" in repo_id:
        repo_id, quant = repo_id.split(":", 1)
    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        cache = None
    files: list[Path] = []
    for repo in cache.repos if cache else ():
        if repo.repo_id.lower() == repo_id.lower() and repo.repo_type == "model":
            for rev in repo.revisions:
                files += [f.file_path for f in rev.files if f.file_name.endswith(".gguf")]
    if not files:
        raise InfrError(
            f"{repo_id} is not in the Hugging Face cache; download it first (e.g. with huggingface-cli)"
        )
    if file_in_repo:
        chosen = [f for f in files if f.as_posix().endswith(file_in_repo)]
    else:
        chosen = [f for f in files if quant_matches(f.name, quant) and not SIDE_FILES.search(f.name)]
    if not chosen:
        have = sorted({f.name for f in files})
        raise InfrError(f"{repo_id}: no cached file matches {file_in_repo or quant}; cached: {', '.join(have)}")
    return sorted(chosen)[0]

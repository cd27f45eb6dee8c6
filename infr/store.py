"""Resolve what a user typed as MODEL into a GGUF path.

A `.gguf` path, an offline model name (infr.offline), or a Hugging Face ref as
llama.cpp's `-hf` reads it: `[hf:]org/repo[:QUANT]` or `[hf:]org/repo/path/file.gguf`.
Hugging Face refs are looked up in the standard Hugging Face cache (the one
huggingface_hub and llama.cpp share) and in llama.cpp's older flat cache
(read-only); one that is in neither is pulled from the Hub (infr.hub).

Which file `org/repo[:QUANT]` means: QUANT matches a file's path in the repo
case-insensitively on token boundaries (`Q4_K_M` matches `m-Q4_K_M.gguf` and
`Q4_K_M/m-00001-of-00002.gguf`, `Q2_0` does not match `PQ2_0`, `Q4_K` does not
match `Q4_K_M`). Without QUANT, like llama.cpp, `Q4_K_M`; when the repo has no
Q4_K_M file, the first of QUANT_FALLBACK it has, else the first GGUF by name.
Side files (`mmproj`, `imatrix`, `mtp`) are never chosen. A split model is chosen
by its `-00001-of-N` shard and means every shard.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from infr import offline
from infr.errors import InfrError

DEFAULT_QUANT = "Q4_K_M"
# Near Q4_K_M in size first (4-bit, then 5-bit), then bigger, then smaller, then unquantized.
QUANT_FALLBACK = (
    "Q4_K_M", "Q4_K_S", "Q4_0", "IQ4_NL", "IQ4_XS", "Q4_1", "Q5_K_M", "Q5_K_S", "Q5_0", "Q5_1", "Q6_K", "Q8_0",
    "Q3_K_M", "Q3_K_L", "Q3_K_S", "IQ3_M", "IQ3_XS", "Q2_K", "BF16", "F16", "F32",
)
SIDE_FILES = re.compile(r"(?<![a-z0-9])(mmproj|imatrix|mtp)(?![a-z0-9])", re.IGNORECASE)
SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])((?:I|T)?Q\d+(?:_[A-Za-z0-9]{1,3})*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])", re.IGNORECASE
)
_REPO_REF = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+)|/(?P<file>.+\.gguf))?", re.IGNORECASE)


@dataclass(frozen=True)
class Ref:
    """A Hugging Face model ref: a repo, and at most one of a quant or a file in it."""

    repo: str
    quant: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else "") + (f"/{self.file}" if self.file else "")


def parse_ref(text: str) -> Ref | None:
    m = _REPO_REF.fullmatch(text.removeprefix("hf:"))
    return Ref(m["repo"], m["quant"], m["file"]) if m else None


def quant_matches(filename: str, quant: str) -> bool:
    """QUANT matches on token boundaries, case-insensitively: Q4_K_M in x-Q4_K_M.gguf; Q2_0 not in
    PQ2_0, Q4_K not in Q4_K_M."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", filename, re.IGNORECASE) is not None


def quant_of(path: str) -> str | None:
    """The quant a file name states (`m-Q4_K_M-00001-of-00002.gguf` -> Q4_K_M), if any."""
    found = QUANT_TOKEN.findall(path)
    return found[-1].upper() if found else None


def is_side_file(path: str) -> bool:
    return SIDE_FILES.search(path.rsplit("/", 1)[-1]) is not None


def choose(paths: list[str], ref: Ref, fallback: bool = True) -> list[str] | None:
    """The files `ref` means among a repo's `paths`: the one to open first, then its other shards.
    None when nothing matches; `fallback=False` takes no quant but the one asked (or Q4_K_M)."""
    ggufs = [p for p in paths if p.lower().endswith(".gguf")]
    if ref.file:
        main = ref.file if ref.file in ggufs else None
    else:
        models = [p for p in ggufs if not is_side_file(p) and _shard_no(p) in (None, 1)]
        quants = [ref.quant] if ref.quant else (QUANT_FALLBACK if fallback else [DEFAULT_QUANT])
        main = None
        for q in quants:
            hits = sorted((p for p in models if quant_matches(p, q)), key=lambda p: (p.count("/"), len(p), p))
            if hits:
                main = hits[0]
                break
        if main is None and fallback and not ref.quant and models:
            main = sorted(models)[0]
    if main is None:
        return None
    m = SHARD.search(main)
    if not m:
        return [main]
    count = int(m[2])
    shards = [main[: m.start()] + f"-{i:05d}-of-{m[2]}" + main[m.end() - 5:] for i in range(1, count + 1)]
    missing = [s for s in shards if s not in ggufs]
    if missing:
        raise InfrError(f"{ref.repo}: split model {main} has {count} shards but {', '.join(missing)} is missing")
    return [main] + [s for s in shards if s != main]


def _shard_no(path: str) -> int | None:
    m = SHARD.search(path)
    return int(m[1]) if m else None


def quants_listing(paths: list[str]) -> str:
    """What a repo offers, for error messages: its quants, else its GGUF names."""
    models = [p for p in paths if p.lower().endswith(".gguf") and not is_side_file(p) and _shard_no(p) in (None, 1)]
    quants = sorted({q for p in models if (q := quant_of(p))})
    return ", ".join(quants or sorted(models)) or "no GGUF model files"


# --- caches -------------------------------------------------------------------------------------


def hf_cache_dir() -> Path:
    """huggingface_hub's cache, read from the environment now (its constants are fixed at import)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def llama_cache_dir() -> Path:
    """llama.cpp's older flat cache: `{org}_{repo}_{file}` per model file."""
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def scan_hf_cache():
    """huggingface_hub's view of the cache (None when there is none yet)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(hf_cache_dir())
    except CacheNotFound:
        return None


def hf_cached_files(repo_id: str) -> dict[str, Path]:
    """Relative path in repo -> snapshot path, for every cached revision of `repo_id`; the revision
    `main` points to wins, then the newest."""
    cache = scan_hf_cache()
    files: dict[str, Path] = {}
    for repo in cache.repos if cache else ():
        if repo.repo_type != "model" or repo.repo_id.lower() != repo_id.lower():
            continue
        revs = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        for rev in revs:  # later ones overwrite: main last
            for f in rev.files:
                files[f.file_path.relative_to(rev.snapshot_path).as_posix()] = f.file_path
    return files


def llama_cached_files(repo_id: str) -> dict[str, Path]:
    """Files of `repo_id` in llama.cpp's flat cache, by their name in the repo (subfolders flattened)."""
    root = llama_cache_dir()
    prefix = repo_id.replace("/", "_").lower() + "_"
    if not root.is_dir():
        return {}
    return {p.name[len(prefix):]: p for p in root.glob("*.gguf") if p.name.lower().startswith(prefix)}


def find_cached(ref: Ref, fallback: bool = False) -> Path | None:
    """The file `ref` means, from the Hugging Face cache or else llama.cpp's; every shard must be there."""
    for files in (hf_cached_files(ref.repo), llama_cached_files(ref.repo)):
        chosen = choose(list(files), ref, fallback=fallback) if files else None
        if chosen:
            return files[chosen[0]]
    return None


# --- resolution ---------------------------------------------------------------------------------


def resolve(ref: str | None, pull: bool = True) -> Path:
    """MODEL -> a GGUF path. A Hugging Face ref in no cache is downloaded when `pull` (and the Hub
    is not switched off by HF_HUB_OFFLINE=1); without network the cache serves what it can."""
    if not ref:
        return offline.ensure(offline.DEFAULT_MODEL)
    path = Path(ref).expanduser()
    if path.exists():
        return path
    if offline.lookup(ref):
        return offline.ensure(ref)
    if ref.endswith(".gguf") and "/" not in ref.removeprefix("hf:"):
        raise InfrError(f"no such file: {ref}")
    hf = parse_ref(ref)
    if hf is None:
        known = ", ".join(offline.MODELS)
        raise InfrError(f"no such model {ref!r}: not a file, not an offline model ({known}), not org/repo[:quant]")
    found = find_cached(hf)
    if found:
        return found
    if pull and not hub_offline():
        from infr import hub

        try:
            return hub.pull(hf)
        except hub.NetworkError:
            if found := find_cached(hf, fallback=True):
                return found  # llama.cpp too falls back to the cache when the Hub is unreachable
            raise
    if found := find_cached(hf, fallback=True):
        return found
    return _not_cached(hf)


def resolve_or_pull(ref: str | None) -> Path:
    """For callers such as `infr serve`: the GGUF for MODEL, downloaded on first use."""
    return resolve(ref, pull=True)


def _not_cached(ref: Ref):
    cached = {**llama_cached_files(ref.repo), **hf_cached_files(ref.repo)}
    why = " (HF_HUB_OFFLINE=1 is set: unset it to download)" if hub_offline() else ""
    if not cached:
        raise InfrError(f"{ref.repo} is not in the Hugging Face cache{why}; get it with `infr pull {ref}`")
    have = ", ".join(sorted(Path(p).name for p in cached))
    raise InfrError(f"{ref.repo}: no cached file matches {ref.file or ref.quant or DEFAULT_QUANT}; cached: {have}{why}")

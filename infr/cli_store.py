"""`infr pull`, `infr ls`, `infr rm`: the model store on the command line.

`ls` shows the Hugging Face cache, llama.cpp's flat cache and infr's offline
models; `rm` deletes from the Hugging Face cache and infr's offline cache only:
llama.cpp's cache belongs to llama.cpp, and infr only reads it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from infr import offline, store
from infr.errors import InfrError


def add_parsers(sub) -> None:
    p = sub.add_parser("pull", help="download a model: org/repo[:QUANT], org/repo/file.gguf or an offline name")
    p.add_argument("model", help="what to download")
    sub.add_parser("ls", help="list cached models (Hugging Face cache, llama.cpp cache, offline models)")
    p = sub.add_parser("rm", help="delete a cached model (org/repo removes every file of the repo)")
    p.add_argument("model", help="what to delete")


def cmd_pull(args: argparse.Namespace) -> int:
    ref = args.model
    if offline.lookup(ref):
        print(offline.ensure(ref))
        return 0
    if Path(ref).expanduser().exists():
        raise InfrError(f"{ref} is a local file: nothing to pull, run it as it is")
    hf = store.parse_ref(ref)
    if hf is None:
        raise InfrError(f"cannot pull {ref!r}: not org/repo[:QUANT], org/repo/file.gguf or an offline model "
                        f"({', '.join(offline.MODELS)})")
    if store.hub_offline():
        found = store.find_cached(hf)
        if found is None:
            raise InfrError(f"HF_HUB_OFFLINE=1 is set and {hf} is not in the cache; unset it to download")
        print(found)
        return 0
    from infr import hub

    print(hub.pull(hf))
    return 0


@dataclass
class Entry:
    repo: str
    file: str
    path: Path  # the file to open (first shard)
    size: int  # every shard together
    where: str  # hf, llama.cpp, offline


def cached_models() -> list[Entry]:
    """Every GGUF model in the three caches; a split model is one entry."""
    out: list[Entry] = []
    cache = store.scan_hf_cache()
    for repo in sorted(cache.repos if cache else (), key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        seen: dict[str, Path] = {}
        for rev in repo.revisions:
            for f in rev.files:
                seen.setdefault(f.file_path.relative_to(rev.snapshot_path).as_posix(), f.file_path)
        out += _entries(repo.repo_id, seen, "hf")
    root = store.llama_cache_dir()
    if root.is_dir():
        flat = {p.name: p for p in root.glob("*.gguf")}
        for e in _entries("", flat, "llama.cpp"):
            e.repo, _, e.file = _split_flat(e.file, root)
            out.append(e)
    for m in offline.MODELS.values():
        path = offline.cached_path(m)
        if path.exists():
            out.append(Entry(f"offline:{m.name}", m.filename, path, path.stat().st_size, "offline"))
    return out


def _entries(repo: str, files: dict[str, Path], where: str) -> list[Entry]:
    out = []
    for name in sorted(files):
        if not name.lower().endswith(".gguf") or store._shard_no(name) not in (None, 1):
            continue
        try:
            shards = store.choose(list(files), store.Ref(repo or "?", file=name)) or [name]
        except InfrError:  # an incomplete split model: list what is there
            shards = [name]
        size = sum(files[s].stat().st_size for s in shards if files[s].exists())
        out.append(Entry(repo, name, files[name], size, where))
    return out


def _split_flat(name: str, root: Path) -> tuple[str, str, str]:
    """`org_repo_file.gguf` -> (org/repo, _, file); llama.cpp's manifest files name the repo exactly."""
    for manifest in root.glob("manifest=*=*=*.json"):
        org, repo = manifest.name.split("=")[1:3]
        prefix = f"{org}_{repo}_"
        if name.startswith(prefix):
            return f"{org}/{repo}", "", name[len(prefix):]
    parts = name.split("_", 2)
    return (f"{parts[0]}/{parts[1]}", "", parts[2]) if len(parts) == 3 else ("?", "", name)


def _header(path: Path) -> tuple[str, str]:
    """Architecture and parameter count from the GGUF header ('?' when unreadable)."""
    from infr.gguf_file import open_gguf

    try:
        gf = open_gguf(path)
        n = gf.param_count()
        return str(gf.get("general.architecture", "?")), (f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M")
    except (InfrError, OSError, ValueError):
        return "?", "?"


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def cmd_ls(args: argparse.Namespace) -> int:
    rows = [("REPO", "FILE", "QUANT", "ARCH", "PARAMS", "SIZE", "CACHE")]
    for e in cached_models():
        arch, params = _header(e.path)
        rows.append((e.repo, e.file, store.quant_of(e.file) or "-", arch, params, _mb(e.size), e.where))
    if len(rows) == 1:
        print(f"infr: no models cached (Hugging Face cache {store.hf_cache_dir()}, llama.cpp cache "
              f"{store.llama_cache_dir()}); get one with `infr pull org/repo[:QUANT]`", file=sys.stderr)
        return 0
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    ref = args.model
    model = offline.lookup(ref)
    if model is not None:
        path = offline.cached_path(model)
        if not path.exists():
            raise InfrError(f"{model.name} is not in infr's offline cache ({path.parent})")
        path.unlink()
        print(f"infr: removed {path}", file=sys.stderr)
        return 0
    hf = store.parse_ref(ref)
    if hf is None:
        if Path(ref).expanduser().exists():
            raise InfrError(f"{ref} is a local file, not a cached model; infr rm leaves it alone")
        raise InfrError(f"cannot remove {ref!r}: not org/repo[:QUANT], org/repo/file.gguf or an offline model")
    removed = _rm_hf(hf)
    in_llama = store.llama_cached_files(hf.repo)
    note = (f"; its copy in llama.cpp's cache ({store.llama_cache_dir()}) is llama.cpp's: infr only reads it, "
            "delete it there yourself if you want it gone") if in_llama else ""
    if not removed:
        raise InfrError(f"{hf} is not in the Hugging Face cache ({store.hf_cache_dir()}){note}")
    for p in removed:
        print(f"infr: removed {hf.repo}/{p}", file=sys.stderr)
    if note:
        print(f"infr: note{note}", file=sys.stderr)
    return 0


def _rm_hf(ref: store.Ref) -> list[str]:
    """Delete `ref` from the Hugging Face cache: the whole repo (through huggingface_hub's delete
    strategy), or one model's files (their snapshot links, and blobs no other link uses)."""
    cache = store.scan_hf_cache()
    repos = [r for r in (cache.repos if cache else ()) if r.repo_type == "model" and r.repo_id.lower() == ref.repo.lower()]
    if not repos:
        return []
    if ref.quant is None and ref.file is None:
        names = sorted({f.file_name for r in repos for rev in r.revisions for f in rev.files})
        cache.delete_revisions(*[rev.commit_hash for r in repos for rev in r.revisions]).execute()
        return names
    files = store.hf_cached_files(ref.repo)
    chosen = store.choose(list(files), ref, fallback=False)
    if not chosen:
        return []
    links = [(rev.snapshot_path, f) for r in repos for rev in r.revisions for f in rev.files]
    doomed = [f for snap, f in links if f.file_path.relative_to(snap).as_posix() in chosen]
    blobs = {f.blob_path for f in doomed}
    for f in doomed:
        f.file_path.unlink()
    still_used = {f.blob_path for snap, f in links if f not in doomed}
    for blob in blobs - still_used:
        os.remove(blob)
    return chosen


COMMANDS = {"pull": cmd_pull, "ls": cmd_ls, "rm": cmd_rm}

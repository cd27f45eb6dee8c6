"""Pull GGUF models from the Hugging Face Hub into the standard cache, through huggingface_hub.

The cache layout is huggingface_hub's own (blobs named by sha256, snapshot
symlinks, refs), so what infr pulls is what `hf_hub_download` and llama.cpp
find, and the other way round. Two things are added on top of hf_hub_download:
- resume across runs: huggingface_hub 2.x resumes a cut download only within
  one call and deletes the partial file when it gives up, so the bytes go to
  `blobs/<sha256>.incomplete`, which the next `infr pull` continues with a
  Range request (huggingface_hub's own `http_get`);
- integrity: huggingface_hub checks the size only; infr checks the sha256 the
  Hub states (X-Linked-Etag / the LFS oid) before the blob enters the cache.
The verified blob is then linked into the snapshot by hf_hub_download itself.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

from infr import store
from infr.errors import InfrError
from infr.store import Ref


# httpx hands huggingface_hub's http_get the body in chunks of this size, and a chunk cut short
# by a lost connection is dropped: smaller than its 10 MiB default, so a cut keeps more.
CHUNK = 1 << 18


class NetworkError(InfrError):
    """The Hub could not be reached."""


def endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def pull(ref: Ref | str, quiet: bool = False) -> Path:
    """Download what `ref` means (every shard of a split model) unless cached; the path to open."""
    if isinstance(ref, str):
        parsed = store.parse_ref(ref)
        if parsed is None:
            raise InfrError(f"{ref!r} is not a Hugging Face ref (org/repo[:QUANT] or org/repo/file.gguf)")
        ref = parsed
    if store.hub_offline():
        raise InfrError(f"HF_HUB_OFFLINE=1 is set, so {ref} cannot be downloaded; unset it to pull")
    with _translated(ref):
        info = _repo_info(ref.repo)
        sizes = {s.rfilename: s for s in info.siblings or ()}
        chosen = store.choose(list(sizes), ref)
        if chosen is None:
            raise _nothing_matches(ref, list(sizes))
        paths = [_download(ref, name, sizes[name], quiet) for name in chosen]
    return paths[0]


def _repo_info(repo: str):
    from huggingface_hub import HfApi

    # model_info makes one request with no retry loop, so "network down" is told at once
    return HfApi(endpoint=endpoint()).model_info(repo, revision="main", files_metadata=True)


def _nothing_matches(ref: Ref, paths: list[str]) -> InfrError:
    ggufs = [p for p in paths if p.lower().endswith(".gguf")]
    if not ggufs:
        listed = ", ".join(sorted(paths)[:8]) + (", ..." if len(paths) > 8 else "")
        return InfrError(
            f"{ref.repo} has no GGUF file (it has: {listed or 'nothing'}); infr runs GGUF models: "
            "look for a GGUF conversion of it (repos named ...-GGUF)"
        )
    if ref.file:
        return InfrError(f"{ref.repo} has no file {ref.file}; its GGUF files: {', '.join(sorted(ggufs))}")
    return InfrError(f"{ref.repo} has no {ref.quant} file; quants there: {store.quants_listing(paths)}")


def _download(ref: Ref, name: str, sibling, quiet: bool) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    ep, cache = endpoint(), store.hf_cache_dir()
    meta = get_hf_file_metadata(hf_hub_url(ref.repo, name, revision="main", endpoint=ep), endpoint=ep)
    storage = cache / ("models--" + ref.repo.replace("/", "--"))
    pointer = storage / "snapshots" / meta.commit_hash / name
    if pointer.exists():
        return pointer
    finish = dict(repo_id=ref.repo, filename=name, revision="main", cache_dir=cache, endpoint=ep)
    from huggingface_hub.utils._runtime import is_xet_available

    if meta.xet_file_data is not None and is_xet_available():
        return Path(hf_hub_download(**finish))  # Xet checks content hashes and keeps its own chunk cache
    expected = meta.etag or ""
    lfs_sha = sibling.lfs.sha256 if sibling.lfs else None
    if lfs_sha and expected != lfs_sha:
        raise InfrError(f"{ref.repo}/{name}: the Hub states two different sha256 ({lfs_sha} and {expected})")
    size = meta.size if meta.size is not None else sibling.size
    blob = storage / "blobs" / expected
    if not blob.exists():
        _fetch(ref, name, meta, blob, size, quiet)
    return Path(hf_hub_download(**finish))  # the blob is there: this only links it into the snapshot


def _fetch(ref: Ref, name: str, meta, blob: Path, size: int | None, quiet: bool) -> None:
    from huggingface_hub.file_download import http_get  # resumes with Range, retries a lost connection
    from huggingface_hub.utils import build_hf_headers

    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".incomplete")
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:  # not ours to continue
        part.unlink()
        have = 0
    if size is not None:
        free = shutil.disk_usage(blob.parent).free
        if free < size - have:
            raise _disk_full(name, size - have, blob.parent, free)
    if not quiet:
        mb = f" ({size / 1e6:.1f} MB)" if size is not None else ""
        again = f", resuming at {have / 1e6:.1f} MB" if have else ""
        print(f"infr: pulling {ref.repo}/{name}{mb}{again}", file=sys.stderr)
    headers = build_hf_headers()
    if not _same_host(meta.location, endpoint()):
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub
    from huggingface_hub import constants

    default_chunk, constants.DOWNLOAD_CHUNK_SIZE = constants.DOWNLOAD_CHUNK_SIZE, CHUNK
    try:
        with open(part, "ab") as f:
            http_get(meta.location, f, resume_size=have, headers=headers, expected_size=size,
                     displayed_filename=name.rsplit("/", 1)[-1])
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(name, (size or 0) - _size(part), blob.parent, None) from None
        raise _interrupted(ref, name, part, size, e) from None
    except Exception as e:  # network and HTTP errors: keep the partial file for the next pull
        if _is_network(e) or type(e).__name__ == "HfHubHTTPError":
            raise _interrupted(ref, name, part, size, e) from None
        raise
    finally:
        constants.DOWNLOAD_CHUNK_SIZE = default_chunk
    _verify(ref, name, part, meta.etag)
    os.replace(part, blob)


def _verify(ref: Ref, name: str, part: Path, etag: str) -> None:
    """LFS files are named by their sha256; plain git files by their git blob sha1."""
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        digest = hashlib.sha256()
    elif re.fullmatch(r"[0-9a-f]{40}", etag):
        digest = hashlib.sha1(b"blob %d\0" % part.stat().st_size)
    else:
        return  # an ETag that names no content hash: the size check is all there is
    with open(part, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != etag:
        part.unlink()
        raise InfrError(
            f"{ref.repo}/{name}: downloaded bytes do not match the Hub's checksum "
            f"(expected {etag}, got {digest.hexdigest()}); the download was discarded, not cached. "
            f"Run `infr pull {ref}` again"
        )


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _same_host(url: str, base: str) -> bool:
    from urllib.parse import urlsplit

    return urlsplit(url).netloc == urlsplit(base).netloc


def _disk_full(name: str, need: int, where: Path, free: int | None) -> InfrError:
    has = f", {free / 1e6:.1f} MB free" if free is not None else ""
    return InfrError(
        f"disk full: {name} needs {need / 1e6:.1f} MB more in {where}{has}; free some space "
        "(`infr rm` removes cached models) or point HF_HUB_CACHE at another disk, then pull again to resume"
    )


def _interrupted(ref: Ref, name: str, part: Path, size: int | None, e: Exception) -> InfrError:
    of = f" of {size / 1e6:.1f} MB" if size is not None else ""
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return NetworkError(
        f"download of {ref.repo}/{name} stopped at {_size(part) / 1e6:.1f} MB{of} ({reason}); "
        f"run `infr pull {ref}` again to resume"
    )


def _is_network(e: BaseException) -> bool:
    import httpx2

    return isinstance(e, httpx2.TransportError)


class _translated:
    """huggingface_hub's exceptions -> one-line InfrErrors a user can act on."""

    def __init__(self, ref: Ref):
        self.ref = ref

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, InfrError) or not isinstance(e, Exception):
            return False
        raise _translate(self.ref, e) from None


def _translate(ref: Ref, e: Exception) -> InfrError:
    from huggingface_hub import errors as hf
    from huggingface_hub import get_token

    repo, ep = ref.repo, endpoint()
    token = "HF_TOKEN is set but that account has no access" if get_token() else "HF_TOKEN is not set"
    if isinstance(e, hf.GatedRepoError):
        return InfrError(
            f"{repo} is gated ({token}): accept its licence at {ep}/{repo} while logged in, "
            "then set HF_TOKEN to a read token of that account"
        )
    if isinstance(e, hf.RepositoryNotFoundError):
        return InfrError(f"{repo}: no such repository on {ep} (check the name; a private repo needs HF_TOKEN)")
    if isinstance(e, hf.RevisionNotFoundError):
        return InfrError(f"{repo} has no branch main on {ep}")
    if isinstance(e, hf.EntryNotFoundError):
        return InfrError(f"{repo}: a file listed by the Hub is not there ({e}); try again later")
    if isinstance(e, hf.HfHubHTTPError) and e.response is not None:
        status = e.response.status_code
        if status in (401, 403):
            return InfrError(
                f"{repo}: access denied ({status}; {token}): set HF_TOKEN to a read token and accept the "
                f"repo's licence at {ep}/{repo}"
            )
        return InfrError(f"{ep} answered {status} for {repo}; try again later")
    if _is_network(e) or isinstance(e, (hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)):
        return NetworkError(
            f"cannot reach the Hugging Face Hub at {ep} ({type(e).__name__}): is the network down? "
            "Models already in the cache run without it (HF_HUB_OFFLINE=1 skips the Hub)"
        )
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return _disk_full(ref.file or str(ref), 0, store.hf_cache_dir(), None)
    return InfrError(f"{ref}: {type(e).__name__}: {e}")

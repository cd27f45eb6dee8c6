"""A stand-in for the Hugging Face Hub on 127.0.0.1: just the API huggingface_hub uses to pull.

- GET /api/models/{org}/{repo}[/revision/{rev}]: model info with `siblings` (size, LFS sha256)
- HEAD/GET /{org}/{repo}/resolve/{rev}/{path}: X-Repo-Commit, X-Linked-Etag (sha256 of LFS
  files, git sha1 of others), X-Linked-Size, Content-Length, Range -> 206
- errors as the Hub sends them: 404 + X-Error-Code RepoNotFound / EntryNotFound,
  gated repos 401 (no token) / 403 (token without access) + X-Error-Code GatedRepo.
Faults for tests: `cut[(repo, path)] = n` ends the next GET after n bytes (and with `down=True`
answers 503 after that, like a network gone); `corrupt` serves flipped bytes under the right
checksum. Every request is logged as (method, path, Range header).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Repo:
    def __init__(self, files: dict[str, Path | bytes], token: str | None = None):
        self.files = files
        self.token = token  # gated: only this bearer token may download
        self.sha = {name: _digest(data) for name, data in files.items()}
        self.commit = hashlib.sha1(json.dumps(sorted(self.sha.items())).encode()).hexdigest()

    def size(self, name: str) -> int:
        data = self.files[name]
        return data.stat().st_size if isinstance(data, Path) else len(data)

    def is_lfs(self, name: str) -> bool:
        return name.endswith(".gguf")

    def etag(self, name: str) -> str:
        return self.sha[name][0] if self.is_lfs(name) else self.sha[name][1]


def _digest(data: Path | bytes) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file's content."""
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    sha256, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


class StandinHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.cut: dict[tuple[str, str], int] = {}
        self.down = False
        self.corrupt: set[tuple[str, str]] = set()
        self._broken: set[tuple[str, str]] = set()
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, repo: str, files: dict[str, Path | bytes], token: str | None = None) -> Repo:
        self.repos[repo] = Repo(files, token)
        return self.repos[repo]

    def heal(self) -> None:
        self.down = False
        self._broken.clear()

    def gets(self, path_part: str = "") -> list[tuple[str, str, str | None]]:
        return [e for e in self.log if e[0] == "GET" and "/resolve/" in e[1] and path_part in e[1]]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: StandinHub
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool):
        hub = self.hub
        path = unquote(urlsplit(self.path).path)
        hub.log.append((self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._info("/".join(parts[2:4]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file("/".join(parts[:2]), "/".join(parts[4:]), head)
        self._error(404, "nothing here")

    def _info(self, repo_id: str):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "Repository not found", code="RepoNotFound")
        siblings = [
            {"rfilename": n, "size": repo.size(n), "blobId": repo.sha[n][1]}
            | ({"lfs": {"size": repo.size(n), "sha256": repo.sha[n][0], "pointerSize": 134}} if repo.is_lfs(n) else {})
            for n in repo.files
        ]
        body = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "gated": "manual" if repo.token else False, "siblings": siblings}
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, repo_id: str, name: str, head: bool):
        hub, repo = self.hub, self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "Repository not found", code="RepoNotFound")
        if repo.token:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(401, "Access to this repo is restricted", code="GatedRepo")
            if auth != f"Bearer {repo.token}":
                return self._error(403, "You have not been granted access", code="GatedRepo")
        if name not in repo.files:
            return self._error(404, "Entry not found", code="EntryNotFound", commit=repo.commit)
        key, size = (repo_id, name), repo.size(name)
        if not head and hub.down and key in hub._broken:
            return self._error(503, "Service unavailable")
        start = 0
        rng = self.headers.get("Range")
        if rng and not head:
            start = int(rng.removeprefix("bytes=").split("-")[0])
        headers = {"X-Repo-Commit": repo.commit, "X-Linked-Etag": f'"{repo.etag(name)}"',
                   "X-Linked-Size": str(size), "ETag": f'"{repo.etag(name)}"', "Accept-Ranges": "bytes",
                   "Content-Length": str(size - start)}
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        limit = hub.cut.pop(key, None)
        if limit is not None:
            hub._broken.add(key)
        self._body(repo.files[name], start, size, limit, key in hub.corrupt)

    def _body(self, data: Path | bytes, start: int, size: int, limit: int | None, corrupt: bool):
        end = size if limit is None else min(size, start + limit)
        with open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as f:
            pos = start
            f.seek(start)
            while pos < end:
                n = min(1 << 20, end - pos)
                chunk = f.read(n)
                if corrupt and pos == start:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                self.wfile.write(chunk)
                pos += n
        if limit is not None:  # a connection lost mid-file
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    def _error(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str]):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def tiny_model(dst: Path, weight_type: str, tokenizer_from: Path, split_max_tensors: int | None = None) -> list[Path]:
    """A small real GGUF: synth's tiny-llama shape in `weight_type`, with the tokenizer (and chat
    template) of a real model so the engine loads and chats with it; optionally split into shards."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from infr import synth

    tok = _fields(tokenizer_from, "tokenizer.")
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    spec = synth.preset("tiny-llama", n_vocab=n_vocab, tied=True, weight_type=weight_type)
    synth_path = synth.write_gguf(spec, dst.with_suffix(".synth"), seed=7)
    src = GGUFReader(synth_path)
    w = GGUFWriter(dst, "llama", split_max_tensors=split_max_tensors or 0)
    kept = {k: v for k, v in _fields(synth_path, "").items() if not k.startswith("tokenizer.")}
    for key, (value, kind, sub) in (kept | tok).items():
        if kind == GGUFValueType.ARRAY:
            w.add_key_value(key, value, kind, sub_type=sub)
        else:
            w.add_key_value(key, value, kind)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    synth_path.unlink()
    if split_max_tensors:
        return sorted(dst.parent.glob(dst.stem + "-*-of-*.gguf"))
    return [dst]


@functools.lru_cache(maxsize=4)
def _fields(path: Path, prefix: str) -> dict:
    """key -> (value, type, array item type) of a GGUF's metadata, those starting with prefix."""
    from gguf import GGUFReader

    out = {}
    for key, field in GGUFReader(path).fields.items():
        if key.startswith(prefix) and not key.startswith("GGUF.") and key != "general.architecture":
            out[key] = (field.contents(), field.types[0], field.types[-1])
    return out

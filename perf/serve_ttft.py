"""Time to first token of a second chat turn, with and without prefix reuse, against a real
`infr serve` process. Usage: python perf/serve_ttft.py [MODEL] [--backend cpu|gpu] [--runs N]"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx

SYSTEM = "You are a helpful assistant. " + " ".join(
    f"Rule {i}: answer briefly, stay polite and check facts before replying." for i in range(1, 25))


def ttft(client: httpx.Client, messages: list[dict], cache: bool) -> tuple[float, str, int]:
    """Seconds to the first content chunk, the text, and the prompt tokens the server reused."""
    body = {"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True, "cache_prompt": cache,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, cached = None, "", -1
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if delta.get("content"):
                first = first or time.perf_counter() - t0
                text += delta["content"]
    return first, text, cached


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "infr", "serve", a.model, "--port", str(port), "--ctx", "2048",
                             "--backend", a.backend], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a large city."}]
            results, reused = {True: [], False: []}, {True: [], False: []}
            load0 = os.getloadavg()[0]
            for _ in range(a.runs):
                for cache in (True, False):
                    _, reply, _ = ttft(c, turn1, True)  # primes the slot with turn 1
                    turn2 = turn1 + [{"role": "assistant", "content": reply},
                                     {"role": "user", "content": "And one more?"}]
                    t, _, cached = ttft(c, turn2, cache)
                    results[cache].append(t)
                    reused[cache].append(cached)
            n = c.post("/tokenize", json={"messages": turn2}).json()["count"]
            print(f"model {a.model}, backend {a.backend}, second-turn prompt {n} tokens, {a.runs} runs (median); "
                  f"1-min load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs:")
            for cache in (True, False):
                label = "with prefix reuse" if cache else "without (cache_prompt=false)"
                print(f"  {label:30} TTFT {statistics.median(results[cache]) * 1000:8.0f} ms "
                      f"(all: {', '.join(f'{x * 1000:.0f}' for x in results[cache])}; "
                      f"prompt tokens reused: {', '.join(map(str, reused[cache]))})", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()

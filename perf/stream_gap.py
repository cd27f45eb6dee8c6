"""Where one served stream's decode rate parts from `python -m infr.bench` tg: the same engine, in one
process, set up step by step from the bench's request to the server's.

    source .gpu/setup.sh && python3 perf/stream_gap.py synth:llama-3.2-1b --backend dawn --tokens 128

Each variant runs --reps greedy requests (end-of-generation ignored) and reports each one's rate as
perf/serve_throughput.py reads the server's `timings` and bench's tg counts it: tokens after the first
over the time from the first to the last (Request.t_first .. t_done). The variants, each one step
closer to a served stream:

  bench        the bench's engine: n_ctx = 1 + tokens, one sequence, a one-token prompt
  serve-cfg    the engine `perf/serve_throughput.py` starts: --ctx 512 --parallel 64 --kv-size 512 x 64
  +prompt      and the serve prompt's length (--prompt tokens; ~139 for a synth model's tokenizer)
  +thread      the engine stepped on a thread of its own, as `infr serve` runs it
  +tracker     each token through the server's text tracker (detokenizer, stop strings), its events
               handed to an asyncio loop that merges them and writes an SSE chunk, as the server does

A variant that is slower than the one before it names the cost. Results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import sys
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infr import bench  # noqa: E402
from infr.engine import Model  # noqa: E402
from infr.sampling import SamplingParams  # noqa: E402
from infr.scheduler import Request  # noqa: E402
from infr.serve import generation  # noqa: E402


def _rate(req: Request) -> float:
    if req.finish_reason != "length" or len(req.output) < 2:
        raise SystemExit(f"the request ended with {req.finish_reason} after {len(req.output)} tokens: {req.error or ''}")
    return (len(req.output) - 1) / (req.t_done - req.t_first)


def _inline(model: Model, prompt: list[int], tokens: int) -> float:
    eng = model.engine
    req = Request(list(prompt), SamplingParams(temperature=0.0), max_new=tokens, ignore_eos=True)
    eng.submit(req)
    eng.run_until(lambda: req.done)
    return _rate(req)


class _EngineThread:
    """The engine loop of infr/serve/service.py on a thread of its own (without its idle warming:
    every variant has run a request of its shape first)."""

    def __init__(self, model: Model):
        self.model, self.stop = model, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        eng = self.model.engine
        while not self.stop.is_set():
            if eng.wait_for_work(timeout=0.2):
                try:
                    eng.step()
                except Exception as e:  # the step's requests end with the error (_rate says it); the loop goes on
                    print(f"engine step failed: {type(e).__name__}: {e}", file=sys.stderr)

    def close(self) -> None:
        self.stop.set()
        self.model.engine.wake()
        self.thread.join()


def _threaded(model: Model, prompt: list[int], tokens: int) -> float:
    done = threading.Event()
    req = Request(list(prompt), SamplingParams(temperature=0.0), max_new=tokens, ignore_eos=True,
                  on_done=done.set)
    model.engine.submit(req)
    if not done.wait(600):
        raise SystemExit("the engine thread gave no answer in 600 s")
    return _rate(req)


async def _served(model: Model, prompt: list[int], tokens: int) -> float:
    """One request as Service.events runs it: tracker on the engine thread, events merged on the loop,
    each chunk serialized as an OpenAI completion chunk."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731
    job = generation.Job(list(prompt), SamplingParams(temperature=0.0), tokens, ignore_eos=True)
    tracker = generation.Tracker(model.tokenizer, job, lambda ev: put(("text", ev)))
    req = tracker.request(on_done=lambda: put(("done", None)))
    model.engine.submit(req)
    sent = []
    while True:
        kind, value = await queue.get()
        if kind == "done":
            break
        while not queue.empty():
            more = queue.get_nowait()
            if more[0] != "text":
                queue.put_nowait(more)
                break
            value = {"text": value["text"] + more[1]["text"], "logprobs": value["logprobs"] + more[1]["logprobs"]}
        chunk = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "text": value["text"], "logprobs": None, "finish_reason": None}]}
        sent.append(f"data: {json.dumps(chunk)}\n\n".encode())
    return _rate(req)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=139, help="the served prompt's tokens")
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    path = bench.model_path(args.model)
    rng = np.random.default_rng(0)
    rows = []

    def report(name: str, rates: list[float]) -> None:
        row = {"variant": name, "rates": rates, "mean": statistics.fmean(rates), "best": max(rates)}
        rows.append(row)
        print(f"{name:10s} {row['mean']:8.1f} mean {row['best']:8.1f} best  "
              + " ".join(f"{r:.1f}" for r in rates), flush=True)

    def prompt(n: int) -> list[int]:
        return rng.integers(0, model.spec.n_vocab, n).tolist()

    model = Model(path, n_ctx=1 + args.tokens, backend=args.backend)
    _inline(model, prompt(1), args.tokens)  # warm: the graphs of this shape
    report("bench", [_inline(model, prompt(1), args.tokens) for _ in range(args.reps)])
    del model
    model = Model(path, n_ctx=args.ctx, backend=args.backend, parallel=args.parallel,
                  kv_tokens=args.ctx * args.parallel)
    _inline(model, prompt(args.prompt), args.tokens)
    report("serve-cfg", [_inline(model, prompt(1), args.tokens) for _ in range(args.reps)])
    report("+prompt", [_inline(model, prompt(args.prompt), args.tokens) for _ in range(args.reps)])
    worker = _EngineThread(model)
    try:
        report("+thread", [_threaded(model, prompt(args.prompt), args.tokens) for _ in range(args.reps)])
        report("+tracker", [asyncio.run(_served(model, prompt(args.prompt), args.tokens)) for _ in range(args.reps)])
    finally:
        worker.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": " ".join(["python", "perf/stream_gap.py"] + sys.argv[1:]), "model": str(path),
            "machine": platform.node(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "variants": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

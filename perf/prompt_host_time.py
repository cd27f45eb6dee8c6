"""Where a prompt's wall time goes on the host, without the profiler (whose pass per dispatch inflates
`submit`): per forward of T tokens, the time in queue.submit, in the read-back that waits for the GPU,
and the rest (graph lookup, uploads, encoding), for synth models on one backend.

    source .gpu/setup.sh && python3 perf/prompt_host_time.py gemma4-e2b gemma4-26b-a4b llama-3.1-8b --backend dawn
    python3 perf/prompt_host_time.py tiny-gemma4-e2b tiny-llama --T 64          # lavapipe smoke run
    INFR_SUBMIT_PARTS=4 python3 perf/prompt_host_time.py gemma4-e2b --backend dawn  # the body in 4 submits

Why: Dawn profiles of stop 31 gave Gemma 4's prompts 96-142 µs a token in `submit` against the 8B's 2.9,
and E2B's pp512 swung from 3778 to 9282 t/s between runs. Dawn records its Vulkan commands at submit, so a
submit that costs as much as the GPU's work is the host, not the kernels. One line per model:
forward ms, submit ms, wait ms, other ms (means over --reps forwards after one warm-up), dispatches of
the forward's graph.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="synth presets")
    ap.add_argument("--backend", default="gpu", help="gpu (wgpu-native) or dawn")
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"{'model':<22} {'forward ms':>10} {'submit ms':>10} {'wait ms':>9} {'other ms':>9} {'dispatches':>10}")
    for ref in args.models:
        model, _ = bench.load_model(bench.synth_path(ref), args.backend, args.T + 16)
        be = model.backend
        toks = np.random.default_rng(0).integers(0, model.spec.n_vocab, args.T).tolist()
        q = be.dev.device.queue
        be.forward(toks, 0)  # graphs built, pipelines compiled
        spent = {"submit": 0.0, "wait": 0.0}
        inside = []  # read_buffer submits its own copy: counted as waiting, not as a submit
        submit, read_buffer = q.submit, q.read_buffer

        def timed(name, f):
            def call(*a, **k):
                if inside:
                    return f(*a, **k)
                inside.append(name)
                t0 = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    spent[name] += time.perf_counter() - t0
                    inside.pop()
            return call

        q.submit, q.read_buffer = timed("submit", submit), timed("wait", read_buffer)
        try:
            t0 = time.perf_counter()
            for _ in range(args.reps):
                be.forward(toks, 0)
            wall = (time.perf_counter() - t0) / args.reps
        finally:
            del q.submit, q.read_buffer
        body, head, _ = be._graph(args.T, 1)  # the graph forward ran (its last row's logits)
        n = len(body.dispatches) + len(head.dispatches)
        sub, wait = spent["submit"] / args.reps, spent["wait"] / args.reps
        print(f"{ref:<22} {wall * 1e3:>10.2f} {sub * 1e3:>10.2f} {wait * 1e3:>9.2f} "
              f"{(wall - sub - wait) * 1e3:>9.2f} {n:>10}", flush=True)


if __name__ == "__main__":
    main()

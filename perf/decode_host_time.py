"""Where a greedy decode step's wall time goes on the host: per step of the engine's multi-step
decode (GPUBackend.decode_steps, its steps a submit), the time encoding the steps (encode_all), in
queue.submit, and the rest (waiting for the GPU's tokens and handing them out), for synth models on
one backend. Where encode + submit come near the step time, the host bounds decode, not the GPU:
Dawn records its Vulkan commands at submit (perf/prompt_host_time.py: 8 µs a dispatch on an H100).

    source .gpu/setup.sh && python3 perf/decode_host_time.py llama-3.2-1b llama-3.1-8b gemma4-e2b --backend dawn
    INFR_DAWN_TOGGLES=skip_validation python3 perf/decode_host_time.py llama-3.2-1b --backend dawn
    python3 perf/decode_host_time.py tiny-llama --n 16                       # lavapipe smoke run

One line per model: µs a step of wall, encode, submit and other time (means over --reps calls of
--n steps after one warm-up, from a --depth-token prompt), and the dispatches a step encodes.
"""

from __future__ import annotations

import argparse
import inspect
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
    ap.add_argument("--n", type=int, default=128, help="steps a call")
    ap.add_argument("--depth", type=int, default=139, help="prompt tokens before the steps (serve_throughput's)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from infr.gpu import backend as GB

    per_submit = inspect.signature(GB.GPUBackend.decode_steps).parameters["per_submit"].default  # the engine's
    print(f"{'model':<22} {'step µs':>9} {'encode µs':>10} {'submit µs':>10} {'other µs':>9} {'dispatches':>10}")
    for ref in args.models:
        model, _ = bench.load_model(bench.synth_path(ref), args.backend, args.depth + args.n + 16)
        be = model.backend
        prompt = np.random.default_rng(0).integers(0, model.spec.n_vocab, args.depth).tolist()
        token = int(np.argmax(be.forward(prompt, 0)[-1]))
        be.decode_greedy(token, args.depth, args.n, per_submit=per_submit)  # graphs built, pipelines compiled
        q = be.dev.device.queue
        spent = {"encode": 0.0, "submit": 0.0, "dispatches": 0}
        submit, encode_all = q.submit, GB.encode_all

        def timed_submit(cmds):
            t0 = time.perf_counter()
            try:
                return submit(cmds)
            finally:
                spent["submit"] += time.perf_counter() - t0

        def timed_encode(enc, parts, timer=None):
            t0 = time.perf_counter()
            try:
                return encode_all(enc, parts, timer)
            finally:
                spent["encode"] += time.perf_counter() - t0
                spent["dispatches"] += sum(len(rec) * times for rec, times in parts)

        q.submit, GB.encode_all = timed_submit, timed_encode
        try:
            t0 = time.perf_counter()
            for _ in range(args.reps):
                be.decode_greedy(token, args.depth, args.n, per_submit=per_submit)
            wall = time.perf_counter() - t0
        finally:
            del q.submit
            GB.encode_all = encode_all
        steps = args.reps * args.n
        enc, sub = spent["encode"] / steps, spent["submit"] / steps
        print(f"{ref:<22} {wall / steps * 1e6:>9.1f} {enc * 1e6:>10.1f} {sub * 1e6:>10.1f} "
              f"{(wall / steps - enc - sub) * 1e6:>9.1f} {spent['dispatches'] / steps:>10.1f}", flush=True)


if __name__ == "__main__":
    main()

"""Batched decode through the engine: L sequences decoding together, aggregate tokens/s.

    python perf/batched_bench.py synth:llama-3.1-8b --backend gpu -npl 1,2,4,8,16,32,64 -p 32 -n 64
    INFR_MMQ_MIN_T=64 python perf/batched_bench.py synth:llama-3.1-8b -npl 16,32    # the GEMV at 32 rows

llama-batched-bench's shape: for each L, L requests of random -p tokens are submitted at once
(their prompts prefill together), then each generates -n tokens greedily, end-of-generation
ignored, every step one row per sequence. Reported per L: the prompt phase (submit -> every first
token), the generation phase (the last first token -> the last token: L * (n - 1) tokens) and the
engine's steps and rows in it. Repetitions take the best generation time (-r). The kernels'
INFR_* knobs (infr/gpu/tuning.py) apply as usual; the JSON records the ones set.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(model, L: int, n_prompt: int, n_gen: int, seed: int) -> dict:
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    eng = model.engine
    rng = np.random.default_rng(seed)
    n_vocab = model.spec.n_vocab
    greedy = SamplingParams(temperature=0.0)
    reqs = [Request(rng.integers(0, n_vocab, n_prompt).tolist(), greedy, max_new=n_gen, ignore_eos=True,
                    cache_prompt=False) for _ in range(L)]
    steps0 = eng.stats.steps
    t0 = time.perf_counter()
    for r in reqs:
        eng.submit(r)
    eng.run_until(lambda: all(r.done for r in reqs))
    bad = [r.finish_reason for r in reqs if r.finish_reason != "length"]
    if bad:
        raise SystemExit(f"a request ended with {bad[0]}: {reqs[0].error}")
    first = max(r.t_first for r in reqs)
    last = max(r.t_done for r in reqs)
    gen = sum(len(r.output) - 1 for r in reqs)
    return {"L": L, "prompt_s": first - t0, "gen_s": last - first, "gen_tokens": gen,
            "gen_tps": gen / (last - first) if last > first else 0.0, "steps": eng.stats.steps - steps0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("-npl", default="1,8,32", help="sequences decoding together, comma-separated")
    ap.add_argument("-p", type=int, default=32, help="prompt tokens per sequence")
    ap.add_argument("-n", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("-r", type=int, default=2, help="repetitions (the best generation time is kept)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from infr import bench
    from infr.engine import Model

    ls = [int(x) for x in a.npl.split(",")]
    path = bench.model_path(a.model)
    n_ctx = a.p + a.n + 16
    t0 = time.perf_counter()
    model = Model(path, n_ctx=n_ctx, backend=a.backend, parallel=max(ls),
                  batch_tokens=512)  # the most rows a step runs (prompts prefill in chunks)
    load_s = time.perf_counter() - t0
    run(model, min(4, max(ls)), a.p, 8, seed=99)  # warm: graphs of the first sizes, clocks
    rows = []
    for L in ls:
        best = None
        for rep in range(a.r):
            r = run(model, L, a.p, a.n, seed=L * 100 + rep)
            best = r if best is None or r["gen_s"] < best["gen_s"] else best
        print(f"L={L:3d}: prompt {best['prompt_s'] * 1e3:8.1f} ms, generation {best['gen_tps']:8.1f} t/s "
              f"aggregate ({best['gen_tps'] / L:.1f} per sequence)", file=sys.stderr)
        rows.append(best)
    be = model.backend
    result = {"command": " ".join(["python", "perf/batched_bench.py"] + sys.argv[1:]), "model": str(path),
              "backend": model.backend_name, "adapter": getattr(getattr(be, "dev", None), "name", None),
              "env": {k: v for k, v in os.environ.items() if k.startswith("INFR_")},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
              "load_s": load_s, "n_prompt": a.p, "n_gen": a.n, "results": rows}
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
